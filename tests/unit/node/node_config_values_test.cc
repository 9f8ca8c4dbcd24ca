// Unit tests of the node config loader (lib/node/config.cc), continued from node_config_test.cc:
// settings given with no value, null spellings, empty strings and lists, directories where files
// are expected, and the settings added since (token files, rules watch, DNS seeds).
#include "node/node.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "node_config_files.h"

using namespace sluice::testing::node_config;
using sluice::node::load_node_config;
using sluice::node::NodeOptions;

namespace {

const std::string kEmpty = "must not be empty";
const std::string kEmptyRules =
    "must not be empty (leave rules out for the embedded example rules)";
const std::string kEmptyDataDir = "must not be empty (write \"\" to keep everything in memory)";
const std::string kEmptyCluster = "must not be empty (leave cluster out for a node on its own)";
const std::string kEmptySeeds = "must not be empty (write [] for no seeds)";
const std::string kEmptySeed = "must not contain an empty address";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Every way YAML spells "no value" after a key: nothing, a comment, ~ and null (any case).
const char* const kNullSpellings[] = {"", "   # later", " ~", " null", " Null", " NULL"};

}  // namespace

TEST_CASE("an error names the line of its field, also when the value is left empty") {
  // yaml-cpp gives an empty value the position of the next token; the error must not.
  Loader l;
  NodeOptions out = non_default_options();
  std::string err =
      l.load("udp: 127.0.0.1:1\ndata_dir:\n\n# the next setting\nlog_level: warn\n", out);
  CHECK_MESSAGE(starts_with(err, l.file + ":2: data_dir: "), err);

  err = l.load("threads: 2\ncluster:\n  node_id: 1\n  listen:\n  secret: 0123456789abcdef\n", out);
  CHECK_MESSAGE(starts_with(err, l.file + ":4: cluster.listen: "), err);

  // The last line of the file, with and without its newline.
  err = l.load("udp: 127.0.0.1:1\nthreads:\n", out);
  CHECK_MESSAGE(starts_with(err, l.file + ":2: threads: "), err);
  err = l.load("udp: 127.0.0.1:1\nthreads:", out);
  CHECK_MESSAGE(starts_with(err, l.file + ":2: threads: "), err);

  // An empty cluster section followed by a top-level setting.
  err = l.load("threads: 2\ncluster:\nudp: 127.0.0.1:1\n", out);
  CHECK_MESSAGE(starts_with(err, l.file + ":2: cluster: "), err);

  // A value written on the line after its key: the error names the key's line.
  err = l.load("udp: 127.0.0.1:1\nthreads:\n  0\n", out);
  CHECK(err == l.at(2, "threads", "must be between 1 and 256"));
  err = l.load(
      "cluster:\n  node_id: 1\n  listen: a:1\n  secret: 0123456789abcdef\n  replicas:\n"
      "    9\n",
      out);
  CHECK(err == l.at(5, "cluster.replicas", "must be between 1 and 8"));
}

TEST_CASE("a top-level setting with no value is an error, never the string \"null\"") {
  struct Case {
    const char* field;
    std::string why;
  };
  const Case cases[] = {
      {"threads", kEmpty},        {"rules", kEmptyRules},           {"data_dir", kEmptyDataDir},
      {"init_data", kEmpty},      {"snapshot_interval_ms", kEmpty}, {"memory_cap_mb", kEmpty},
      {"hash_seed", kEmpty},      {"sweep_interval_ms", kEmpty},    {"log_level", kEmpty},
      {"cluster", kEmptyCluster},
  };
  Loader l;
  for (const Case& c : cases) {
    for (const char* value : kNullSpellings) {
      const std::string field = c.field, spelling = value;  // CAPTURE prints a char* as a pointer
      CAPTURE(field);
      CAPTURE(spelling);
      NodeOptions out = non_default_options();
      // The empty field on line 2, between two valid ones.
      const std::string err = l.load(
          std::string("udp: 127.0.0.1:1\n") + c.field + ":" + value + "\ntcp: 127.0.0.1:2\n", out);
      CHECK(err == l.at(2, c.field, c.why));
      // Nothing applied from the empty field; the others are.
      NodeOptions expected = non_default_options();
      expected.udp_listen = "127.0.0.1:1";
      expected.tcp_listen = "127.0.0.1:2";
      check_same(out, expected);
    }
  }
}

TEST_CASE("a cluster setting with no value is an error, never the string \"null\"") {
  struct Case {
    const char* field;
    std::string why;
  };
  const Case cases[] = {
      {"node_id", kEmpty},
      {"name", kEmpty},
      {"listen", kEmpty},
      {"advertise", kEmpty},
      {"seeds", kEmptySeeds},
      {"secret", kEmpty},
      {"secret_file", kEmpty},
      {"replicas", kEmpty},
      {"sync_interval_ms", kEmpty},
      {"anti_entropy_interval_ms", kEmpty},
      {"probe_interval_ms", kEmpty},
      {"forward_timeout_ms", kEmpty},
  };
  Loader l;
  for (const Case& c : cases) {
    for (const char* value : kNullSpellings) {
      const std::string field = c.field, spelling = value;  // CAPTURE prints a char* as a pointer
      CAPTURE(field);
      CAPTURE(spelling);
      NodeOptions out = non_default_options();
      // Lines 2-4 satisfy the required fields; the empty field is on line 5.
      const std::string err =
          l.load(std::string("cluster:\n  node_id: 12\n  listen: 127.0.0.1:7352\n"
                             "  secret: 0123456789abcdef\n  ") +
                     c.field + ":" + value + "\n  replicas: 3\n",
                 out);
      CHECK(err == l.at(5, std::string("cluster.") + c.field, c.why));
      NodeOptions expected = non_default_options();
      expected.cluster.enabled = true;
      expected.cluster.node_id = 12;
      expected.cluster.listen = "127.0.0.1:7352";
      expected.cluster.secret = "0123456789abcdef";
      expected.cluster.replicas = 3;
      check_same(out, expected);
    }
  }
}

TEST_CASE("an empty cluster section does not enable clustering") {
  Loader l;
  NodeOptions out;
  const std::string err = l.load("threads: 2\ncluster:\n", out);  // before l.at: it sets l.file
  CHECK(err == l.at(2, "cluster", kEmptyCluster));
  CHECK_FALSE(out.cluster.enabled);
  CHECK(out.threads == 2);
}

TEST_CASE(
    "an empty string is refused for rules and the cluster's strings, kept where it means off") {
  Loader l;
  {
    NodeOptions out = non_default_options();
    std::string err = l.load("rules: \"\"\n", out);
    CHECK(err == l.at(1, "rules", kEmptyRules));
    CHECK(out.rules_file == non_default_options().rules_file);
    err = l.load("log_level: ''\n", out);
    CHECK(err == l.at(1, "log_level", "must be one of trace, debug, info, warn, error, off"));
    CHECK(out.log_level == non_default_options().log_level);
  }
  for (const std::string field : {"name", "listen", "advertise", "secret", "secret_file"}) {
    CAPTURE(field);
    NodeOptions out = non_default_options();
    const std::string err = l.load(std::string("cluster:\n  node_id: 12\n  listen: 127.0.0.1:7352\n"
                                               "  secret: 0123456789abcdef\n  ") +
                                       field + ": \"\"\n",
                                   out);
    CHECK(err == l.at(5, "cluster." + field, kEmpty));
    CHECK(out.cluster.name == non_default_options().cluster.name);
    CHECK(out.cluster.listen == "127.0.0.1:7352");
    CHECK(out.cluster.advertise == non_default_options().cluster.advertise);
    CHECK(out.cluster.secret == "0123456789abcdef");
  }
  // A listener's "" and data_dir's "" keep their documented meaning (off, memory only): see
  // "a listener given as null or as an empty string is disabled" and "init_data false and an
  // empty data_dir are read as given".
}

TEST_CASE("a seed that is empty or null is refused, and no seed of that list is applied") {
  Loader l;
  const std::string head =
      "cluster:\n  node_id: 12\n  listen: 127.0.0.1:7352\n  secret: 0123456789abcdef\n";
  for (const char* seeds : {"  seeds: [10.0.0.1:7352, \"\"]\n", "  seeds: [10.0.0.1:7352, ~]\n",
                            "  seeds:\n    - 10.0.0.1:7352\n    -\n    - 10.0.0.2:7352\n"}) {
    const std::string list = seeds;
    CAPTURE(list);
    NodeOptions out = non_default_options();
    const std::string err = l.load(head + list, out);
    CHECK(err == l.at(5, "cluster.seeds", kEmptySeed));
    CHECK(out.cluster.seeds == non_default_options().cluster.seeds);
  }
}

TEST_CASE("a quoted null is the literal string, not an empty value") {
  Loader l;
  NodeOptions out;
  CHECK(l.load("data_dir: \"null\"\nrules: '~'\ncluster:\n  node_id: 1\n  listen: a:1\n"
               "  secret: 0123456789abcdef\n  name: \"NULL\"\n",
               out) == "");
  CHECK(out.data_dir == "null");
  CHECK(out.rules_file == "~");
  CHECK(out.cluster.name == "NULL");
}

// ---- files the config reads that are not files
// ---------------------------------------------------

TEST_CASE("a directory given as the config file is an error naming it, and out is kept") {
  TempDir dir;
  NodeOptions out = non_default_options();
  CHECK(load_node_config(dir.path, out).message() ==
        dir.path + ": cannot read the config file: is a directory");
  check_same(out, non_default_options());
}

TEST_CASE("a directory given as secret_file is an error naming it, not an empty secret") {
  Loader l;
  const std::string secret_dir = (fs::path(l.dir.path) / "secrets").string();
  REQUIRE(fs::create_directory(secret_dir));
  NodeOptions out;
  const std::string err = l.load(
      "cluster:\n  node_id: 1\n  listen: 127.0.0.1:7352\n  secret_file: " + secret_dir + "\n", out);
  CHECK(lines_of(err) ==
        std::vector<std::string>{
            l.at(4, "cluster.secret_file", "cannot read " + secret_dir + ": is a directory"),
            l.at(1, "cluster.secret", kSecretRequired),
        });
  CHECK(out.cluster.secret == "");

  // A valid secret given before it is kept.
  NodeOptions with_secret;
  const std::string err2 = l.load(
      "cluster:\n  node_id: 1\n  listen: 127.0.0.1:7352\n"
      "  secret: 0123456789abcdef\n  secret_file: " +
          secret_dir + "\n",
      with_secret);
  CHECK(err2 == l.at(5, "cluster.secret_file", "cannot read " + secret_dir + ": is a directory"));
  CHECK(with_secret.cluster.secret == "0123456789abcdef");
}

TEST_CASE("forget_dead_after_ms: 0 to a day, beyond either end or not a number is an error") {
  Loader l;
  NodeOptions out;
  const std::string head = "cluster:\n  node_id: 1\n  listen: a:1\n  secret: 0123456789abcdef\n";
  CHECK(l.load(head + "  forget_dead_after_ms: -1\n", out)
            .find("cluster.forget_dead_after_ms: must be between 0 and 86400000 (a day)") !=
        std::string::npos);
  CHECK(l.load(head + "  forget_dead_after_ms: 86400001\n", out).find("must be between 0") !=
        std::string::npos);
  CHECK(l.load(head + "  forget_dead_after_ms: soon\n", out).find("has the wrong type") !=
        std::string::npos);
  CHECK(NodeOptions{}.cluster.forget_dead_after_ms == 300'000);
}

TEST_CASE(
    "a node loads envoy_rules next to its rules file and reloads both, a bad file keeps them") {
  TempDir dir;
  const std::string envoy = (fs::path(dir.path) / "envoy").string();
  fs::create_directory(envoy);
  const std::string limit_file = (fs::path(envoy) / "shop.yaml").string();
  std::ofstream(limit_file)
      << "domain: shop\ndescriptors:\n  - key: k\n    rate_limit: {unit: week, "
         "requests_per_unit: 5}\n";
  NodeOptions o;
  o.data_dir.clear();
  o.udp_listen = o.tcp_listen = o.admin_listen = o.resp_listen = "";
  o.rules_file = dir.write("rules.yaml",
                           "domains:\n  - name: api\n    rules:\n      - {name: r, key: [k], "
                           "limits: [1/1s]}\n");
  o.envoy_rules = envoy;
  o.envoy_count_denied = false;
  sluice::StatusOr<std::unique_ptr<sluice::node::Node>> opened = sluice::node::Node::open(o);
  REQUIRE_MESSAGE(opened.ok(), opened.message());
  sluice::node::Node& node = **opened;
  auto p = node.engine().policy();
  CHECK(p->is_envoy_domain("shop"));
  CHECK_FALSE(p->is_envoy_domain("api"));
  REQUIRE(p->rules().domains.size() == 2);
  CHECK_FALSE(p->rules().domains[1].rules[0].count_denied);

  // A second file: reloaded.
  std::ofstream((fs::path(envoy) / "more.yml").string()) << "domain: more\n";
  CHECK(node.reload().ok());
  CHECK(node.engine().policy()->is_envoy_domain("more"));
  // A broken file, then a domain in both: errors naming the files, the rules in force stay.
  std::ofstream((fs::path(envoy) / "zz.yaml").string()) << "domain: api\n";
  const std::string err = node.reload().message();
  CHECK(err.find("zz.yaml") != std::string::npos);
  CHECK(err.find("duplicate domain `api` (also in " + o.rules_file + ")") != std::string::npos);
  CHECK(node.engine().policy()->is_envoy_domain("more"));
  std::ofstream(limit_file) << "domain: shop\ndescriptors: [{key: \"\"}]\n";
  const std::string err2 = node.reload().message();
  CHECK(err2.find("shop.yaml:2: descriptors[0].key") != std::string::npos);
  CHECK(node.engine().policy()->is_envoy_domain("shop"));

  // Without a rules file, only the envoy domains (not the embedded example rules).
  fs::remove((fs::path(envoy) / "zz.yaml").string());
  std::ofstream(limit_file) << "domain: shop\n";
  o.rules_file.clear();
  sluice::StatusOr<std::unique_ptr<sluice::node::Node>> alone = sluice::node::Node::open(o);
  REQUIRE_MESSAGE(alone.ok(), alone.message());
  CHECK((*alone)->engine().policy()->rules().domains.size() == 2);
}

TEST_CASE("a setting name with control or non-ASCII bytes is shown escaped, one error per line") {
  // Found by tests/fuzz/config_fuzz: a key holding a newline split its error over two lines.
  Loader l;
  NodeOptions out;
  const std::string err = l.load("threads: 2\n\"na\\nme\\x01\\xe9\": 1\n", out);
  CAPTURE(err);
  CHECK(err.find('\n') == std::string::npos);
  CHECK(err.find("na\\x0ame\\x01\\xc3\\xa9: unknown setting") != std::string::npos);
}

TEST_CASE(
    "admin_token_file reads the token (trailing newline stripped), admin_token_reads is read") {
  Loader l;
  const std::string token = l.dir.write("token", "t0ken-abc\n");
  NodeOptions o;
  REQUIRE(l.load("admin_token_file: " + token + "\nadmin_token_reads: true\n", o) == "");
  CHECK(o.admin_token_file == token);
  CHECK(o.admin_token == "t0ken-abc");
  CHECK(o.admin_token_reads);
}

TEST_CASE("an admin_token_file that is empty or unreadable is an error naming the file") {
  Loader l;
  const std::string empty = l.dir.write("empty-token", "\n");
  NodeOptions o;
  {
    const std::string err = l.load("threads: 2\nadmin_token_file: " + empty + "\n", o);
    CHECK(err == l.at(2, "admin_token_file", empty + " is empty: write the admin token into it"));
  }
  CHECK(o.admin_token.empty());
  const std::string missing = l.dir.path + "/no-such-token";
  {
    const std::string err = l.load("admin_token_file: " + missing + "\n", o);
    CHECK(err ==
          l.at(1, "admin_token_file", "cannot read " + missing + ": no such file or directory"));
  }
  {
    const std::string err = l.load("admin_token_file:\n", o);
    CHECK(err == l.at(1, "admin_token_file",
                      "must not be empty (leave admin_token_file out for no token)"));
  }
}

TEST_CASE("admin_token_reads without admin_token_file is an error at its line") {
  Loader l;
  NodeOptions o;
  {
    const std::string err = l.load("threads: 2\nadmin_token_reads: true\n", o);
    CHECK(err == l.at(2, "admin_token_reads", "needs admin_token_file (the token to ask for)"));
  }
  CHECK(l.load("admin_token_reads: false\n", o) == "");
}

TEST_CASE("rules_watch_interval_ms: 0 turns it off, 100 to an hour, anything else is an error") {
  Loader l;
  NodeOptions o;
  CHECK(o.rules_watch_interval_ms == 2000);
  CHECK(l.load("rules_watch_interval_ms: 0\n", o) == "");
  CHECK(o.rules_watch_interval_ms == 0);
  CHECK(l.load("rules_watch_interval_ms: 100\n", o) == "");
  CHECK(o.rules_watch_interval_ms == 100);
  CHECK(l.load("rules_watch_interval_ms: 3600000\n", o) == "");
  for (const char* bad : {"99", "-1", "3600001"}) {
    {
      const std::string err = l.load(std::string("rules_watch_interval_ms: ") + bad + "\n", o);
      CHECK(err ==
            l.at(1, "rules_watch_interval_ms", "must be 0 (off) or between 100 and 3600000"));
    }
  }
  CHECK(o.rules_watch_interval_ms == 3600000);
}

TEST_CASE("cluster DNS seeds, seed_refresh_ms and dns_server are read, malformed ones refused") {
  Loader l;
  const std::string head =
      "cluster:\n  node_id: 1\n  listen: 127.0.0.1:7352\n  secret: 0123456789abcdef\n";
  NodeOptions o;
  CHECK(o.cluster.seed_refresh_ms == 30000);
  REQUIRE(l.load(head + "  seeds: [\"dns:sluice.default.svc\", \"dns+srv:_peer._udp.sluice.test\", "
                        "10.0.0.1:7352]\n  seed_refresh_ms: 500\n  dns_server: 127.0.0.1:5353\n",
                 o) == "");
  CHECK(o.cluster.seeds == std::vector<std::string>{"dns:sluice.default.svc",
                                                    "dns+srv:_peer._udp.sluice.test",
                                                    "10.0.0.1:7352"});
  CHECK(o.cluster.seed_refresh_ms == 500);
  CHECK(o.cluster.dns_server == "127.0.0.1:5353");

  {
    const std::string err = l.load(head + "  seeds: [\"dns:\"]\n", o);
    CHECK(err ==
          l.at(5, "cluster.seeds", "\"dns:\" is not dns:NAME (a DNS name after the prefix)"));
  }
  {
    const std::string err = l.load(head + "  seeds: [\"dns+srv:peer.sluice.test\"]\n", o);
    CHECK(err ==
          l.at(5, "cluster.seeds",
               "\"dns+srv:peer.sluice.test\" is not dns+srv:_service._proto.NAME (an SRV name "
               "starts with _service)"));
  }
  {
    const std::string err = l.load(head + "  seeds: [\"dns:bad name\"]\n", o);
    CHECK(err == l.at(5, "cluster.seeds",
                      "\"dns:bad name\" is not dns:NAME (a DNS name after the prefix)"));
  }
  {
    const std::string err = l.load(head + "  seed_refresh_ms: 99\n", o);
    CHECK(err == l.at(5, "cluster.seed_refresh_ms", "must be between 100 and 3600000"));
  }
  {
    const std::string err = l.load(head + "  dns_server: ns.example:53\n", o);
    CHECK(err == l.at(5, "cluster.dns_server",
                      "\"ns.example:53\": expected an IPv4 address, optionally with :PORT"));
  }
  {
    const std::string err = l.load(head + "  dns_server: 127.0.0.1:0\n", o);
    CHECK(err == l.at(5, "cluster.dns_server", "\"127.0.0.1:0\": bad port (expected IPv4:PORT)"));
  }
  CHECK(o.cluster.dns_server == "127.0.0.1:5353");
}

TEST_CASE("Node::open refuses a bad setting naming it, before it opens the data directory") {
  Loader l;
  const auto refused = [&](const std::function<void(NodeOptions&)>& tweak) {
    NodeOptions o;
    o.udp_listen = o.tcp_listen = o.admin_listen = o.grpc_listen = o.resp_listen = "";
    o.data_dir = l.dir.path + "/data";
    o.init_data = true;
    tweak(o);
    sluice::StatusOr<std::unique_ptr<sluice::node::Node>> n = sluice::node::Node::open(o);
    CHECK_FALSE(std::filesystem::exists(o.data_dir));
    REQUIRE_FALSE(n.ok());
    CHECK(n.code() == sluice::StatusCode::invalid_argument);
    return n.message();
  };
  CHECK(refused([](NodeOptions& o) { o.udp_listen = "localhost:7350"; }) ==
        "listen address 'localhost:7350': 'localhost' is not an IP address");
  CHECK(refused([](NodeOptions& o) { o.tcp_listen = "127.0.0.1"; }) ==
        "listen address '127.0.0.1': expected HOST:PORT");
  CHECK(refused([](NodeOptions& o) { o.admin_token_reads = true; }) ==
        "admin_token_reads needs admin_token_file (the token to ask for)");
  const auto cluster = [](NodeOptions& o) {
    o.cluster.enabled = true;
    o.cluster.node_id = 3;
    o.cluster.listen = "127.0.0.1:7946";
    o.cluster.secret = "0123456789abcdef0123456789abcdef";
  };
  CHECK(refused([&](NodeOptions& o) {
          cluster(o);
          o.cluster.listen = "0.0.0.0:7946";
        }) == "cluster.advertise is required when cluster.listen is a wildcard address");
  CHECK(refused([&](NodeOptions& o) {
          cluster(o);
          o.cluster.listen = "127.0.0.1:x";
        }) == "cluster.listen '127.0.0.1:x': bad port 'x'");
  CHECK(refused([&](NodeOptions& o) {
          cluster(o);
          o.cluster.node_id = 0;
        }) == "cluster.node_id must be 1..65535");
  CHECK(refused([&](NodeOptions& o) {
          cluster(o);
          o.cluster.seeds = {"10.0.0.1"};
        }) == "cluster.seeds: \"10.0.0.1\": expected HOST:PORT");
}

TEST_CASE("Node::open refuses the Redis door off loopback without a password") {
  NodeOptions o;
  o.udp_listen = o.tcp_listen = o.admin_listen = o.grpc_listen = "";
  o.data_dir.clear();
  o.resp_listen = "0.0.0.0:0";
  sluice::StatusOr<std::unique_ptr<sluice::node::Node>> n = sluice::node::Node::open(o);
  REQUIRE_FALSE(n.ok());
  CHECK(n.message().starts_with("RESP address \"0.0.0.0:0\" is not loopback"));
  o.resp_listen = "[::1]:0";
  CHECK(sluice::node::Node::open(o).ok());
  o.resp_listen = "0.0.0.0:0";
  o.resp_password = "secret";
  CHECK(sluice::node::Node::open(o).ok());
}

TEST_CASE("Node::open refuses a malformed admin or RESP address, naming the setting") {
  NodeOptions o;
  o.udp_listen = o.tcp_listen = o.grpc_listen = o.resp_listen = "";
  o.data_dir.clear();
  o.admin_listen = "127.0.0.1:99999";
  CHECK(sluice::node::Node::open(o).message() ==
        "admin HTTP listen address \"127.0.0.1:99999\": bad port '99999'");
  o.admin_listen = "";
  o.resp_listen = "localhost:7352";
  CHECK(sluice::node::Node::open(o).message() ==
        "RESP listen address \"localhost:7352\": not an IP address");
}
