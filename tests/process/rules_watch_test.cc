// sluiced reloads its rules when the file's content changes, without a SIGHUP:
// the rules file laid out as a Kubernetes ConfigMap volume (dir/..<timestamp>/rules.yaml,
// dir/..data -> ..<timestamp>, dir/rules.yaml -> ..data/rules.yaml) and updated the way the
// kubelet does it, by swapping the ..data symlink atomically to a new timestamped directory.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "cluster_process.h"  // wait_until
#include "http_client.h"
#include "metrics_text.h"
#include "sluiced_process.h"

namespace {

namespace fs = std::filesystem;
using namespace sluice::testing;
using std::chrono::milliseconds;

std::string rules_with_limit(int per_minute) {
  return "domains:\n  - name: t\n    rules:\n      - name: per-user\n        key: [user]\n"
         "        limits: [" +
         std::to_string(per_minute) + "/1m]\n";
}

// The kubelet's update: the new content in a directory of its own, then ..data swapped to it by
// a rename over the old link (atomic: a reader sees the old file or the new one).
void configmap_publish(const fs::path& dir, const std::string& stamp, const std::string& text) {
  fs::create_directory(dir / stamp);
  std::ofstream(dir / stamp / "rules.yaml") << text;
  fs::create_directory_symlink(stamp, dir / "..data_tmp");
  fs::rename(dir / "..data_tmp", dir / "..data");
}

// A sample of /metrics, e.g. `sluice_reloads_total{result="ok"}`; -1 when absent or no answer.
int64_t metric(const Daemon& d, const std::string& sample) {
  const HttpReply r = http_request(d.admin, "GET", "/metrics");
  if (r.status != 200) return -1;
  return static_cast<int64_t>(metric_value(r.body, sample).value_or(-1));
}

}  // namespace

TEST_CASE(
    "a ConfigMap-style swap of the rules file is reloaded without SIGHUP, a broken one keeps "
    "the old rules and is counted") {
  DaemonConfig cfg;
  cfg.rules = rules_with_limit(100);
  cfg.extra_config = {"rules_watch_interval_ms: 200"};
  Daemon d(cfg, /*start_now=*/false);
  // Replace the Daemon's plain rules file with the ConfigMap layout at the same path.
  fs::remove(d.rules_file());
  configmap_publish(d.dir, "..2026_11_24_20_00_00.1", rules_with_limit(100));
  fs::create_symlink("..data/rules.yaml", d.rules_file());
  d.start();
  CHECK(d.admitted(5, "before") == 5);

  configmap_publish(d.dir, "..2026_11_24_20_01_00.2", rules_with_limit(2));
  int user = 0;
  const bool lowered =
      wait_until([&] { return d.admitted(3, "after-" + std::to_string(++user)) == 2; },
                 milliseconds(10000), milliseconds(100));
  CHECK_MESSAGE(lowered, "the new limit was not in force within 10 s:\n" << d.log());
  CHECK(metric(d, "sluice_reloads_total{result=\"ok\"}") >= 1);
  CHECK(metric(d, "sluice_reloads_total{result=\"failed\"}") == 0);

  // A broken file (an unknown window unit on line 6): the 2/1m limit stays, the failure counted.
  configmap_publish(d.dir, "..2026_11_24_20_02_00.3",
                    "domains:\n  - name: t\n    rules:\n      - name: per-user\n"
                    "        key: [user]\n        limits: [2/1fortnight]\n");
  CHECK(wait_until([&] { return metric(d, "sluice_reloads_total{result=\"failed\"}") == 1; },
                   milliseconds(10000), milliseconds(100)));
  CHECK(d.admitted(3, "broken") == 2);
  const std::string log = d.log();
  CHECK(log.find("the old rules stay") != std::string::npos);
  CHECK(log.find(d.rules_file().string() + ":6") != std::string::npos);
  // Logged once, not at every look: the content did not change again.
  std::this_thread::sleep_for(milliseconds(600));  // three more looks
  CHECK(metric(d, "sluice_reloads_total{result=\"failed\"}") == 1);
  CHECK(d.running());
}
