// Rolling upgrade (docs/operations.md, "Rolling upgrade"): three nodes of the previous release,
// built from git (the commit CHANGELOG.md names for it, tests/upgrade/build_release.sh: once,
// then cached outside the clone), under owner-mode traffic, replaced one at a time by this
// build on their own data directories. Asserted: no client check fails, the owner limit holds
// (admitted <= 1.00 x the limit in every true 1 s window, from the generator's send times), and
// no count is lost (each key's count, as its owner knows it, is the same before and after each
// node's restart, and at the end matches what the generator saw admitted).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/release.h"
#include "cluster_process.h"

namespace {

using namespace sluice::testing;
using std::chrono::milliseconds;

constexpr uint64_t kLimit = 40;  // per key per 1 s (two_mode_rules' owner domain "o")
constexpr int64_t kWindowUs = 1'000'000;

struct PreviousRelease {
  std::string version;  // "0.2.0"
  std::string commit;   // as CHANGELOG.md names it
};

// The section of CHANGELOG.md for the minor release before this build's ("## 0.2.0 - ...
// commit 12171db ..."); empty when there is none.
PreviousRelease previous_release() {
  std::ifstream in(std::string(SLUICE_SOURCE_DIR) + "/CHANGELOG.md");
  const std::regex heading(R"(^## (\d+)\.(\d+)\.(\d+)\b.*\bcommit ([0-9a-f]{7,40})\b)");
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, heading)) continue;
    if (std::stoi(m[1]) == sluice::kThisRelease.major &&
        std::stoi(m[2]) + 1 == sluice::kThisRelease.minor) {
      return {m[1].str() + "." + m[2].str() + "." + m[3].str(), m[4].str()};
    }
  }
  return {};
}

// Runs `command` through the shell: its exit code and stdout (stderr passes through).
std::pair<int, std::string> shell(const std::string& command) {
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The count of the `total` limit of {o, k=key} as its owner knows it; nullopt when unknown.
std::optional<uint64_t> owner_count(LocalCluster& c, const std::string& key) {
  const auto up = c.running_nodes();
  if (up.empty()) return std::nullopt;
  const auto owners = c.owners(up.front(), "o", key);
  if (owners.empty()) return std::nullopt;
  return c.known_admitted(static_cast<size_t>(owners.front() - 1), "o", key);
}

std::map<std::string, uint64_t> owner_counts(LocalCluster& c,
                                             const std::vector<std::string>& keys) {
  std::map<std::string, uint64_t> out;
  for (const std::string& k : keys) {
    // A count is read once the ring has settled on an owner that answers.
    std::optional<uint64_t> n;
    wait_until([&] { return (n = owner_count(c, k)).has_value(); }, milliseconds(5000));
    out[k] = n.value_or(UINT64_MAX);
  }
  return out;
}

std::string text(const std::map<std::string, uint64_t>& counts) {
  std::string out;
  for (const auto& [k, n] : counts)
    out += k + "=" + std::to_string(n) + " ";
  return out;
}

// The value of `sample` (a whole sample name with its labels) in node i's /metrics; -1 if absent.
double metric(LocalCluster& c, size_t i, const std::string& sample) {
  std::istringstream in(c.get(i, "/metrics").body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
  }
  return -1;
}

}  // namespace

TEST_CASE(
    "a 3-node cluster of the previous release upgraded one node at a time under owner traffic "
    "fails no check, admits at most the limit in every window and loses no count") {
  const PreviousRelease prev = previous_release();
  REQUIRE_MESSAGE(!prev.commit.empty(),
                  "CHANGELOG.md names no commit for the release before " << sluice::kThisVersion);
  const auto [has, unused] =
      shell("git -C '" SLUICE_SOURCE_DIR "' cat-file -e " + prev.commit + "^{commit} 2>/dev/null");
  REQUIRE_MESSAGE(has == 0, "this clone lacks commit " << prev.commit << " (release "
                                                       << prev.version
                                                       << "): a shallow clone? git fetch "
                                                          "--unshallow");

  const auto build_started = SteadyClock::now();
  const auto [built, out] =
      shell("'" SLUICE_SOURCE_DIR "/tests/upgrade/build_release.sh' " + prev.commit);
  const double build_s = std::chrono::duration<double>(SteadyClock::now() - build_started).count();
  REQUIRE_MESSAGE(built == 0, "building release " << prev.version << " failed");
  std::string old_bin = out;
  while (!old_bin.empty() && old_bin.back() == '\n')
    old_bin.pop_back();
  old_bin = old_bin.substr(old_bin.rfind('\n') + 1);
  MESSAGE("release " << prev.version << " (commit " << prev.commit << "): " << old_bin << ", "
                     << build_s << " s to build or find");

  // This build says which release it is; the previous one is older than `--version`.
  CHECK(shell("'" SLUICED_BIN "' --version").second ==
        "sluiced " + std::string(sluice::kThisVersion) + "\n");

  // Nodes on the previous release get the settings it knows: it refuses `resp` (the RESP door
  // came after it).
  std::set<size_t> upgraded;
  ClusterSpec spec;
  spec.sluiced_bin = old_bin;
  spec.nodes = 3;
  spec.rules_yaml = two_mode_rules(kLimit);
  spec.extra_config = {"snapshot_interval_ms: 200"};
  spec.rewrite_config = [&upgraded](size_t i, std::string config) {
    if (upgraded.count(i)) return config;
    std::istringstream in(config);
    std::string line, kept;
    while (std::getline(in, line)) {
      if (line.rfind("resp:", 0) != 0) kept += line + "\n";
    }
    return kept;
  };
  LocalCluster c(spec);
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);

  // Keys counted once before the upgrade and never again: their counts must survive every
  // restart exactly.
  const std::vector<std::string> marks = {"mark-a", "mark-b", "mark-c",
                                          "mark-d", "mark-e", "mark-f"};
  constexpr int kMarkChecks = 20;
  {
    sluice::ClientOptions co;
    co.nodes = {"127.0.0.1:" + std::to_string(c.node(0).check_port)};
    co.fail_mode = sluice::FailMode::kClosed;
    std::string err;
    auto client = sluice::Client::create(co, &err);
    REQUIRE_MESSAGE(client, err);
    for (const std::string& k : marks) {
      const sluice::Entry e[] = {{"k", k}};
      for (int n = 0; n < kMarkChecks; ++n)
        REQUIRE(client->check("o", e).allowed);
    }
  }
  std::map<std::string, uint64_t> want;
  for (const std::string& k : marks)
    want[k] = kMarkChecks;
  CHECK_MESSAGE(owner_counts(c, marks) == want, text(owner_counts(c, marks)));

  // Owner-mode traffic over every node, over the limit (half is denied).
  LoadOptions lo;
  lo.domain = "o";
  lo.keys = {"up-a", "up-b", "up-c", "up-d"};
  lo.rate_per_s = 4 * 2.0 * static_cast<double>(kLimit);
  lo.duration = milliseconds(24000);
  lo.failover = true;
  LoadDriver load(lo, c.check_ports());
  REQUIRE(load.start({0, 1, 2}).empty());
  std::this_thread::sleep_for(milliseconds(3000));

  std::string timeline;
  for (size_t i = 0; i < c.size(); ++i) {
    CAPTURE(i);
    const auto before = owner_counts(c, marks);
    const int64_t stop_us = load.now_us();
    const int status = c.terminate(i);  // SIGTERM: leave, hand off, snapshot, exit
    CHECK_MESSAGE(status != -1, "node " << i + 1 << " did not stop: " << c.log_tail(i));
    const int64_t stopped_us = load.now_us();
    upgraded.insert(i);
    c.set_binary(i, SLUICED_BIN);
    const std::string restarted = c.start_node(i);
    REQUIRE_MESSAGE(restarted.empty(), restarted);
    const bool ready = wait_until([&] { return c.get(i, "/readyz").status == 200; },
                                  milliseconds(30000), milliseconds(50));
    const int64_t ready_us = load.now_us();
    REQUIRE_MESSAGE(ready, "node " << i + 1 << " never ready: " << c.log_tail(i));
    const bool converged = c.wait_all_alive(milliseconds(15000));
    CHECK_MESSAGE(converged, "after upgrading node " << i + 1 << ":" << c.describe());
    const auto after = owner_counts(c, marks);
    CHECK_MESSAGE(after == before, "node " << i + 1 << ": counts before " << text(before)
                                           << ", after " << text(after));
    CHECK(metric(c, i,
                 "sluice_build_info{version=\"" + std::string(sluice::kThisVersion) + "\"}") == 1);
    timeline += "node " + std::to_string(i + 1) + ": SIGTERM at " + std::to_string(stop_us / 1000) +
                " ms, exited at " + std::to_string(stopped_us / 1000) + " ms, " +
                std::string(sluice::kThisVersion) + " ready at " + std::to_string(ready_us / 1000) +
                " ms, counts before " + text(before) + "after " + text(after) + "; ";
    std::this_thread::sleep_for(milliseconds(1500));
  }
  MESSAGE(timeline);
  CHECK_MESSAGE(load.now_us() < static_cast<int64_t>(lo.duration.count()) * 1000 - 3'000'000,
                "the upgrade outlasted the traffic: lengthen it");

  REQUIRE(load.wait());
  const auto records = load.records();
  const LoadSummary s = summarize(records);
  MESSAGE("traffic: sent " << s.sent << ", allowed " << s.allowed << ", denied " << s.denied
                           << ", failed " << s.failed << ", client retries " << load.retries());
  CHECK(s.failed == 0);
  std::this_thread::sleep_for(milliseconds(500));  // the last forwarded checks reach their owner
  for (size_t k = 0; k < lo.keys.size(); ++k) {
    CAPTURE(lo.keys[k]);
    const double over = admitted_over_limit(records, static_cast<int>(k), kWindowUs, kLimit);
    size_t allowed = 0;
    for (const CheckRecord& r : records) {
      if (r.key == k && r.outcome == CheckOutcome::kAllowed) ++allowed;
    }
    const auto counted = owner_count(c, lo.keys[k]);
    MESSAGE("key " << lo.keys[k] << ": max admitted in a true 1 s window " << over
                   << " x the limit; allowed by the generator's count " << allowed
                   << ", counted by its owner " << counted.value_or(0));
    CHECK(over <= 1.0);
    REQUIRE(counted.has_value());
    // Every admitted check is counted (a check retried after a lost answer may count twice).
    CHECK(*counted >= allowed);
    CHECK(*counted <= allowed + load.retries());
  }
  CHECK_MESSAGE(owner_counts(c, marks) == want, text(owner_counts(c, marks)));
  for (size_t i = 0; i < c.size(); ++i) {
    CHECK(metric(c, i, "sluice_peer_dropped_total{reason=\"release_outside_window\"}") == 0);
  }
}
