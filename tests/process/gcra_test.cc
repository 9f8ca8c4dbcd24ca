// Process tests of GCRA limits (`algorithm: gcra`, window/gcra.h): a real sluiced deciding them
// over UDP and the admin port's /v1/check, shown by `sluicectl inspect`, kept across a SIGTERM and
// a restart on the same data directory, and refused in rules files that give them a zero rate, a
// zero burst or a refill longer than 24 days.
//
// Timing: a GCRA limit of 10/1s refills one request every 100 ms, so "a burst at once" means the
// checks of one burst all arrive within 100 ms of the first. A machine busy enough to stall the
// test that long would make a correct node look wrong; such an attempt is reported (MESSAGE) and
// tried again with a fresh key, at most 3 times. Every wait is bounded.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"
#include "sluiced_process.h"
#include "text.h"

namespace {

using nlohmann::json;
using sluice::testing::contains;
using sluice::testing::Daemon;
using sluice::testing::DaemonConfig;
using sluice::testing::HttpReply;
using sluice::testing::ProcessResult;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Domain t: a GCRA limit of 10/1s with a burst of 5 (one request per 100 ms; a full allowance
// refills in 500 ms). Domain slow: 1/1m with a burst of 3 (nothing refills during a test).
constexpr const char* kRules = R"(domains:
  - name: t
    rules:
      - name: per-user
        key: [user]
        limits:
          - {algorithm: gcra, rate: 10/1s, burst: 5}
  - name: slow
    rules:
      - name: per-user
        key: [user]
        limits:
          - {algorithm: gcra, rate: 1/1m, burst: 3}
)";

// A snapshot interval longer than any test: the only pass is the final one at SIGTERM.
constexpr int64_t kNoPeriodicSnapshot = 600'000;

DaemonConfig config() {
  DaemonConfig c;
  c.rules = kRules;
  c.snapshot_interval_ms = kNoPeriodicSnapshot;
  return c;
}

// How long a burst of checks may take, first send to last answer, for its decisions to be those
// of checks "at once" (under the 100 ms a request of 10/1s takes to refill, with margin).
constexpr auto kAtOnce = milliseconds(80);
constexpr int kAttempts = 3;

bool exited_with(int status, int code) {
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == code;
}

json json_of(const ProcessResult& r) {
  try {
    return json::parse(r.out);
  } catch (const std::exception& e) {
    FAIL("sluicectl printed no JSON (" << e.what() << "); exit " << r.exit_code()
                                       << "\nstdout: " << r.out << "\nstderr: " << r.err);
  }
  return {};
}

// One UDP check of 1 hit (hits 0: counts nothing), answered with one decision of one limit.
sluice::wire::Decision decide(const Daemon& d, const std::string& user,
                              const std::string& domain = "t", int64_t hits = 1) {
  const auto a = d.udp_check(user, hits, domain);
  REQUIRE(a.has_value());
  REQUIRE(a->decisions.size() == 1);
  REQUIRE(a->decisions[0].code == sluice::wire::Code::kOk);
  REQUIRE(a->decisions[0].limits.size() == 1);
  return a->decisions[0];
}

// Runs `attempt(key)` with keys gcra-<base>-1, -2, ... until it returns true (it ran within its
// time budget and checked what it meant to), at most kAttempts times.
void with_fresh_keys(const std::string& base,
                     const std::function<bool(const std::string&)>& attempt) {
  for (int i = 1; i <= kAttempts; ++i) {
    if (attempt(base + "-" + std::to_string(i))) return;
  }
  FAIL("every attempt was too slow to tell (see the messages above)");
}

std::string check_body(const std::string& user) {
  return json{{"domain", "t"}, {"descriptors", {{"user", user}}}, {"hits", 1}}.dump();
}

}  // namespace

TEST_CASE(
    "a GCRA limit admits its burst at once, then its rate, and answers carry limit = burst and "
    "retry-after") {
  Daemon d(config());
  with_fresh_keys("udp", [&](const std::string& key) {
    std::vector<sluice::wire::Decision> got;
    const auto start = Clock::now();
    for (int i = 0; i < 6; ++i)
      got.push_back(decide(d, key));
    const auto took = Clock::now() - start;
    if (took >= kAtOnce) {
      MESSAGE("6 checks took " << std::chrono::duration_cast<milliseconds>(took).count()
                               << " ms, not at once: trying again with another key");
      return false;
    }
    for (size_t i = 0; i < 5; ++i) {
      INFO("check " << i + 1);
      CHECK(got[i].allowed);
      CHECK(got[i].limits[0].limit == 5);        // the burst
      CHECK(got[i].limits[0].window_ms == 500);  // 5 x 100 ms to refill the whole burst
      CHECK(got[i].limits[0].remaining == 4 - i);
      CHECK_FALSE(got[i].limits[0].exceeded);
      CHECK(got[i].limits[0].name == "per-user:10/1s:burst-5");
    }
    const auto& denied = got[5].limits[0];
    CHECK_FALSE(got[5].allowed);
    CHECK(denied.exceeded);
    CHECK(denied.limit == 5);
    CHECK(denied.window_ms == 500);
    CHECK(denied.remaining == 0);
    // The next request is one interval (100 ms) after the first, less the time gone since.
    CHECK(denied.retry_after_ms >= 1);
    CHECK(denied.retry_after_ms <= 100);
    CHECK(denied.reset_ms > 400);
    CHECK(denied.reset_ms <= 500);

    std::this_thread::sleep_for(milliseconds(120));
    const auto later = decide(d, key);
    CHECK(later.allowed);
    CHECK(later.limits[0].limit == 5);
    CHECK(later.limits[0].window_ms == 500);
    return true;
  });
}

TEST_CASE("HTTP /v1/check decides a GCRA limit the same way") {
  Daemon d(config());
  with_fresh_keys("http", [&](const std::string& key) {
    std::vector<HttpReply> got;
    const auto start = Clock::now();
    for (int i = 0; i < 6; ++i)
      got.push_back(sluice::testing::http_request(d.admin, "POST", "/v1/check", check_body(key)));
    const auto took = Clock::now() - start;
    if (took >= kAtOnce) {
      MESSAGE("6 HTTP checks took " << std::chrono::duration_cast<milliseconds>(took).count()
                                    << " ms, not at once: trying again with another key");
      return false;
    }
    for (size_t i = 0; i < 6; ++i) {
      INFO("check " << i + 1 << ": HTTP " << got[i].status << " " << got[i].body);
      const bool admitted = i < 5;
      CHECK(got[i].status == (admitted ? 200u : 429u));
      const auto j = got[i].json();
      REQUIRE(j.has_value());
      CHECK(j->at("allowed") == admitted);
      REQUIRE(j->at("limits").size() == 1);
      const json& l = j->at("limits").at(0);
      CHECK(l.at("limit") == 5);
      CHECK(l.at("window_s") == 1);  // 500 ms, rounded up to whole seconds
      CHECK(l.at("remaining") == (admitted ? 4 - i : size_t{0}));
      CHECK(l.at("exceeded") == !admitted);
      if (!admitted) CHECK(l.at("retry_after_s") == 1);  // under 100 ms, rounded up
    }
    return true;
  });
}

TEST_CASE("sluicectl inspect shows a GCRA key's rate, burst and time to full") {
  Daemon d(config());
  with_fresh_keys("inspect", [&](const std::string& key) {
    const auto start = Clock::now();
    for (int i = 0; i < 3; ++i)
      CHECK(decide(d, key).allowed);
    // The JSON first: its remaining < 5 only holds until the 3 checks refilled (300 ms).
    const ProcessResult r = d.ctl({"inspect", "t", "user=" + key, "--json"});
    const auto took = Clock::now() - start;
    INFO("stdout: " << r.out << "\nstderr: " << r.err);
    REQUIRE(r.exit_code() == 0);
    const json j = json_of(r);
    if (took >= milliseconds(250)) {
      MESSAGE("3 checks and sluicectl inspect took "
              << std::chrono::duration_cast<milliseconds>(took).count()
              << " ms, the allowance may be full again: trying again with another key");
      return false;
    }
    REQUIRE(j.at("rules").size() == 1);
    REQUIRE(j.at("rules").at(0).at("limits").size() == 1);
    const json& l = j.at("rules").at(0).at("limits").at(0);
    CHECK(l.at("algorithm") == "gcra");
    CHECK(l.at("rate") == "10/1s");
    CHECK(l.at("burst") == 5);
    CHECK(l.at("limit") == 5);
    CHECK(l.at("remaining").get<uint64_t>() < 5);
    CHECK(l.at("remaining").get<uint64_t>() >= 2);
    CHECK(l.at("reset_ms").get<int64_t>() > 0);
    CHECK(l.at("reset_ms").get<int64_t>() <= 300);
    CHECK(l.at("tat_ms").get<int64_t>() > j.at("now_ms").get<int64_t>());

    const ProcessResult text = d.ctl({"inspect", "t", "user=" + key});
    INFO("text stdout: " << text.out << "\ntext stderr: " << text.err);
    CHECK(text.exit_code() == 0);
    CHECK(contains(text.out, "gcra rate 10/1s burst 5"));
    return true;
  });
}

TEST_CASE("a GCRA key's state survives a restart") {
  Daemon d(config());
  for (int i = 0; i < 3; ++i)
    CHECK(decide(d, "keeper", "slow").allowed);
  const auto denied = decide(d, "keeper", "slow");
  CHECK_FALSE(denied.allowed);
  CHECK(denied.limits[0].limit == 3);
  // 1/1m: the next one a minute after the first.
  CHECK(denied.limits[0].retry_after_ms > 50'000);
  CHECK(denied.limits[0].retry_after_ms <= 60'000);

  // SIGTERM writes the final snapshot (no periodic pass runs: kNoPeriodicSnapshot).
  REQUIRE(exited_with(d.stop(), 0));
  d.restart();

  const auto after = decide(d, "keeper", "slow");
  INFO("log: " << d.log());
  CHECK_FALSE(after.allowed);
  CHECK(after.limits[0].remaining == 0);
  CHECK(after.limits[0].retry_after_ms > 40'000);
  CHECK(after.limits[0].retry_after_ms <= 60'000);
  // Another key of the same rule was never counted: its whole burst.
  CHECK(decide(d, "fresh", "slow").allowed);
  CHECK(decide(d, "fresh", "slow", 0).limits[0].remaining == 2);

  const ProcessResult st = d.ctl({"status", "--json"});
  REQUIRE(st.exit_code() == 0);
  CHECK(json_of(st).at("persistence").at("restored").at("counters").get<uint64_t>() >= 1);
}

TEST_CASE(
    "a GCRA rule with a zero rate, a zero burst or a refill over 24 days is refused with file, "
    "line and field") {
  struct Case {
    const char* what;
    std::string rules;
    int line;
    std::string field;  // the field path the error names
    std::string why;    // part of the reason
  };
  const std::string head =
      "domains:\n"              // 1
      "  - name: t\n"           // 2
      "    rules:\n"            // 3
      "      - name: r\n"       // 4
      "        key: [user]\n";  // 5
  const std::vector<Case> cases = {
      {"refill over 24 days",
       head + "        limits:\n"                                        // 6
              "          - {algorithm: gcra, rate: 1/1d, burst: 30}\n",  // 7
       7, "domains[0].rules[0].limits[0].burst", "24 days"},
      {"zero rate",
       head + "        limits:\n"                                       // 6
              "          - {algorithm: gcra, rate: 0/1s, burst: 5}\n",  // 7
       7, "domains[0].rules[0].limits[0].rate", "0/1s"},
      {"zero burst",
       head + "        limits:\n"              // 6
              "          - name: no-burst\n"   // 7
              "            algorithm: gcra\n"  // 8
              "            rate: 10/1s\n"      // 9
              "            burst: 0\n",        // 10
       10, "domains[0].rules[0].limits[0].burst", "`0`"},
  };
  for (const Case& c : cases) {
    DaemonConfig cfg = config();
    cfg.rules = c.rules;
    Daemon d(cfg, /*start_now=*/false);
    const std::string where =
        d.rules_file().string() + ":" + std::to_string(c.line) + ": " + c.field + ": ";
    // `sluiced --check` and a plain start both refuse the file with the same message.
    for (const bool check_only : {true, false}) {
      const ProcessResult r = d.run_to_exit(check_only ? std::vector<std::string>{"--check"}
                                                       : std::vector<std::string>{});
      INFO(c.what << (check_only ? " (--check)" : " (start)") << ": exit " << r.exit_code()
                  << "\nstdout: " << r.out << "\nstderr: " << r.err);
      CHECK(r.exit_code() == 2);
      CHECK(contains(r.err, where));
      CHECK(contains(r.err, c.why));
      CHECK_FALSE(contains(r.out, "valid"));
    }
  }
}
