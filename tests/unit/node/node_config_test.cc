// Unit tests of the node config loader (lib/node/config.cc, docs/operations.md "Config file"):
// every field it accepts, top level and `cluster:`, lands in NodeOptions; every error it can
// produce names the file, the line and the field with the loader's exact wording; fields not given
// keep the value the caller had in `out`.
#include "node/node.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "node_config_files.h"

using namespace sluice::testing::node_config;
using sluice::node::load_node_config;
using sluice::node::NodeOptions;

// ---- fields ----------------------------------------------------------------------------------

TEST_CASE("an empty config file, or one of comments only, keeps every value of out") {
  Loader l;
  for (const char* text : {"", "# nothing to see\n\n# here\n"}) {
    CAPTURE(text);
    NodeOptions out = non_default_options();
    CHECK(l.load(text, out) == "");
    check_same(out, non_default_options());
    NodeOptions defaults;
    CHECK(l.load(text, defaults) == "");
    check_same(defaults, NodeOptions{});
  }
}

TEST_CASE("envoy_rules and envoy_count_denied are read, empty or mistyped ones are errors") {
  Loader l;
  NodeOptions out;
  CHECK(l.load("envoy_rules: /etc/ratelimit/config\nenvoy_count_denied: false\n", out) == "");
  CHECK(out.envoy_rules == "/etc/ratelimit/config");
  CHECK_FALSE(out.envoy_count_denied);
  CHECK(NodeOptions{}.envoy_rules.empty());
  CHECK(NodeOptions{}.envoy_count_denied);  // upstream counts denied hits

  NodeOptions kept = non_default_options();
  const std::string err = l.load("envoy_rules: \"\"\nenvoy_count_denied: maybe\n", kept);
  CHECK(lines_of(err) ==
        std::vector<std::string>{
            l.at(1, "envoy_rules", "must not be empty (leave envoy_rules out for none)"),
            l.at(2, "envoy_count_denied", "has the wrong type")});
  check_same(kept, non_default_options());
}

TEST_CASE("every top-level field is read into NodeOptions") {
  Loader l;
  NodeOptions out;
  const std::string err = l.load(R"(udp: 0.0.0.0:9350
tcp: "[::1]:9351"
admin: 0.0.0.0:9352
grpc: 0.0.0.0:9353
grpc_rate_limit_headers: true
resp: 0.0.0.0:9354
resp_domain: cells
threads: 12
rules: /etc/sluice/rules.yaml
data_dir: /var/lib/sluice
init_data: true
snapshot_interval_ms: 2500
memory_cap_mb: 64
hash_seed: 12345678901234567890
sweep_interval_ms: 750
max_connections: 300
client_timeout_ms: 2500
udp_busy_poll_us: 50
log_level: debug
)",
                                 out);
  CHECK(err == "");
  CHECK(out.udp_listen == "0.0.0.0:9350");
  CHECK(out.tcp_listen == "[::1]:9351");
  CHECK(out.admin_listen == "0.0.0.0:9352");
  CHECK(out.grpc_listen == "0.0.0.0:9353");
  CHECK(out.grpc_rate_limit_headers);
  CHECK(out.resp_listen == "0.0.0.0:9354");
  CHECK(out.resp_domain == "cells");
  CHECK(out.threads == 12);
  CHECK(out.rules_file == "/etc/sluice/rules.yaml");
  CHECK(out.data_dir == "/var/lib/sluice");
  CHECK(out.init_data);
  CHECK(out.snapshot_interval_ms == 2'500);
  CHECK(out.memory_cap_bytes == 64ull << 20);
  CHECK(out.hash_seed == 12'345'678'901'234'567'890ull);
  CHECK(out.sweep_interval_ms == 750);
  CHECK(out.max_connections == 300);
  CHECK(out.client_timeout_ms == 2'500);
  CHECK(out.udp_busy_poll_us == 50);
  CHECK(out.log_level == "debug");
  // No cluster section: still a node on its own.
  CHECK_FALSE(out.cluster.enabled);
  // Not a config field: untouched.
  CHECK(out.max_tcp_pending_bytes == NodeOptions{}.max_tcp_pending_bytes);
}

TEST_CASE("init_data false and an empty data_dir are read as given") {
  Loader l;
  NodeOptions out = non_default_options();
  REQUIRE(out.init_data);
  CHECK(l.load("init_data: false\ndata_dir: \"\"\n", out) == "");
  CHECK_FALSE(out.init_data);
  CHECK(out.data_dir == "");
}

TEST_CASE("a listener given as null or as an empty string is disabled") {
  Loader l;
  NodeOptions out;
  CHECK(l.load("udp:\ntcp: ~\nadmin: null\ngrpc:\nresp:\n", out) == "");
  CHECK(out.resp_listen == "");
  CHECK(out.udp_listen == "");
  CHECK(out.tcp_listen == "");
  CHECK(out.admin_listen == "");
  CHECK(out.grpc_listen == "");

  NodeOptions quoted;
  CHECK(l.load("udp: \"\"\ntcp: ''\nadmin: \"\"\ngrpc: \"\"\n", quoted) == "");
  CHECK(quoted.udp_listen == "");
  CHECK(quoted.tcp_listen == "");
  CHECK(quoted.admin_listen == "");
  CHECK(quoted.grpc_listen == "");
}

TEST_CASE("log_level accepts each documented level") {
  Loader l;
  for (const char* level : {"trace", "debug", "info", "warn", "error", "off"}) {
    CAPTURE(level);
    NodeOptions out = non_default_options();
    CHECK(l.load(std::string("log_level: ") + level + "\n", out) == "");
    CHECK(out.log_level == level);
  }
}

TEST_CASE("the bounds of the ranged top-level fields are inclusive") {
  Loader l;
  NodeOptions out;
  CHECK(l.load("threads: 1\nsnapshot_interval_ms: 10\nmemory_cap_mb: 1\nsweep_interval_ms: 10\n"
               "max_connections: 1\nclient_timeout_ms: 100\nudp_busy_poll_us: 0\n",
               out) == "");
  CHECK(out.udp_busy_poll_us == 0);
  CHECK(out.max_connections == 1);
  CHECK(out.client_timeout_ms == 100);
  CHECK(out.threads == 1);
  CHECK(out.snapshot_interval_ms == 10);
  CHECK(out.memory_cap_bytes == 1ull << 20);
  CHECK(out.sweep_interval_ms == 10);

  CHECK(l.load("threads: 256\nsnapshot_interval_ms: 3600000\nmemory_cap_mb: 16777216\n"
               "sweep_interval_ms: 86400000\nhash_seed: 18446744073709551615\n"
               "max_connections: 1000000\nclient_timeout_ms: 3600000\nudp_busy_poll_us: 10000\n",
               out) == "");
  CHECK(out.udp_busy_poll_us == 10'000);
  CHECK(out.max_connections == 1'000'000);
  CHECK(out.client_timeout_ms == 3'600'000);
  CHECK(out.threads == 256);
  CHECK(out.snapshot_interval_ms == 3'600'000);
  CHECK(out.memory_cap_bytes == 1ull << 44);   // 16 TiB: the MiB count shifted, no overflow
  CHECK(out.sweep_interval_ms == 86'400'000);  // no upper bound
  CHECK(out.hash_seed == UINT64_MAX);
  CHECK(l.load("hash_seed: 0\n", out) == "");
  CHECK(out.hash_seed == 0);
}

TEST_CASE("fields not given keep their value in out") {
  Loader l;
  NodeOptions out = non_default_options();
  CHECK(l.load("threads: 3\n", out) == "");
  NodeOptions expected = non_default_options();
  expected.threads = 3;
  check_same(out, expected);

  // A cluster section sets only what it names (and enables clustering); the required fields
  // may come from what out already held.
  NodeOptions clustered = non_default_options();
  CHECK(l.load("cluster:\n  name: node-z\n", clustered) == "");
  expected = non_default_options();
  expected.cluster.enabled = true;
  expected.cluster.name = "node-z";
  check_same(clustered, expected);
}

TEST_CASE("every cluster field is read, and a cluster section enables clustering") {
  Loader l;
  NodeOptions out;
  const std::string err = l.load(R"(threads: 4
cluster:
  node_id: 65535
  name: node-b
  listen: 10.0.0.12:7352
  advertise: 10.0.0.12
  seeds: [10.0.0.11:7352, sluice-peers.internal:7352]
  secret: "0123456789abcdef"
  replicas: 3
  sync_interval_ms: 20
  anti_entropy_interval_ms: 600000
  probe_interval_ms: 1
  forward_timeout_ms: 75
  forget_dead_after_ms: 0
)",
                                 out);
  CHECK(err == "");
  CHECK(out.threads == 4);
  CHECK(out.cluster.enabled);
  CHECK(out.cluster.node_id == 65535);
  CHECK(out.cluster.name == "node-b");
  CHECK(out.cluster.listen == "10.0.0.12:7352");
  CHECK(out.cluster.advertise == "10.0.0.12");
  CHECK(out.cluster.seeds ==
        std::vector<std::string>{"10.0.0.11:7352", "sluice-peers.internal:7352"});
  CHECK(out.cluster.secret == "0123456789abcdef");  // exactly 16 bytes is enough
  CHECK(out.cluster.replicas == 3);
  CHECK(out.cluster.sync_interval_ms == 20);
  CHECK(out.cluster.anti_entropy_interval_ms == 600'000);
  CHECK(out.cluster.probe_interval_ms == 1);
  CHECK(out.cluster.forward_timeout_ms == 75);
  CHECK(out.cluster.forget_dead_after_ms == 0);
}

TEST_CASE("the cluster's ranged fields accept their inclusive bounds, seeds may be empty") {
  Loader l;
  NodeOptions out;
  CHECK(l.load(R"(cluster: {node_id: 1, listen: "127.0.0.1:7352", secret: 0123456789abcdef0,
  replicas: 1, sync_interval_ms: 1, anti_entropy_interval_ms: 1, probe_interval_ms: 600000,
  forward_timeout_ms: 600000, forget_dead_after_ms: 86400000, seeds: []}
)",
               out) == "");
  CHECK(out.cluster.forget_dead_after_ms == 86'400'000);
  CHECK(out.cluster.enabled);
  CHECK(out.cluster.node_id == 1);
  CHECK(out.cluster.replicas == 1);
  CHECK(out.cluster.sync_interval_ms == 1);
  CHECK(out.cluster.anti_entropy_interval_ms == 1);
  CHECK(out.cluster.probe_interval_ms == 600'000);
  CHECK(out.cluster.forward_timeout_ms == 600'000);
  CHECK(out.cluster.seeds.empty());
  CHECK(out.cluster.secret == "0123456789abcdef0");

  CHECK(l.load("cluster: {node_id: 2, listen: a:1, secret: 0123456789abcdef, replicas: 8}\n",
               out) == "");
  CHECK(out.cluster.replicas == 8);
  CHECK(out.cluster.node_id == 2);
}

TEST_CASE("secret_file reads the secret and strips trailing newlines, carriage returns, spaces") {
  Loader l;
  const std::string secret_file =
      l.dir.write("cluster.secret", " shared secret of the cluster \r\n \n\n");
  NodeOptions out;
  CHECK(l.load("cluster:\n  node_id: 4\n  listen: 127.0.0.1:7352\n  secret_file: " + secret_file +
                   "\n",
               out) == "");
  CHECK(out.cluster.enabled);
  // Leading and inner spaces are part of the secret; only the trailing run is stripped.
  CHECK(out.cluster.secret == " shared secret of the cluster");

  // secret_file replaces a secret given before it in the same section.
  NodeOptions both;
  CHECK(l.load("cluster:\n  node_id: 4\n  listen: 127.0.0.1:7352\n  secret: "
               "aaaaaaaaaaaaaaaaaaaaaa\n  secret_file: " +
                   secret_file + "\n",
               both) == "");
  CHECK(both.cluster.secret == " shared secret of the cluster");
}

// ---- errors ----------------------------------------------------------------------------------

TEST_CASE("a config file that cannot be read is one error naming the file, and out is kept") {
  TempDir dir;
  const std::string missing = (fs::path(dir.path) / "no-such.yaml").string();
  NodeOptions out = non_default_options();
  const sluice::Status err = load_node_config(missing, out);
  CHECK(err.code() == sluice::StatusCode::io_error);
  CHECK(err.message() == missing + ": cannot read the config file: no such file or directory");
  check_same(out, non_default_options());
}

TEST_CASE("a YAML syntax error names the file and the line where the parser stopped") {
  Loader l;
  NodeOptions out = non_default_options();
  // An unterminated flow sequence: the parser stops at the next key, line 3.
  std::string err = l.load("threads: 3\nudp: [127.0.0.1:7350\ntcp: 127.0.0.1:7351\n", out);
  CHECK(err == l.file + ":3: end of sequence flow not found");
  check_same(out, non_default_options());  // nothing applied from a file that does not parse

  // A key indented less than its siblings ends the cluster map early: line 4.
  err = l.load("threads: 3\ncluster:\n  node_id: 1\n listen: 127.0.0.1:7352\n", out);
  CHECK(err == l.file + ":4: end of map not found");
  // A tab used for indentation, line 2.
  err = l.load("threads: 3\n\tudp: 127.0.0.1:1\n", out);
  CHECK(err == l.file + ":2: illegal tab when looking for indentation");
  // A map value where a scalar was started, line 2.
  err = l.load("threads: 3\nudp: a: b\n", out);
  CHECK(err == l.file + ":2: illegal map value");
  // An alias to an anchor that does not exist, line 2.
  err = l.load("threads: &t 3\nsweep_interval_ms: *s\n", out);
  CHECK(err == l.file + ":2: the referenced anchor is not defined");
  check_same(out, non_default_options());
}

TEST_CASE("a config that is not a map of settings is an error naming the file") {
  Loader l;
  for (const char* text : {"- udp\n- tcp\n", "just a scalar\n", "[1, 2]\n"}) {
    CAPTURE(text);
    NodeOptions out = non_default_options();
    const std::string err = l.load(text, out);
    CHECK(err == l.file + ": the config must be a map of settings");
    check_same(out, non_default_options());
  }
}

TEST_CASE("an unknown top-level field names its line and lists the accepted fields") {
  Loader l;
  NodeOptions out = non_default_options();
  const std::string err =
      l.load("threads: 5\n\n# a typo below\nthread: 4\nlog_level: error\n", out);
  CHECK(err == l.at(4, "thread", kTopLevelFields));
  // The other fields of the file are still applied.
  CHECK(out.threads == 5);
  CHECK(out.log_level == "error");
}

TEST_CASE("every top-level field of the wrong type is an error naming its line and field") {
  Loader l;
  NodeOptions out = non_default_options();
  const std::string err = l.load(R"(udp: [127.0.0.1:1]
tcp: {address: 127.0.0.1}
admin: [a, b]
threads: many
rules: [rules.yaml]
data_dir: {path: /data}
init_data: maybe
snapshot_interval_ms: 1.5
memory_cap_mb: -5
hash_seed: -1
sweep_interval_ms: soon
log_level: [info]
cluster_padding_line_is_not_a_field_either: 1
grpc: [a]
grpc_rate_limit_headers: often
udp_busy_poll_us: briefly
)",
                                 out);
  CAPTURE(err);
  const std::vector<std::string> expected = {
      l.at(1, "udp", "has the wrong type"),
      l.at(2, "tcp", "has the wrong type"),
      l.at(3, "admin", "has the wrong type"),
      l.at(4, "threads", "has the wrong type"),
      l.at(5, "rules", "has the wrong type"),
      l.at(6, "data_dir", "has the wrong type"),
      l.at(7, "init_data", "has the wrong type"),
      l.at(8, "snapshot_interval_ms", "has the wrong type"),
      // A negative count for an unsigned field is a wrong type, not a range error.
      l.at(9, "memory_cap_mb", "has the wrong type"),
      l.at(10, "hash_seed", "has the wrong type"),
      l.at(11, "sweep_interval_ms", "has the wrong type"),
      l.at(12, "log_level", "has the wrong type"),
      l.at(13, "cluster_padding_line_is_not_a_field_either", kTopLevelFields),
      l.at(14, "grpc", "has the wrong type"),
      l.at(15, "grpc_rate_limit_headers", "has the wrong type"),
      l.at(16, "udp_busy_poll_us", "has the wrong type"),
  };
  for (const auto& e : expected)
    CHECK_MESSAGE(contains(err, e), e);
  // One line per error, in file order, no trailing newline.
  CHECK(lines_of(err) == expected);
  // Nothing of a wrong type was applied.
  check_same(out, non_default_options());
}

TEST_CASE("numbers that overflow or are not integers are the wrong type") {
  Loader l;
  NodeOptions out = non_default_options();
  const std::string err = l.load(R"(threads: 4294967297
snapshot_interval_ms: 99999999999999999999
memory_cap_mb: 18446744073709551616
hash_seed: 1e3
sweep_interval_ms: ""
threads: 2.0
)",
                                 out);
  CHECK(lines_of(err) == std::vector<std::string>{
                             l.at(1, "threads", "has the wrong type"),
                             l.at(2, "snapshot_interval_ms", "has the wrong type"),
                             l.at(3, "memory_cap_mb", "has the wrong type"),
                             l.at(4, "hash_seed", "has the wrong type"),
                             l.at(5, "sweep_interval_ms", "has the wrong type"),
                             l.at(6, "threads", "has the wrong type"),
                         });
  check_same(out, non_default_options());
}

TEST_CASE(
    "out-of-range top-level values name the field and the accepted range, and change nothing") {
  struct Case {
    const char* text;
    const char* field;
    const char* why;
  };
  const Case cases[] = {
      {"threads: 0", "threads", "must be between 1 and 256"},
      {"threads: 257", "threads", "must be between 1 and 256"},
      {"threads: -1", "threads", "must be between 1 and 256"},
      {"snapshot_interval_ms: 9", "snapshot_interval_ms", "must be between 10 and 3600000"},
      {"snapshot_interval_ms: 3600001", "snapshot_interval_ms", "must be between 10 and 3600000"},
      {"memory_cap_mb: 0", "memory_cap_mb", "must be between 1 and 16777216 (MiB)"},
      {"memory_cap_mb: 16777217", "memory_cap_mb", "must be between 1 and 16777216 (MiB)"},
      {"sweep_interval_ms: 9", "sweep_interval_ms", "must be at least 10"},
      {"sweep_interval_ms: -1000", "sweep_interval_ms", "must be at least 10"},
      {"max_connections: 0", "max_connections", "must be between 1 and 1000000"},
      {"max_connections: 1000001", "max_connections", "must be between 1 and 1000000"},
      {"client_timeout_ms: 99", "client_timeout_ms", "must be between 100 and 3600000"},
      {"udp_busy_poll_us: -1", "udp_busy_poll_us", "must be between 0 and 10000"},
      {"udp_busy_poll_us: 10001", "udp_busy_poll_us", "must be between 0 and 10000"},
      {"client_timeout_ms: 3600001", "client_timeout_ms", "must be between 100 and 3600000"},
      {"log_level: verbose", "log_level", "must be one of trace, debug, info, warn, error, off"},
      {"log_level: INFO", "log_level", "must be one of trace, debug, info, warn, error, off"},
  };
  Loader l;
  for (const Case& c : cases) {
    CAPTURE(c.text);
    NodeOptions out = non_default_options();
    // The field on line 3, after a valid field and a blank line.
    const std::string err = l.load(std::string("udp: 127.0.0.1:1\n\n") + c.text + "\n", out);
    CHECK(err == l.at(3, c.field, c.why));
    NodeOptions expected = non_default_options();
    expected.udp_listen = "127.0.0.1:1";
    check_same(out, expected);
  }
}

TEST_CASE("every error of a file is reported, one per line in file order") {
  Loader l;
  NodeOptions out;
  const std::string err = l.load(R"(threads: 0
udp: 127.0.0.1:1
bogus: 1
log_level: loud
cluster:
  node_id: 70000
  listen: 127.0.0.1:7352
  secret: short
  replicas: 9
)",
                                 out);
  CHECK(lines_of(err) ==
        std::vector<std::string>{
            l.at(1, "threads", "must be between 1 and 256"),
            l.at(3, "bogus", kTopLevelFields),
            l.at(4, "log_level", "must be one of trace, debug, info, warn, error, off"),
            l.at(6, "cluster.node_id", "must be between 1 and 65535"),
            l.at(9, "cluster.replicas", "must be between 1 and 8"),
            l.at(5, "cluster.node_id", kNodeIdRequired),
            l.at(5, "cluster.secret", kSecretRequired),
        });
  CHECK(out.udp_listen == "127.0.0.1:1");  // valid fields are applied even when others fail
}

TEST_CASE("a cluster section that is not a map is an error naming its line") {
  Loader l;
  struct Case {
    const char* text;
    int line;
  };
  for (const Case& c :
       {Case{"threads: 2\ncluster: 5\n", 2}, Case{"threads: 2\ncluster: [a, b]\n", 2},
        Case{"threads: 2\ncluster: yes\n", 2}}) {
    CAPTURE(c.text);
    NodeOptions out = non_default_options();
    const std::string err = l.load(c.text, out);
    CHECK(err == l.at(c.line, "cluster", "must be a map of settings"));
    CHECK_FALSE(out.cluster.enabled);  // not enabled by a section that is not one
    CHECK(out.threads == 2);
  }
}

TEST_CASE("an unknown cluster setting names its line and lists the accepted settings") {
  Loader l;
  NodeOptions out;
  const std::string err = l.load(R"(cluster:
  node_id: 3
  listen: 127.0.0.1:7352
  secret: 0123456789abcdef
  node-id: 4
  replicas: 2
)",
                                 out);
  CHECK(err == l.at(5, "cluster.node-id", kClusterFields));
  CHECK(out.cluster.node_id == 3);
  CHECK(out.cluster.replicas == 2);
}

TEST_CASE("every cluster field of the wrong type is an error naming its line and field") {
  Loader l;
  NodeOptions out = non_default_options();
  out.cluster.node_id = 0;  // so that the required checks fire too
  out.cluster.listen.clear();
  out.cluster.secret.clear();
  const std::string err = l.load(R"(cluster:
  node_id: first
  name: [a]
  listen: {host: 127.0.0.1}
  advertise: [10.0.0.1]
  seeds: 10.0.0.11:7352
  secret: [s]
  secret_file: {path: /etc/secret}
  replicas: two
  sync_interval_ms: 1.5
  anti_entropy_interval_ms: fast
  probe_interval_ms: [1000]
  forward_timeout_ms: {ms: 50}
  node_id: 99999999999999999999
)",
                                 out);
  CAPTURE(err);
  const std::vector<std::string> expected = {
      l.at(2, "cluster.node_id", "has the wrong type"),
      l.at(3, "cluster.name", "has the wrong type"),
      l.at(4, "cluster.listen", "has the wrong type"),
      l.at(5, "cluster.advertise", "has the wrong type"),
      l.at(6, "cluster.seeds", "has the wrong type"),  // a list, not one address
      l.at(7, "cluster.secret", "has the wrong type"),
      l.at(8, "cluster.secret_file", "has the wrong type"),
      l.at(9, "cluster.replicas", "has the wrong type"),
      l.at(10, "cluster.sync_interval_ms", "has the wrong type"),
      l.at(11, "cluster.anti_entropy_interval_ms", "has the wrong type"),
      l.at(12, "cluster.probe_interval_ms", "has the wrong type"),
      l.at(13, "cluster.forward_timeout_ms", "has the wrong type"),
      l.at(14, "cluster.node_id", "has the wrong type"),
      l.at(1, "cluster.node_id", kNodeIdRequired),
      l.at(1, "cluster.listen", kListenRequired),
      l.at(1, "cluster.secret", kSecretRequired),
  };
  for (const auto& e : expected)
    CHECK_MESSAGE(contains(err, e), e);
  CHECK(lines_of(err) == expected);
  // Nothing of a wrong type was applied.
  NodeOptions kept = non_default_options();
  CHECK(out.cluster.name == kept.cluster.name);
  CHECK(out.cluster.advertise == kept.cluster.advertise);
  CHECK(out.cluster.seeds == kept.cluster.seeds);
  CHECK(out.cluster.replicas == kept.cluster.replicas);
  CHECK(out.cluster.sync_interval_ms == kept.cluster.sync_interval_ms);
  CHECK(out.cluster.anti_entropy_interval_ms == kept.cluster.anti_entropy_interval_ms);
  CHECK(out.cluster.probe_interval_ms == kept.cluster.probe_interval_ms);
  CHECK(out.cluster.forward_timeout_ms == kept.cluster.forward_timeout_ms);
}

TEST_CASE("out-of-range cluster values name the field and the accepted range") {
  struct Case {
    const char* line;
    const char* field;
    const char* why;
  };
  const Case cases[] = {
      {"node_id: 65536", "cluster.node_id", "must be between 1 and 65535"},
      {"node_id: -3", "cluster.node_id", "must be between 1 and 65535"},
      {"replicas: 0", "cluster.replicas", "must be between 1 and 8"},
      {"replicas: 9", "cluster.replicas", "must be between 1 and 8"},
      {"sync_interval_ms: 0", "cluster.sync_interval_ms", "must be between 1 and 600000"},
      {"sync_interval_ms: 600001", "cluster.sync_interval_ms", "must be between 1 and 600000"},
      {"anti_entropy_interval_ms: 0", "cluster.anti_entropy_interval_ms",
       "must be between 1 and 600000"},
      {"anti_entropy_interval_ms: 600001", "cluster.anti_entropy_interval_ms",
       "must be between 1 and 600000"},
      {"probe_interval_ms: -1", "cluster.probe_interval_ms", "must be between 1 and 600000"},
      {"probe_interval_ms: 600001", "cluster.probe_interval_ms", "must be between 1 and 600000"},
      {"forward_timeout_ms: 0", "cluster.forward_timeout_ms", "must be between 1 and 600000"},
      {"forward_timeout_ms: 600001", "cluster.forward_timeout_ms", "must be between 1 and 600000"},
  };
  Loader l;
  for (const Case& c : cases) {
    CAPTURE(c.line);
    NodeOptions out = non_default_options();
    // Lines 2-4 satisfy the required fields (node_id last, so a bad node_id on line 5 leaves
    // the valid one in place); the field under test is on line 5.
    const std::string err = l.load(std::string("cluster:\n  node_id: 12\n  listen: 127.0.0.1:7352\n"
                                               "  secret: 0123456789abcdef\n  ") +
                                       c.line + "\n",
                                   out);
    CHECK(err == l.at(5, c.field, c.why));
    CHECK(out.cluster.enabled);
    CHECK(out.cluster.node_id == 12);
    const NodeOptions kept = non_default_options();
    CHECK(out.cluster.replicas == kept.cluster.replicas);
    CHECK(out.cluster.sync_interval_ms == kept.cluster.sync_interval_ms);
    CHECK(out.cluster.anti_entropy_interval_ms == kept.cluster.anti_entropy_interval_ms);
    CHECK(out.cluster.probe_interval_ms == kept.cluster.probe_interval_ms);
    CHECK(out.cluster.forward_timeout_ms == kept.cluster.forward_timeout_ms);
  }
}

TEST_CASE("node_id 0 is out of range and leaves the node without the required id") {
  Loader l;
  NodeOptions out;
  const std::string err = l.load(
      "threads: 2\ncluster:\n  listen: 127.0.0.1:7352\n  node_id: 0\n  secret: 0123456789abcdef\n",
      out);
  CHECK(lines_of(err) == std::vector<std::string>{
                             l.at(4, "cluster.node_id", "must be between 1 and 65535"),
                             l.at(2, "cluster.node_id", kNodeIdRequired),
                         });
}

TEST_CASE("a cluster section missing node_id, listen and secret names each at the section's line") {
  Loader l;
  NodeOptions out;
  // The section's line is the line of `cluster:` itself, line 2 here (not its first setting's).
  std::string err = l.load("threads: 2\ncluster:\n  name: lonely\n", out);
  CHECK(lines_of(err) == std::vector<std::string>{
                             l.at(2, "cluster.node_id", kNodeIdRequired),
                             l.at(2, "cluster.listen", kListenRequired),
                             l.at(2, "cluster.secret", kSecretRequired),
                         });
  CHECK(out.cluster.enabled);
  CHECK(out.cluster.name == "lonely");

  // Flow style on one line: every required error names that line.
  NodeOptions flow;
  err = l.load("threads: 2\n\ncluster: {}\n", flow);
  CHECK(lines_of(err) == std::vector<std::string>{
                             l.at(3, "cluster.node_id", kNodeIdRequired),
                             l.at(3, "cluster.listen", kListenRequired),
                             l.at(3, "cluster.secret", kSecretRequired),
                         });
}

TEST_CASE("a cluster secret shorter than 16 bytes is refused") {
  Loader l;
  NodeOptions out;
  const std::string err =
      l.load("cluster:\n  node_id: 1\n  listen: 127.0.0.1:7352\n  secret: 0123456789abcde\n", out);
  CHECK(err == l.at(1, "cluster.secret", kSecretRequired));
  CHECK(out.cluster.secret == "0123456789abcde");  // read, then refused as too short
}

TEST_CASE("a secret_file that cannot be read names the setting, its line, the file and why") {
  Loader l;
  const std::string missing = (fs::path(l.dir.path) / "missing.secret").string();
  NodeOptions out;
  const std::string err = l.load(
      "cluster:\n  node_id: 1\n  listen: 127.0.0.1:7352\n  secret_file: " + missing + "\n", out);
  CHECK(contains(err, l.at(4, "cluster.secret_file",
                           "cannot read " + missing + ": no such file or directory")));
  CHECK(lines_of(err) == std::vector<std::string>{
                             l.at(4, "cluster.secret_file",
                                  "cannot read " + missing + ": no such file or directory"),
                             l.at(1, "cluster.secret", kSecretRequired),
                         });

  // A secret given before an unreadable secret_file is kept; only the file's error remains.
  NodeOptions with_secret;
  const std::string err2 = l.load(
      "cluster:\n  node_id: 1\n  listen: 127.0.0.1:7352\n"
      "  secret: 0123456789abcdef\n  secret_file: " +
          missing + "\n",
      with_secret);
  CHECK(err2 ==
        l.at(5, "cluster.secret_file", "cannot read " + missing + ": no such file or directory"));
  CHECK(with_secret.cluster.secret == "0123456789abcdef");
}

// ---- empty values, and the line an error names --------------------------------------------------
