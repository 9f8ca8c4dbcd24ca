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
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "rules/rules.h"
#include "sluicectl_args.h"

namespace {

namespace http = boost::beast::http;
using nlohmann::json;

using sluice::ctl::kAllowed;
using sluice::ctl::kDenied;
using sluice::ctl::kError;

// The admin token sent as `Authorization: Bearer` with every admin request (docs/operations.md,
// "Admin token"); "" sends none. Set once by main, from --token-file or SLUICE_ADMIN_TOKEN, before
// any request.
std::string admin_token;

// --token-file's content, trailing newlines stripped; false (printed) when unreadable or empty.
bool read_token_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) {
    std::fprintf(stderr, "sluicectl: --token-file %s: cannot read it\n", path.c_str());
    return false;
  }
  out = text.str();
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' '))
    out.pop_back();
  if (out.empty()) {
    std::fprintf(stderr, "sluicectl: --token-file %s is empty\n", path.c_str());
    return false;
  }
  return true;
}

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
      std::printf("  %-24s %-12s remaining %-8llu reset %-9s%s%s\n", l.name.c_str(), limit.c_str(),
                  static_cast<unsigned long long>(l.remaining), seconds_text(l.reset_ms).c_str(),
                  l.exceeded ? " retry after " : "",
                  l.exceeded ? seconds_text(l.retry_after_ms).c_str() : "");
    }
  }
  if (failed) return kError;
  return r.allowed ? kAllowed : kDenied;
}

struct HttpReply {
  unsigned status = 0;
  std::string body;
};

// One request to the admin port; nullopt (with the error printed) when it cannot be made.
std::optional<HttpReply> http_call(const std::string& admin, http::verb verb,
                                   const std::string& path, const std::string& body = "",
                                   int timeout_s = 30) {
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
    stream.expires_after(std::chrono::seconds(timeout_s));
    stream.connect(resolver.resolve(host, admin.substr(colon + 1)));
    http::request<http::string_body> req{verb, path, 11};
    req.set(http::field::host, host);
    if (!admin_token.empty()) req.set(http::field::authorization, "Bearer " + admin_token);
    if (verb == http::verb::post) {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
      req.prepare_payload();
    }
    http::write(stream, req);
    boost::beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(stream, buf, res);
    return HttpReply{res.result_int(), res.body()};
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sluicectl: %s: %s\n", admin.c_str(), e.what());
    return std::nullopt;
  }
}

// The parsed JSON of a 200 answer; otherwise prints the node's error and returns nullopt.
// `not_found` is set (and nothing printed) for a 404 when the caller asks for it.
std::optional<json> call_json(const std::string& admin, http::verb verb, const std::string& path,
                              const json& body = nullptr, bool* not_found = nullptr) {
  const auto r = http_call(admin, verb, path, body.is_null() ? "" : body.dump());
  if (!r) return std::nullopt;
  json j;
  try {
    j = json::parse(r->body);
  } catch (const std::exception&) {
    std::fprintf(stderr, "sluicectl: %s%s answered %u with a body that is not JSON\n",
                 admin.c_str(), path.c_str(), r->status);
    return std::nullopt;
  }
  if (r->status == 404 && not_found != nullptr) {
    *not_found = true;
    return std::nullopt;
  }
  if (r->status != 200) {
    const std::string msg =
        j.contains("error") && j["error"].is_string() ? j["error"].get<std::string>() : r->body;
    std::fprintf(stderr, "sluicectl: %s (HTTP %u from %s)\n", msg.c_str(), r->status,
                 admin.c_str());
    return std::nullopt;
  }
  return j;
}

std::string describe(const json& o) {
  std::string s = o.value("domain", "");
  for (const auto& [k, v] : o.at("descriptors").items())
    s += " " + k + "=" + v.get<std::string>();
  return s;
}

std::string override_text(const json& o) {
  std::string s = describe(o) + ":";
  if (!o.at("limits").empty()) {
    std::string lims;
    for (const auto& l : o.at("limits"))
      lims += (lims.empty() ? "" : ", ") + std::to_string(l.at("limit").get<uint64_t>()) + "/" +
              l.at("window").get<std::string>();
    s += " limits " + lims;
  }
  if (!o.at("plan").get<std::string>().empty()) s += " plan " + o.at("plan").get<std::string>();
  if (!o.at("mode").is_null()) s += " mode " + o.at("mode").get<std::string>();
  s += o.at("ttl_left_s").is_null()
           ? std::string(", no expiry")
           : ", expires in " + std::to_string(o.at("ttl_left_s").get<int64_t>()) + "s";
  return s;
}

void print_json(const json& j) {
  std::printf("%s\n", j.dump().c_str());
}

int run_override_set(const std::string& admin, const std::string& path, json body, bool as_json) {
  const auto j = call_json(admin, http::verb::post, path, body);
  if (!j) return kError;
  if (as_json) {
    print_json(*j);
  } else {
    std::printf("set %s\n", override_text(j->at("override")).c_str());
  }
  return kAllowed;
}

int run_override_get(const std::string& admin, const json& target, bool as_json) {
  bool not_found = false;
  const auto j = call_json(admin, http::verb::post, "/v1/overrides/get", target, &not_found);
  if (not_found) {
    if (as_json) {
      print_json(json{{"override", nullptr}});
    } else {
      std::printf("no override\n");
    }
    return kDenied;
  }
  if (!j) return kError;
  if (as_json) {
    print_json(*j);
  } else {
    std::printf("%s\n", override_text(j->at("override")).c_str());
  }
  return kAllowed;
}

int run_override_del(const std::string& admin, const json& target, bool as_json) {
  bool not_found = false;
  const auto j = call_json(admin, http::verb::post, "/v1/overrides/delete", target, &not_found);
  if (not_found) {
    if (as_json) {
      print_json(json{{"deleted", false}});
    } else {
      std::printf("no override to delete\n");
    }
    return kDenied;
  }
  if (!j) return kError;
  if (as_json) {
    print_json(*j);
  } else {
    std::printf("deleted\n");
  }
  return kAllowed;
}

int run_override_list(const std::string& admin, const std::string& domain, bool as_json) {
  const auto j = call_json(admin, http::verb::get,
                           domain.empty() ? "/v1/overrides" : "/v1/overrides?domain=" + domain);
  if (!j) return kError;
  if (as_json) {
    print_json(*j);
    return kAllowed;
  }
  if (j->at("overrides").empty()) std::printf("no overrides\n");
  for (const auto& o : j->at("overrides"))
    std::printf("%s\n", override_text(o).c_str());
  return kAllowed;
}

int run_inspect(const std::string& admin, const json& target, bool as_json) {
  const auto j = call_json(admin, http::verb::post, "/v1/inspect", target);
  if (!j) return kError;
  if (as_json) {
    print_json(*j);
    return kAllowed;
  }
  const int64_t now = j->at("now_ms").get<int64_t>();
  std::printf("%s%s\n", describe(*j).c_str(),
              j->at("allowlisted").get<bool>() ? "  (allowlisted: never limited)" : "");
  if (j->at("rules").empty()) std::printf("  no rule applies\n");
  for (const auto& r : j->at("rules")) {
    std::string key;
    for (const auto& [k, v] : r.at("key").items())
      key += (key.empty() ? "" : " ") + k + "=" + v.get<std::string>();
    std::printf("rule %s  key %s  mode %s  %s%s\n", r.at("rule").get<std::string>().c_str(),
                key.c_str(), r.at("mode").get<std::string>().c_str(),
                r.at("estimator").get<std::string>().c_str(),
                r.at("count_denied").get<bool>() ? "  counts denied" : "");
    if (!r.at("override").is_null()) {
      std::printf("  override  %s\n", override_text(r.at("override")).c_str());
    }
    for (const auto& l : r.at("limits")) {
      std::printf("  %-24s %llu/%s  estimate %.2f  remaining %llu  reset %s  counter %s\n",
                  l.at("name").get<std::string>().c_str(),
                  static_cast<unsigned long long>(l.at("limit").get<uint64_t>()),
                  l.at("window").get<std::string>().c_str(), l.at("estimate").get<double>(),
                  static_cast<unsigned long long>(l.at("remaining").get<uint64_t>()),
                  seconds_text(l.at("reset_ms").get<int64_t>()).c_str(),
                  l.at("counter").get<std::string>().c_str());
      if (l.value("algorithm", "window") == "gcra") {
        const int64_t tat = l.at("tat_ms").get<int64_t>();
        std::printf("    gcra rate %s burst %llu  %s\n", l.at("rate").get<std::string>().c_str(),
                    static_cast<unsigned long long>(l.at("burst").get<uint64_t>()),
                    tat > now ? ("full again in " + seconds_text(tat - now)).c_str()
                              : "full allowance (nothing counted lately)");
        continue;
      }
      if (l.value("algorithm", "window") == "concurrency") {
        std::printf("    concurrency: %llu of %llu held in leases, lease_ttl %s\n",
                    static_cast<unsigned long long>(l.at("held").get<uint64_t>()),
                    static_cast<unsigned long long>(l.at("max_in_flight").get<uint64_t>()),
                    l.at("lease_ttl").get<std::string>().c_str());
        if (l.at("buckets").empty()) continue;
        std::printf("    %-12s %10s %10s %12s %12s\n", "granted age", "this node", "others",
                    "released here", "released else");
        for (const auto& b : l.at("buckets")) {
          std::printf("    %-12s %10u %10u %12u %12u\n",
                      seconds_text(now - b.at("start_ms").get<int64_t>()).c_str(),
                      b.at("own").get<unsigned>(), b.at("others").get<unsigned>(),
                      b.at("released_own").get<unsigned>(),
                      b.at("released_others").get<unsigned>());
        }
        continue;
      }
      if (l.at("buckets").empty()) {
        std::printf("    no counter yet (nothing counted in this window)\n");
        continue;
      }
      const json& nodes = l.contains("nodes") ? l.at("nodes") : json::array();
      std::printf("    %-12s %10s %10s", "bucket age", "this node", "others");
      for (const auto& n : nodes)
        std::printf(" %9s%-3u", "node ", n.at("node").get<unsigned>());
      std::printf("\n");
      size_t row = 0;
      for (const auto& b : l.at("buckets")) {
        std::printf("    %-12s %10u %10u",
                    seconds_text(now - b.at("start_ms").get<int64_t>()).c_str(),
                    b.at("own").get<unsigned>(), b.at("others").get<unsigned>());
        for (const auto& n : nodes)
          std::printf(" %12u", n.at("buckets").at(row).get<unsigned>());
        std::printf("\n");
        ++row;
      }
    }
  }
  return kAllowed;
}

int run_top(const std::string& admin, int n, bool watch, double interval_s, int count,
            bool as_json) {
  for (int round = 1;; ++round) {
    const auto j = call_json(admin, http::verb::get, "/v1/top?n=" + std::to_string(n));
    if (!j) return kError;
    if (as_json) {
      print_json(*j);
    } else {
      if (watch) std::printf("\033[H\033[2J");  // clear the terminal between refreshes
      const int64_t now = j->at("now_ms").get<int64_t>();
      std::printf("%-10s %-28s %-32s %15s %7s %8s %9s %8s\n", "state", "rule", "key", "used/limit",
                  "%", "window", "exceeded", "last");
      if (j->at("keys").empty()) std::printf("(no key at 80 %% or more of a limit)\n");
      for (const auto& k : j->at("keys")) {
        const std::string used = std::to_string(k.at("used").get<uint64_t>()) + "/" +
                                 std::to_string(k.at("limit").get<uint64_t>());
        std::printf("%-10s %-28s %-32s %15s %6.1f%% %8s %9llu %8s\n",
                    k.at("state").get<std::string>().c_str(),
                    k.at("rule").get<std::string>().c_str(), k.at("key").get<std::string>().c_str(),
                    used.c_str(), k.at("percent").get<double>(),
                    k.at("window").get<std::string>().c_str(),
                    static_cast<unsigned long long>(k.at("exceeded").get<uint64_t>()),
                    seconds_text(now - k.at("last_ms").get<int64_t>()).c_str());
      }
    }
    std::fflush(stdout);
    if (!watch || (count > 0 && round >= count)) return kAllowed;
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(interval_s * 1000)));
  }
}

// `sluicectl top --cluster`: GET /v1/cluster/top, the node at --admin asking every member.
void print_cluster_top(const std::string& admin, const json& j) {
  const size_t total = j.at("members_total").get<size_t>();
  const size_t answered = j.at("members_answered").get<size_t>();
  std::printf("cluster seen from %s: %zu of %zu members answered%s\n", admin.c_str(), answered,
              total, j.at("cluster").get<bool>() ? "" : " (a single node, no cluster)");
  std::printf("%-5s %-16s %-22s %-8s %-6s %9s %12s\n", "id", "member", "admin", "state", "ready",
              "uptime", "checks");
  for (const auto& m : j.at("members")) {
    const std::string name = m.at("name").get<std::string>().empty()
                                 ? std::string("(this node)")
                                 : m.at("name").get<std::string>();
    const std::string self = m.at("self").get<bool>() ? "  (this node)" : "";
    if (!m.at("answered").get<bool>()) {
      std::printf("%-5u %-16s %-22s %-8s did not answer: %s\n", m.at("id").get<unsigned>(),
                  name.c_str(), m.at("address").get<std::string>().c_str(),
                  m.at("state").get<std::string>().c_str(),
                  m.at("error").get<std::string>().c_str());
      continue;
    }
    const json& ready = m.at("ready");
    const std::string ready_text = ready.is_null() ? "-" : (ready.get<bool>() ? "yes" : "no");
    const std::string why =
        m.at("not_ready").is_null() ? "" : " (" + m.at("not_ready").get<std::string>() + ")";
    std::printf("%-5u %-16s %-22s %-8s %-6s %8llds %12llu%s%s\n", m.at("id").get<unsigned>(),
                name.c_str(), m.at("address").get<std::string>().c_str(),
                m.at("state").get<std::string>().c_str(), ready_text.c_str(),
                m.at("uptime_s").get<long long>(), m.at("checks").get<unsigned long long>(),
                why.c_str(), self.c_str());
  }
  std::printf(
      "\n%-32s %12s %12s %12s %12s   (summed over %zu of %zu members, since each "
      "started)\n",
      "rule / member", "allowed", "denied", "shadow", "would-deny", answered, total);
  const auto counts = [](const char* label, const json& c) {
    std::printf("%-32s %12llu %12llu %12llu %12llu\n", label,
                c.at("allowed").get<unsigned long long>(), c.at("denied").get<unsigned long long>(),
                c.at("shadow_denied").get<unsigned long long>(),
                c.at("would_deny").get<unsigned long long>());
  };
  size_t quiet = 0;
  for (const auto& r : j.at("rules")) {
    if (r.at("allowed").get<uint64_t>() + r.at("denied").get<uint64_t>() +
            r.at("shadow_denied").get<uint64_t>() + r.at("would_deny").get<uint64_t>() ==
        0) {
      ++quiet;
      continue;
    }
    counts(r.at("rule").get<std::string>().c_str(), r);
    for (const auto& n : r.at("nodes")) {
      const std::string label =
          "  " + (n.at("name").get<std::string>().empty() ? std::string("this node")
                                                          : n.at("name").get<std::string>());
      counts(label.c_str(), n);
    }
  }
  if (quiet > 0) std::printf("(%zu rules without decisions left out; --json lists them)\n", quiet);
}

int run_top_cluster(const std::string& admin, int timeout_ms, bool watch, double interval_s,
                    int count, bool as_json) {
  for (int round = 1;; ++round) {
    const auto j = call_json(admin, http::verb::get,
                             "/v1/cluster/top?timeout_ms=" + std::to_string(timeout_ms));
    if (!j) return kError;
    if (as_json) {
      print_json(*j);
    } else {
      if (watch) std::printf("\033[H\033[2J");  // clear the terminal between refreshes
      try {
        print_cluster_top(admin, *j);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "sluicectl: unexpected cluster view from %s: %s\n", admin.c_str(),
                     ex.what());
        return kError;
      }
    }
    std::fflush(stdout);
    if (!watch || (count > 0 && round >= count)) return kAllowed;
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(interval_s * 1000)));
  }
}

// `target` null: every member's share; else {"domain","descriptors"}: the owners of its counters.
int run_ring(const std::string& admin, const json& target, bool as_json) {
  if (target.is_null()) {
    const auto j = call_json(admin, http::verb::get, "/v1/ring");
    if (!j) return kError;
    if (as_json) {
      print_json(*j);
      return kAllowed;
    }
    if (!j->at("enabled").get<bool>()) {
      std::printf("a single node: it owns every key\n");
      return kAllowed;
    }
    std::printf("%-5s %-16s %8s   (%zu replicas per key)\n", "id", "member", "share",
                j->at("replicas").get<size_t>());
    for (const auto& m : j->at("shares")) {
      std::printf("%-5u %-16s %7.2f%%\n", m.at("id").get<unsigned>(),
                  m.at("name").get<std::string>().c_str(), 100.0 * m.at("share").get<double>());
    }
    return kAllowed;
  }
  const auto j = call_json(admin, http::verb::post, "/v1/ring", target);
  if (!j) return kError;
  if (as_json) {
    print_json(*j);
    return kAllowed;
  }
  for (const auto& r : j->at("rules")) {
    std::printf("rule %s (%s)\n", r.at("rule").get<std::string>().c_str(),
                r.at("consistency").get<std::string>().c_str());
    for (const auto& l : r.at("limits")) {
      std::string owners;
      for (const auto& o : l.at("owners"))
        owners += (owners.empty() ? "owner " : ", replica ") + o.at("name").get<std::string>();
      std::printf("  %-24s %s\n", l.at("name").get<std::string>().c_str(),
                  owners.empty() ? "this node (single node)" : owners.c_str());
    }
  }
  return kAllowed;
}

int run_drain(const std::string& admin, bool as_json) {
  const auto j = call_json(admin, http::verb::post, "/v1/drain");
  if (!j) return kError;
  if (as_json) {
    print_json(*j);
  } else {
    std::printf("draining: the node leaves the cluster, hands its counters over, then stops\n");
  }
  return kAllowed;
}

int run_snapshot(const std::string& admin, bool full, bool as_json) {
  const auto j = call_json(admin, http::verb::post, full ? "/v1/snapshot?full=1" : "/v1/snapshot");
  if (!j) return kError;
  if (as_json) {
    print_json(*j);
  } else {
    std::printf("snapshot%s: %llu counters written, %llu deleted, %.1f KiB in %.1f ms\n",
                j->at("full").get<bool>() ? " (full)" : "",
                static_cast<unsigned long long>(j->at("written").get<uint64_t>()),
                static_cast<unsigned long long>(j->at("deleted").get<uint64_t>()),
                j->at("bytes").get<double>() / 1024.0, j->at("duration_ms").get<double>());
  }
  return kAllowed;
}

int run_status(const std::string& admin, bool as_json) {
  const auto got = call_json(admin, http::verb::get, "/v1/status");
  if (!got) return kError;
  if (as_json) {
    print_json(*got);
    return kAllowed;
  }
  const json& j = *got;
  try {
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
    if (j.contains("process")) {
      std::printf("memory    %.1f MiB resident\n",
                  j["process"].at("rss_bytes").get<double>() / 1048576.0);
    }
    if (j.contains("persistence")) {
      const auto& p = j["persistence"];
      if (!p.at("enabled").get<bool>()) {
        std::printf("data      none: counters and overrides live in memory only\n");
      } else {
        const auto& last = p.at("last_snapshot");
        std::string age =
            last.at("age_ms").is_null()
                ? std::string("no snapshot yet")
                : "last snapshot " + seconds_text(last.at("age_ms").get<int64_t>()) + " ago";
        // Nodes before the overrides' database of their own report only the total.
        std::string split;
        if (p.contains("disk")) {
          char buf[96];
          std::snprintf(buf, sizeof buf, " (overrides' database %.1f KiB)",
                        p.at("disk").at("overrides_bytes").get<double>() / 1024.0);
          split = buf;
        }
        std::printf(
            "data      %s: %s (%llu written, %.1f KiB, %.1f ms%s), %.1f MiB on disk%s, "
            "%llu overrides\n",
            p.at("dir").get<std::string>().c_str(), age.c_str(),
            static_cast<unsigned long long>(last.at("written").get<uint64_t>()),
            last.at("bytes").get<double>() / 1024.0, last.at("duration_ms").get<double>(),
            last.at("ok").get<bool>() ? "" : ", FAILED",
            p.at("disk_bytes").get<double>() / 1048576.0, split.c_str(),
            static_cast<unsigned long long>(p.at("overrides").get<uint64_t>()));
        std::printf(
            "restored  %llu counters at start in %.1f ms (%llu expired, %llu unreadable)\n",
            static_cast<unsigned long long>(p.at("restored").at("counters").get<uint64_t>()),
            p.at("restored").at("duration_ms").get<double>(),
            static_cast<unsigned long long>(p.at("restored").at("expired").get<uint64_t>()),
            static_cast<unsigned long long>(p.at("restored").at("malformed").get<uint64_t>()));
      }
    }
    if (j.contains("rules")) {
      std::printf("%-32s %12s %12s %12s %12s\n", "rule", "allowed", "denied", "shadow",
                  "would-deny");
      for (const auto& r : j["rules"]) {
        std::printf("%-32s %12llu %12llu %12llu %12llu\n", r.at("name").get<std::string>().c_str(),
                    r.at("allowed").get<unsigned long long>(),
                    r.at("denied").get<unsigned long long>(),
                    r.at("shadow_denied").get<unsigned long long>(),
                    r.at("would_deny").get<unsigned long long>());
      }
    }
    if (j.contains("cluster") && j["cluster"].at("enabled").get<bool>()) {
      const auto& c = j["cluster"];
      // A node older than readiness has no "ready": say nothing rather than guess.
      std::string ready;
      if (c.contains("ready")) {
        ready = c["ready"].get<bool>() ? ", ready"
                                       : ", not ready: " + c.value("not_ready", std::string("?"));
      }
      std::printf("cluster   node %s (%u), %s%s, %zu replicas per key\n",
                  c.at("name").get<std::string>().c_str(), c.at("self").get<unsigned>(),
                  c.at("join_state").get<std::string>().c_str(), ready.c_str(),
                  c.at("replicas").get<size_t>());
      std::printf("%-5s %-16s %-22s %-8s %11s %7s %10s %10s %10s\n", "id", "member", "peer",
                  "state", "incarnation", "share", "heard", "sync lag", "clock");
      for (const auto& m : c.at("members")) {
        const auto ago = [](const json& v) {
          return v.is_null() ? std::string("-") : seconds_text(v.get<int64_t>());
        };
        const std::string peer =
            m.at("host").get<std::string>() + ":" + std::to_string(m.at("peer_port").get<int>());
        // How far its clock is ahead of this node's (by its last datagram): "+10.000s".
        const auto offset = [](const json& v) {
          if (v.is_null()) return std::string("-");
          const int64_t ms = v.get<int64_t>();
          return (ms < 0 ? "-" : "+") + seconds_text(ms < 0 ? -ms : ms);
        };
        std::printf("%-5u %-16s %-22s %-8s %11u %6.1f%% %10s %10s %10s%s\n",
                    m.at("id").get<unsigned>(), m.at("name").get<std::string>().c_str(),
                    peer.c_str(), m.at("state").get<std::string>().c_str(),
                    m.at("incarnation").get<unsigned>(), 100.0 * m.at("share").get<double>(),
                    ago(m.at("last_heard_ms")).c_str(), ago(m.at("sync_lag_ms")).c_str(),
                    offset(m.value("clock_offset_ms", json(nullptr))).c_str(),
                    m.at("self").get<bool>() ? "  (this node)" : "");
      }
      if (!c.at("dropped").empty()) {
        std::string d;
        for (const auto& [reason, count] : c.at("dropped").items())
          d += (d.empty() ? "" : ", ") + reason + " " + std::to_string(count.get<uint64_t>());
        std::printf("peer datagrams dropped: %s\n", d.c_str());
      }
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "sluicectl: unexpected status from %s: %s\n", admin.c_str(), ex.what());
    return kError;
  }
  return kAllowed;
}

// `rules convert`: envoyproxy/ratelimit files -> Sluice's rules format, on stdout.
int run_rules_convert(const std::string& path) {
  const sluice::rules::ParseResult parsed = sluice::rules::load_envoy_rules(path, {});
  for (const auto& e : parsed.errors)
    std::fprintf(stderr, "sluicectl: %s\n", e.to_string().c_str());
  if (!parsed.rules) return kError;
  std::fputs(sluice::rules::to_rules_yaml(*parsed.rules).c_str(), stdout);
  return kAllowed;
}

}  // namespace

int main(int argc, char** argv) {
  using sluice::ctl::Command;
  const sluice::ctl::Invocation inv =
      sluice::ctl::parse_command_line(std::vector<std::string>(argv, argv + argc));
  if (inv.command == Command::kNone) {
    std::fputs(inv.output.c_str(), stdout);
    if (!inv.error.empty()) {
      // CLI11's own messages end with a newline and say how to get help; ours get a prefix.
      if (inv.error.back() == '\n') {
        std::fputs(inv.error.c_str(), stderr);
      } else {
        std::fprintf(stderr, "sluicectl: %s\n", inv.error.c_str());
      }
    }
    return inv.exit_code;
  }
  if (!inv.token_file.empty()) {
    if (!read_token_file(inv.token_file, admin_token)) return kError;
  } else if (const char* env = std::getenv("SLUICE_ADMIN_TOKEN"); env != nullptr) {
    admin_token = env;
  }
  const std::string& admin = inv.admin;
  switch (inv.command) {
    case Command::kRulesConvert:
      return run_rules_convert(inv.convert_path);
    case Command::kRing:
      return run_ring(admin, inv.target, inv.as_json);
    case Command::kDrain:
      return run_drain(admin, inv.as_json);
    case Command::kCheck:
      return run_check(inv.server, inv.tcp, inv.timeout_ms, inv.domain, inv.pairs, inv.hits,
                       inv.repeat, inv.as_json);
    case Command::kStatus:
      return run_status(admin, inv.as_json);
    case Command::kOverrideSet:
    case Command::kPlanAssign:
      return run_override_set(admin, inv.admin_path, inv.target, inv.as_json);
    case Command::kOverrideGet:
      return run_override_get(admin, inv.target, inv.as_json);
    case Command::kOverrideDel:
      return run_override_del(admin, inv.target, inv.as_json);
    case Command::kOverrideList:
      return run_override_list(admin, inv.domain, inv.as_json);
    case Command::kInspect:
      return run_inspect(admin, inv.target, inv.as_json);
    case Command::kTop:
      if (inv.cluster) {
        return run_top_cluster(admin, inv.cluster_timeout_ms, inv.watch, inv.interval_s, inv.count,
                               inv.as_json);
      }
      return run_top(admin, inv.top_n, inv.watch, inv.interval_s, inv.count, inv.as_json);
    case Command::kSnapshot:
      return run_snapshot(admin, inv.full, inv.as_json);
    case Command::kNone:
      break;
  }
  return kError;
}
