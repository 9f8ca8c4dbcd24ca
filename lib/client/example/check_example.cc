// sluice-client-example: asks a Sluice node whether one request may go ahead.
//
//   sluice-client-example --server 127.0.0.1:7350 api client_id=shop-17 user=42
//   sluice-client-example --server [::1]:7350 --tcp --hits 3 --fail-closed api ip=203.0.113.9
//
// Prints the decision and each applied limit. Exit status: 0 allowed, 1 denied, 2 error (bad
// arguments; no node decided: unreachable, timed out, refused; or the node named a problem with
// the check, such as an unknown domain).
#include "client/client.h"

#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr int kAllowed = 0;
constexpr int kDenied = 1;
constexpr int kError = 2;

void usage() {
  std::fputs(
      "usage: sluice-client-example --server HOST:PORT [--server HOST:PORT ...] [--tcp]\n"
      "           [--timeout-ms N] [--hits N] [--fail-closed] DOMAIN KEY=VALUE...\n",
      stderr);
}

template <typename T>
bool parse_number(std::string_view text, T& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

int main(int argc, char** argv) {
  sluice::ClientOptions options;
  int64_t hits = 1;
  std::string domain;
  std::vector<std::string> entry_text;  // "key=value", owned for the views below

  const std::vector<std::string_view> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--server" && has_value) {
      options.nodes.emplace_back(args[++i]);
    } else if (a == "--tcp") {
      options.transport = sluice::Transport::kTcp;
    } else if (a == "--fail-closed") {
      options.fail_mode = sluice::FailMode::kClosed;
    } else if (a == "--timeout-ms" && has_value) {
      int64_t ms = 0;
      if (!parse_number(args[++i], ms) || ms <= 0) {
        std::fprintf(stderr, "--timeout-ms: expected a positive number of milliseconds\n");
        return kError;
      }
      options.timeout = std::chrono::milliseconds(ms);
    } else if (a == "--hits" && has_value) {
      if (!parse_number(args[++i], hits)) {
        std::fprintf(stderr, "--hits: expected a number\n");
        return kError;
      }
    } else if (a == "-h" || a == "--help") {
      usage();
      return kError;
    } else if (a.starts_with("--")) {
      std::fprintf(stderr, "unknown option or missing value: %.*s\n", static_cast<int>(a.size()),
                   a.data());
      usage();
      return kError;
    } else if (domain.empty()) {
      domain = a;
    } else if (a.find('=') == std::string_view::npos) {
      std::fprintf(stderr, "expected KEY=VALUE, got '%.*s'\n", static_cast<int>(a.size()),
                   a.data());
      return kError;
    } else {
      entry_text.emplace_back(a);
    }
  }
  if (options.nodes.empty() || domain.empty()) {
    usage();
    return kError;
  }

  std::vector<sluice::Entry> entries;
  for (const std::string& e : entry_text) {
    const size_t eq = e.find('=');
    entries.push_back({std::string_view(e).substr(0, eq), std::string_view(e).substr(eq + 1)});
  }

  std::string error;
  const std::unique_ptr<sluice::Client> client = sluice::Client::create(options, &error);
  if (!client) {
    std::fprintf(stderr, "sluice-client-example: %s\n", error.c_str());
    return kError;
  }

  const sluice::Result r = client->check(domain, entries, hits);
  if (!r.decided()) {
    const std::string_view why = r.outcome == sluice::Outcome::kUnavailable
                                     ? std::string_view("no node answered in time")
                                     : sluice::wire::to_string(r.code);
    std::printf("%s (%.*s: %.*s; fail mode says %s)\n", r.allowed ? "allowed" : "denied",
                static_cast<int>(to_string(r.outcome).size()), to_string(r.outcome).data(),
                static_cast<int>(why.size()), why.data(), r.allowed ? "allow" : "deny");
    return kError;
  }

  std::printf("%s%s%s%s", r.allowed ? "allowed" : "denied", r.would_deny ? " (would deny)" : "",
              r.shadow ? " (shadow)" : "", r.allowlisted ? " (allowlisted)" : "");
  if (r.code != sluice::wire::Code::kOk) {
    const std::string_view code = sluice::wire::to_string(r.code);
    std::printf(" [%.*s]", static_cast<int>(code.size()), code.data());
  }
  std::printf("\n");
  // A problem with the check itself (unknown domain, entry too long, ...) is an error; kNoRoom
  // (the node's memory cap: allowed, not counted) is not.
  const bool check_error =
      r.code != sluice::wire::Code::kOk && r.code != sluice::wire::Code::kNoRoom;
  for (const sluice::LimitStatus& l : r.limits) {
    const std::string_view mode = sluice::wire::to_string(l.mode);
    std::printf("  %-24s %llu per %lld ms, remaining %llu, reset in %lld ms%s", l.name.c_str(),
                static_cast<unsigned long long>(l.limit), static_cast<long long>(l.window_ms),
                static_cast<unsigned long long>(l.remaining), static_cast<long long>(l.reset_ms),
                l.exceeded ? ", EXCEEDED" : "");
    if (l.exceeded) {
      if (l.retry_after_ms < 0) {
        std::printf(", never fits");
      } else {
        std::printf(", retry after %lld ms", static_cast<long long>(l.retry_after_ms));
      }
    }
    std::printf(" [%.*s]\n", static_cast<int>(mode.size()), mode.data());
  }
  if (r.truncated) std::printf("  (limit details truncated by the node)\n");
  if (check_error) return kError;
  return r.allowed ? kAllowed : kDenied;
}
