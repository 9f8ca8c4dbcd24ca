// libFuzzer target for the daemon's config file (lib/node/config.cc, load_node_config): YAML an
// operator writes, read at start and by `sluiced --check`.
//
// Properties beyond "no crash, no sanitizer report": the answer is "" or errors that each name
// the file; a config that loads is loaded the same way twice (nothing depends on what the
// NodeOptions held before for fields the file sets).
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <span>
#include <sstream>
#include <string>

#include "fuzz_util.h"
#include "node/node.h"

namespace {

const std::string& path() {
  static const std::string p =
      "/dev/shm/sluice-config-fuzz-" + std::to_string(::getpid()) + ".yaml";
  return p;
}

void fuzz_config(std::span<const uint8_t> in) {
  {
    std::ofstream f(path(), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(in.data()), static_cast<std::streamsize>(in.size()));
  }
  sluice::node::NodeOptions a;
  const std::string err = sluice::node::load_node_config(path(), a).message();
  if (!err.empty()) {
    std::istringstream lines(err);
    for (std::string line; std::getline(lines, line);)
      FUZZ_REQUIRE(line.rfind(path(), 0) == 0);
    return;
  }
  sluice::node::NodeOptions b;
  FUZZ_REQUIRE(sluice::node::load_node_config(path(), b).ok());
  FUZZ_REQUIRE(a.udp_listen == b.udp_listen && a.grpc_listen == b.grpc_listen &&
               a.threads == b.threads && a.cluster.enabled == b.cluster.enabled &&
               a.cluster.seeds == b.cluster.seeds && a.rules_file == b.rules_file);
}

void write_seeds(const std::string& dir) {
  sluice::fuzz::write_seed(dir, "config-seed-single", R"(udp: 127.0.0.1:7350
tcp: 127.0.0.1:7350
admin: 127.0.0.1:7351
grpc: 127.0.0.1:8081
grpc_rate_limit_headers: true
threads: 2
rules: /etc/sluice/rules.yaml
envoy_rules: /etc/ratelimit/config
data_dir: /var/lib/sluice
snapshot_interval_ms: 1000
memory_cap_mb: 256
log_level: info
)");
  sluice::fuzz::write_seed(dir, "config-seed-cluster", R"(udp: 10.0.0.1:7350
threads: 4
cluster:
  node_id: 3
  name: node-3
  listen: 10.0.0.1:7352
  seeds: [10.0.0.2:7352, "node-4.local:7352"]
  secret: "0123456789abcdef0123456789abcdef"
  replicas: 2
  sync_interval_ms: 100
  forward_timeout_ms: 8
)");
}

}  // namespace

SLUICE_FUZZ_TARGET(fuzz_config, write_seeds)
