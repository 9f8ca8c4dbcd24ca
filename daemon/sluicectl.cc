// sluicectl: the operator's command line. Wiring only: parse, call libsluice or the admin HTTP
// port, print. Exit codes: 0 allowed / success, 1 denied, 2 error.
#include <utility>  // before Asio (Boost 1.74 + g++ 12)

#include <CLI/CLI.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "client/client.h"

namespace {

namespace http = boost::beast::http;
using nlohmann::json;

constexpr int kAllowed = 0;
constexpr int kDenied = 1;
constexpr int kError = 2;

std::string window_text(int64_t ms) {
  if (ms % 86'400'000 == 0) return std::to_string(ms / 86'400'000) + "d";
  if (ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms % 1'000 == 0) return std::to_string(ms / 1'000) + "s";
  return std::to_string(ms) + "ms";
}

std::string seconds_text(int64_t ms) {
  if (ms < 0) return "never";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3fs", static_cast<double>(ms) / 1000.0);
  return buf;
}

int print_result(const sluice::Result& r, const std::string& server, bool as_json, bool details);

int run_check(const std::string& server, bool tcp, int timeout_ms, const std::string& domain,
              const std::vector<std::string>& pairs, int64_t hits, int repeat, bool as_json) {
  std::vector<sluice::Entry> entries;
  for (const auto& p : pairs) {
    const auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::fprintf(stderr, "sluicectl: '%s' is not key=value\n", p.c_str());
      return kError;
    }
    entries.push_back({std::string_view(p).substr(0, eq), std::string_view(p).substr(eq + 1)});
  }
  sluice::ClientOptions opt;
  opt.nodes = {server};
  opt.transport = tcp ? sluice::Transport::kTcp : sluice::Transport::kUdp;
  opt.fail_mode = sluice::FailMode::kClosed;
  opt.timeout = std::chrono::milliseconds(timeout_ms);
  opt.attempts = 3;
  std::string error;
  auto client = sluice::Client::create(opt, &error);
  if (!client) {
    std::fprintf(stderr, "sluicectl: %s\n", error.c_str());
    return kError;
  }
  int rc = kError;
  for (int i = 1; i <= repeat; ++i) {
    const sluice::Result r = client->check(domain, entries, hits);
    if (repeat > 1 && !as_json) std::printf("%d: ", i);
    // With --repeat, full details only for the last answer.
    rc = print_result(r, server, as_json, i == repeat);
  }
  return rc;
}

int print_result(const sluice::Result& r, const std::string& server, bool as_json, bool details) {
  const bool failed = !r.decided() || r.code != sluice::wire::Code::kOk;
  if (as_json) {
    json j{{"allowed", r.allowed},
           {"outcome", std::string(sluice::to_string(r.outcome))},
           {"code", std::string(sluice::wire::to_string(r.code))},
           {"would_deny", r.would_deny},
           {"shadow", r.shadow},
           {"allowlisted", r.allowlisted},
           {"truncated", r.truncated},
           {"limits", json::array()}};
    for (const auto& l : r.limits) {
      j["limits"].push_back({{"name", l.name},
                             {"limit", l.limit},
                             {"window_ms", l.window_ms},
                             {"remaining", l.remaining},
                             {"reset_ms", l.reset_ms},
                             {"retry_after_ms", l.retry_after_ms},
                             {"mode", std::string(sluice::wire::to_string(l.mode))},
                             {"exceeded", l.exceeded}});
    }
    std::printf("%s\n", j.dump().c_str());
  } else if (failed) {
    std::fprintf(stderr, "sluicectl: no decision: %s (%s) from %s\n",
                 std::string(sluice::to_string(r.outcome)).c_str(),
                 std::string(sluice::wire::to_string(r.code)).c_str(), server.c_str());
  } else {
    std::printf("%s%s%s%s\n", r.allowed ? "allowed" : "denied", r.shadow ? " (shadow)" : "",
                r.would_deny ? " (a dry-run rule would deny)" : "",
                r.allowlisted ? " (allowlisted)" : "");
    for (const auto& l : details ? r.limits : std::vector<sluice::LimitStatus>{}) {
      const std::string limit = std::to_string(l.limit) + "/" + window_text(l.window_ms);
      std::printf("  %-24s %-12s remaining %-8llu reset %-9s%s%s\n", l.name.c_str(),
                  limit.c_str(), static_cast<unsigned long long>(l.remaining),
                  seconds_text(l.reset_ms).c_str(),
                  l.exceeded ? " retry after " : "",
                  l.exceeded ? seconds_text(l.retry_after_ms).c_str() : "");
    }
  }
  if (failed) return kError;
  return r.allowed ? kAllowed : kDenied;
}

// GET http://admin/path; returns the body, or an empty optional with the error printed.
std::optional<std::string> http_get(const std::string& admin, const std::string& path) {
  const auto colon = admin.rfind(':');
  if (colon == std::string::npos) {
    std::fprintf(stderr, "sluicectl: --admin '%s' is not host:port\n", admin.c_str());
    return std::nullopt;
  }
  std::string host = admin.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  try {
    boost::asio::io_context io;
    boost::asio::ip::tcp::resolver resolver(io);
    boost::beast::tcp_stream stream(io);
    stream.expires_after(std::chrono::seconds(5));
    stream.connect(resolver.resolve(host, admin.substr(colon + 1)));
    http::request<http::empty_body> req{http::verb::get, path, 11};
    req.set(http::field::host, host);
    http::write(stream, req);
    boost::beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(stream, buf, res);
    if (res.result() != http::status::ok) {
      std::fprintf(stderr, "sluicectl: %s%s answered %u\n", admin.c_str(), path.c_str(),
                   res.result_int());
      return std::nullopt;
    }
    return res.body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sluicectl: %s: %s\n", admin.c_str(), e.what());
    return std::nullopt;
  }
}

int run_status(const std::string& admin, bool as_json) {
  const auto body = http_get(admin, "/v1/status");
  if (!body) return kError;
  if (as_json) {
    std::printf("%s\n", body->c_str());
    return kAllowed;
  }
  json j;
  try {
    j = json::parse(*body);
    const auto& n = j.at("node");
    const auto& e = j.at("engine");
    std::printf("node      up %llds, %d threads, udp %d tcp %d admin %d\n",
                n.at("uptime_s").get<long long>(), n.at("threads").get<int>(),
                n.at("udp_port").get<int>(), n.at("tcp_port").get<int>(),
                n.at("admin_port").get<int>());
    std::printf("counters  %llu live, %.1f MiB of %.1f MiB, evicted %llu expired / %llu live\n",
                e.at("live_counters").get<unsigned long long>(),
                e.at("table_bytes").get<double>() / 1048576.0,
                e.at("memory_cap_bytes").get<double>() / 1048576.0,
                e.at("evicted_expired").get<unsigned long long>(),
                e.at("evicted_live").get<unsigned long long>());
    std::printf("checks    %llu\n", e.at("checks").get<unsigned long long>());
    if (j.contains("rules")) {
      std::printf("%-32s %12s %12s %12s %12s\n", "rule", "allowed", "denied", "shadow", "would-deny");
      for (const auto& r : j["rules"]) {
        std::printf("%-32s %12llu %12llu %12llu %12llu\n", r.at("name").get<std::string>().c_str(),
                    r.at("allowed").get<unsigned long long>(),
                    r.at("denied").get<unsigned long long>(),
                    r.at("shadow_denied").get<unsigned long long>(),
                    r.at("would_deny").get<unsigned long long>());
      }
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "sluicectl: unexpected status from %s: %s\n", admin.c_str(), ex.what());
    return kError;
  }
  return kAllowed;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sluicectl: operate Sluice nodes\n"
               "exit codes: 0 allowed / ok, 1 denied, 2 error",
               "sluicectl"};
  app.require_subcommand(1);
  bool as_json = false;
  app.add_flag("--json", as_json, "print JSON (one object per line)");

  std::string server = "127.0.0.1:7350";
  std::string admin = "127.0.0.1:7351";
  auto* check = app.add_subcommand("check", "ask whether a request may go ahead");
  std::string domain;
  std::vector<std::string> pairs;
  int64_t hits = 1;
  bool tcp = false;
  int timeout_ms = 1000;
  int repeat = 1;
  check->add_option("domain", domain, "rules domain")->required();
  check->add_option("entries", pairs, "descriptor entries key=value");
  check->add_option("--hits", hits, "cost of the request (0 asks without counting)");
  check->add_option("--server", server, "node check address host:port");
  check->add_flag("--tcp", tcp, "use TCP instead of UDP");
  check->add_option("--repeat", repeat, "send the check this many times in a row (exit code: last)")
      ->check(CLI::Range(1, 100'000));
  check->add_option("--timeout-ms", timeout_ms, "give up after this long")->check(CLI::Range(1, 60'000));
  check->add_flag("--json", as_json, "print JSON");

  auto* status = app.add_subcommand("status", "show a node's counters and rule statistics");
  status->add_option("--admin", admin, "node admin HTTP address host:port");
  status->add_flag("--json", as_json, "print JSON");

  CLI11_PARSE(app, argc, argv);
  if (*check) return run_check(server, tcp, timeout_ms, domain, pairs, hits, repeat, as_json);
  if (*status) return run_status(admin, as_json);
  return kError;
}
