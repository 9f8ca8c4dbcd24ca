// Helpers of the node config loader's tests (node_config_test.cc, node_config_values_test.cc):
// a temporary directory, a loader that writes a config file and reads it into NodeOptions, the
// loader's exact error texts, and a NodeOptions whose every field differs from the defaults.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "node/node.h"
#include "temp_dir.h"
#include "text.h"

namespace sluice::testing::node_config {

namespace fs = std::filesystem;
using sluice::node::load_node_config;
using sluice::node::NodeOptions;

// A fresh directory per test case, removed at the end, that writes files.
struct TempDir : sluice::testing::TempDir {
  TempDir() : sluice::testing::TempDir("sluice-node-config") {}

  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = (fs::path(path) / name).string();
    std::ofstream(file, std::ios::binary) << text;
    return file;
  }
};

// Writes `text` as the config file and loads it into `out`; `file` receives the path.
struct Loader {
  TempDir dir;
  std::string file;
  std::string load(const std::string& text, NodeOptions& out) {
    file = dir.write("sluiced.yaml", text);
    return load_node_config(file, out).message();
  }
  // "<file>:<line>: <field>: <why>", the loader's error format.
  std::string at(int line, const std::string& field, const std::string& why) const {
    return file + ":" + std::to_string(line) + ": " + field + ": " + why;
  }
};

inline std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find('\n', start);
    if (end == std::string::npos) {
      out.push_back(s.substr(start));
      break;
    }
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

using sluice::testing::contains;

inline const std::string kTopLevelFields =
    "unknown setting (expected one of: udp, tcp, admin, grpc, grpc_rate_limit_headers, resp, "
    "resp_password_file, resp_domain, threads, "
    "rules, envoy_rules, envoy_count_denied, rules_watch_interval_ms, admin_token_file, "
    "admin_token_reads, data_dir, init_data, "
    "snapshot_interval_ms, memory_cap_mb, hash_seed, sweep_interval_ms, max_connections, "
    "client_timeout_ms, udp_busy_poll_us, log_level, cluster)";
inline const std::string kClusterFields =
    "unknown setting (expected one of: node_id, name, listen, advertise, seeds, seed_refresh_ms, "
    "dns_server, secret, "
    "secret_file, replicas, sync_interval_ms, anti_entropy_interval_ms, probe_interval_ms, "
    "forward_timeout_ms, forget_dead_after_ms)";
inline const std::string kNodeIdRequired = "is required (1..65535, unique per node)";
inline const std::string kListenRequired = "is required (the peer UDP address)";
inline const std::string kSecretRequired =
    "is required: at least 16 bytes shared by every node (or secret_file)";

// A NodeOptions whose every field differs from the defaults and from anything the tests load.
inline NodeOptions non_default_options() {
  NodeOptions o;
  o.udp_listen = "10.9.9.9:1";
  o.tcp_listen = "10.9.9.9:2";
  o.admin_listen = "10.9.9.9:3";
  o.grpc_listen = "10.9.9.9:6";
  o.grpc_rate_limit_headers = true;
  o.resp_listen = "10.9.9.9:7";
  o.resp_password_file = "/preset/resp-password";
  o.resp_password = "preset-password";
  o.resp_domain = "preset-cells";
  o.threads = 7;
  o.rules_file = "/preset/rules.yaml";
  o.envoy_rules = "/preset/envoy";
  o.envoy_count_denied = false;
  o.data_dir = "/preset/data";
  o.init_data = true;
  o.snapshot_interval_ms = 4'321;
  o.log_level = "warn";
  o.memory_cap_bytes = 3ull << 20;
  o.hash_seed = 99;
  o.sweep_interval_ms = 5'432;
  o.max_tcp_pending_bytes = 12'345;
  o.max_connections = 77;
  o.client_timeout_ms = 8'765;
  o.udp_busy_poll_us = 321;
  o.clock = [] { return int64_t{777}; };
  o.cluster.enabled = false;
  o.cluster.node_id = 9;
  o.cluster.name = "preset-name";
  o.cluster.listen = "10.9.9.9:4";
  o.cluster.advertise = "10.9.9.8";
  o.cluster.seeds = {"10.9.9.7:5"};
  o.cluster.secret = "preset-secret-of-32-bytes-......";
  o.cluster.replicas = 5;
  o.cluster.sync_interval_ms = 11;
  o.cluster.anti_entropy_interval_ms = 22;
  o.cluster.probe_interval_ms = 33;
  o.cluster.forward_timeout_ms = 44;
  o.cluster.forget_dead_after_ms = 55;
  return o;
}

// Every field of `a` and `b` (but the clock, compared by what it returns) is equal.
inline void check_same(const NodeOptions& a, const NodeOptions& b) {
  CHECK(a.udp_listen == b.udp_listen);
  CHECK(a.tcp_listen == b.tcp_listen);
  CHECK(a.admin_listen == b.admin_listen);
  CHECK(a.grpc_listen == b.grpc_listen);
  CHECK(a.grpc_rate_limit_headers == b.grpc_rate_limit_headers);
  CHECK(a.resp_listen == b.resp_listen);
  CHECK(a.resp_password_file == b.resp_password_file);
  CHECK(a.resp_password == b.resp_password);
  CHECK(a.resp_domain == b.resp_domain);
  CHECK(a.threads == b.threads);
  CHECK(a.rules_file == b.rules_file);
  CHECK(a.envoy_rules == b.envoy_rules);
  CHECK(a.envoy_count_denied == b.envoy_count_denied);
  CHECK(a.data_dir == b.data_dir);
  CHECK(a.init_data == b.init_data);
  CHECK(a.snapshot_interval_ms == b.snapshot_interval_ms);
  CHECK(a.log_level == b.log_level);
  CHECK(a.memory_cap_bytes == b.memory_cap_bytes);
  CHECK(a.hash_seed == b.hash_seed);
  CHECK(a.sweep_interval_ms == b.sweep_interval_ms);
  CHECK(a.max_tcp_pending_bytes == b.max_tcp_pending_bytes);
  CHECK(a.max_connections == b.max_connections);
  CHECK(a.client_timeout_ms == b.client_timeout_ms);
  CHECK(a.udp_busy_poll_us == b.udp_busy_poll_us);
  CHECK(static_cast<bool>(a.clock) == static_cast<bool>(b.clock));
  if (a.clock && b.clock) CHECK(a.clock() == b.clock());
  CHECK(a.cluster.enabled == b.cluster.enabled);
  CHECK(a.cluster.node_id == b.cluster.node_id);
  CHECK(a.cluster.name == b.cluster.name);
  CHECK(a.cluster.listen == b.cluster.listen);
  CHECK(a.cluster.advertise == b.cluster.advertise);
  CHECK(a.cluster.seeds == b.cluster.seeds);
  CHECK(a.cluster.secret == b.cluster.secret);
  CHECK(a.cluster.replicas == b.cluster.replicas);
  CHECK(a.cluster.sync_interval_ms == b.cluster.sync_interval_ms);
  CHECK(a.cluster.anti_entropy_interval_ms == b.cluster.anti_entropy_interval_ms);
  CHECK(a.cluster.probe_interval_ms == b.cluster.probe_interval_ms);
  CHECK(a.cluster.forward_timeout_ms == b.cluster.forward_timeout_ms);
  CHECK(a.cluster.forget_dead_after_ms == b.cluster.forget_dead_after_ms);
}

}  // namespace sluice::testing::node_config
