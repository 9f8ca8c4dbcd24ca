// A cluster of real sluiced processes on loopback, for the cluster tests (tests/cluster/) and the
// cluster benchmark (bench/scenarios/cluster.cc). Header-only, test support: nothing in lib/ uses
// it.
//
//   LocalCluster: configures and starts N nodes (node i has node_id i + 1, its own check, admin
//     and peer ports, a data directory, a config file and a log under one temp directory; node 1
//     is every other node's seed; ClusterSpec::placement may put a node at another address and
//     start it through a command prefix, as netns_cluster.h does with network namespaces), waits
//     until every node lists every other one alive, kills (SIGKILL), terminates (SIGTERM),
//     restarts, adds and drains nodes, and talks to their admin ports over a tiny blocking HTTP/1.1
//     client (JSON bodies, nlohmann_json).
//   LoadDriver: open-loop traffic through libsluice (one Client per node, whose node list starts
//     with that node and continues with the others, so a failed node is retried elsewhere, or
//     that node alone), checks spread round-robin over the target nodes and the keys, at an
//     offered rate for a duration; one CheckRecord per check (send time, node, key, outcome,
//     latency).
//   Analysis: the exact largest number of admitted checks in any true sliding window (over the
//     recorded send times), percentiles of latencies.
//
// Every wait is bounded in time and count. The destructors SIGKILL and reap every process still
// running and remove the temp directory; children also get PR_SET_PDEATHSIG(SIGKILL), so nothing
// outlives a test binary killed -9. Errors are values ("" or a message), never exceptions, so the
// same code serves doctest and a benchmark main.
//
// Thread safety: a LocalCluster belongs to one thread (the one that forks: the death signal is
// tied to it). A LoadDriver's public functions are called from one thread; its own pacing thread
// and the Clients' I/O threads write the records, which are read after wait().
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/client.h"
#include "free_port.h"
#include "http_client.h"

namespace sluice::testing {

using Json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- small helpers -----------------------------------------------------------------------------

// Polls `done` every `every` until it returns true or `timeout` passed; true when it did.
inline bool wait_until(const std::function<bool()>& done, milliseconds timeout,
                       milliseconds every = milliseconds(50)) {
  const auto until = SteadyClock::now() + timeout;
  for (;;) {
    if (done()) return true;
    if (SteadyClock::now() >= until) return false;
    std::this_thread::sleep_for(every);
  }
}

inline sockaddr_in loopback_addr(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// `host` is an IPv4 literal; an unparsable one gives 0.0.0.0 (connects then fail).
inline sockaddr_in ipv4_addr(const std::string& host, uint16_t port) {
  sockaddr_in a = loopback_addr(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_ANY);
  return a;
}

inline std::string file_tail(const std::filesystem::path& path, size_t max_bytes = 3000) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  return text.size() > max_bytes ? text.substr(text.size() - max_bytes) : text;
}

// ---- the cluster -------------------------------------------------------------------------------

// Rules for the cluster tests and benchmark: domain "g" (consistency: gossip) and domain "o"
// (consistency: owner), each with one rule keyed by entry `k`:
//   - `limit_per_s` per 1 s, strict estimator, 100 ms buckets: a node on its own never admits
//     more than the limit in any true 1 s window, so whatever a cluster admits beyond it is the
//     cluster's doing (sync lag, lost deltas), not the estimator's;
//   - `total`: 1e12 per hour in 1-minute buckets, never reached, counting every admitted check,
//     so /v1/inspect shows how many admitted checks each node knows of (own + others).
// A gossip domain `g` and an owner domain `o`, one rule each keyed by `k`: `limit_per_s` per 1 s
// window in 100 ms buckets by default (strict by default: one node alone never exceeds the limit in
// a true window; weighted follows a sliding log more closely under bursts), plus a huge hourly
// `total` that counts every admitted check (with_total = false: no `total`, one counter per key).
inline std::string two_mode_rules(uint64_t limit_per_s, const char* estimator = "strict",
                                  const char* granularity = "100ms", bool with_total = true) {
  std::string out = "domains:\n";
  for (const char* mode : {"gossip", "owner"}) {
    out += std::string("  - name: ") + mode[0] + "\n    rules:\n      - name: per-key\n" +
           "        key: [k]\n        estimator: " + estimator + "\n        consistency: " + mode +
           "\n" + "        limits:\n          - {limit: " + std::to_string(limit_per_s) +
           ", window: 1s, granularity: " + granularity + "}\n";
    if (with_total) {
      out += "          - {limit: 1000000000000, window: 1h, granularity: 1m, name: total}\n";
    }
  }
  return out;
}

// Where a node runs: the IPv4 address its check, admin and peer ports bind to (and the others and
// the tests reach it at), those ports (0: a free loopback port), and a command that sluiced's is
// appended to, e.g. {"/usr/sbin/ip", "netns", "exec", "ns-1"} (which execs sluiced in place, so
// the node's pid is sluiced's).
struct NodePlacement {
  std::string host = "127.0.0.1";
  uint16_t check_port = 0, admin_port = 0, peer_port = 0;
  std::vector<std::string> launch_prefix;
};

struct ClusterSpec {
  std::string sluiced_bin;  // path of the sluiced binary
  size_t nodes = 3;         // started by start()
  std::string rules_yaml = two_mode_rules(100);
  int64_t sync_interval_ms = 100;
  int64_t probe_interval_ms = 1000;
  int64_t anti_entropy_interval_ms = 5000;
  int64_t forward_timeout_ms = 8;  // the node default
  size_t replicas = 2;
  std::string secret = "sluice-cluster-test-secret-0123456789abcdef";
  // The RESP door's password, given to nodes placed off loopback (sluiced refuses a RESP door
  // there without one); loopback nodes run their door open, as a default node does.
  std::string resp_password = "sluice-cluster-test-resp-password";
  unsigned threads = 1;  // per node: a 2-core machine runs up to 11 nodes plus the load
  std::string log_level = "info";
  milliseconds start_timeout{10000};  // per node: until its admin port answers
  // Node i's (0-based) placement, asked once when it is configured; unset: loopback, free ports.
  std::function<NodePlacement(size_t index)> placement;
  // Node i's cluster.seeds, in place of the default (node 1 at a first start, every other node on
  // a restart), e.g. {"dns+srv:_sluice._udp.sluice.test"}.
  std::function<std::vector<std::string>(size_t index)> seeds;
  // More settings of the cluster section, one "key: value" each, e.g. "seed_refresh_ms: 500".
  std::vector<std::string> extra_cluster_config;
  // More top-level settings, one "key: value" each, e.g. "snapshot_interval_ms: 100".
  std::vector<std::string> extra_config;
  // true: no cluster section at all (a node on its own, e.g. the store's crash test).
  bool standalone = false;
  // Node i's config file as written, to rewrite before it is saved (e.g. settings an older
  // release's sluiced refuses, tests/upgrade/); unset: as written.
  std::function<std::string(size_t index, std::string config)> rewrite_config;
};

struct NodeProcess {
  size_t index = 0;  // 0-based; node_id = index + 1
  uint16_t id = 0;
  std::string name;
  std::string host = "127.0.0.1";  // the address every port of this node binds to
  uint16_t check_port = 0, admin_port = 0, peer_port = 0, grpc_port = 0, resp_port = 0;
  std::vector<std::string> launch_prefix;  // NodePlacement::launch_prefix
  std::string sluiced_bin;  // this node's binary from its next start on; "" : the spec's
  std::filesystem::path config, data_dir, log;
  std::string secret;
  pid_t pid = -1;
  int last_exit_status = -1;  // waitpid status of the last life, -1 while unknown
  bool started = false;       // started at least once
};

class LocalCluster {
 public:
  explicit LocalCluster(ClusterSpec spec) : spec_(std::move(spec)) {
    dir_ =
        std::filesystem::temp_directory_path() / ("sluice-cluster-" + std::to_string(::getpid()) +
                                                  "-" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "rules.yaml") << spec_.rules_yaml;
    std::ofstream(dir_ / "resp-password") << spec_.resp_password << "\n";
  }

  ~LocalCluster() {
    for (NodeProcess& n : nodes_) {
      if (n.pid > 0) {
        ::kill(n.pid, SIGKILL);
        ::waitpid(n.pid, nullptr, 0);
        n.pid = -1;
      }
    }
    if (std::getenv("SLUICE_KEEP_CLUSTER_DIR") == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  const ClusterSpec& spec() const { return spec_; }
  const std::filesystem::path& dir() const { return dir_; }
  size_t size() const { return nodes_.size(); }
  const NodeProcess& node(size_t i) const { return nodes_.at(i); }
  std::vector<uint16_t> check_ports() const {
    std::vector<uint16_t> out;
    for (const NodeProcess& n : nodes_)
      out.push_back(n.check_port);
    return out;
  }
  // Every node's gRPC port (Envoy's rate limit service).
  std::vector<uint16_t> grpc_ports() const {
    std::vector<uint16_t> out;
    for (const NodeProcess& n : nodes_)
      out.push_back(n.grpc_port);
    return out;
  }
  // "host:port" of every node's check port, for a LoadDriver of nodes placed off loopback.
  std::vector<std::string> check_addresses() const {
    std::vector<std::string> out;
    for (const NodeProcess& n : nodes_)
      out.push_back(n.host + ":" + std::to_string(n.check_port));
    return out;
  }

  // Configures and starts spec.nodes nodes, then waits until every one lists all of them alive.
  std::string start(milliseconds converge_timeout = milliseconds(20000)) {
    for (size_t i = 0; i < spec_.nodes; ++i) {
      const size_t idx = configure_node();
      if (idx == SIZE_MAX) return "no free ports";
      if (std::string err = start_node(idx); !err.empty()) return err;
    }
    if (!wait_all_alive(converge_timeout)) return "cluster did not converge: " + describe();
    return "";
  }

  // Writes the config of one more node (not started); returns its index, SIZE_MAX when no ports.
  // `secret` overrides the cluster's (a node that cannot talk to the others).
  size_t configure_node(std::optional<std::string> secret = std::nullopt) {
    NodeProcess n;
    n.index = nodes_.size();
    n.id = static_cast<uint16_t>(n.index + 1);
    n.name = "node-" + std::to_string(n.id);
    NodePlacement p = spec_.placement ? spec_.placement(n.index) : NodePlacement{};
    n.host = p.host;
    n.launch_prefix = std::move(p.launch_prefix);
    n.check_port = p.check_port != 0 ? p.check_port : free_loopback_port();
    n.admin_port = p.admin_port != 0 ? p.admin_port : free_loopback_port();
    n.peer_port = p.peer_port != 0 ? p.peer_port : free_loopback_port();
    n.grpc_port = free_loopback_port();  // the gRPC front (Envoy's rate limit service)
    n.resp_port = free_loopback_port();  // the RESP door
    if (n.check_port == 0 || n.admin_port == 0 || n.peer_port == 0 || n.grpc_port == 0 ||
        n.resp_port == 0)
      return SIZE_MAX;
    n.secret = secret.value_or(spec_.secret);
    n.config = dir_ / (n.name + ".yaml");
    n.data_dir = dir_ / ("data-" + std::to_string(n.id));
    n.log = dir_ / (n.name + ".log");
    nodes_.push_back(std::move(n));
    return nodes_.size() - 1;
  }

  // Configures and starts one more node (a join through node 1); its index, or the error.
  std::pair<size_t, std::string> add_node(std::optional<std::string> secret = std::nullopt) {
    const size_t i = configure_node(std::move(secret));
    if (i == SIZE_MAX) return {i, "no free ports"};
    return {i, start_node(i)};
  }

  // Writes node i's config. Seeds: node 1 at a node's first start (as deploy/local-cluster.sh
  // does); every other node on a restart, so a restarted node 1 finds the cluster again too.
  void write_config(size_t i, bool restart) {
    const NodeProcess& n = nodes_.at(i);
    std::ostringstream cfg;
    write_config_text(i, restart, cfg);
    std::string text = cfg.str();
    if (spec_.rewrite_config) text = spec_.rewrite_config(i, std::move(text));
    std::ofstream(n.config, std::ios::trunc) << text;
  }

  // The binary node i runs from its next start on ("" : the spec's sluiced_bin).
  void set_binary(size_t i, std::string path) { nodes_.at(i).sluiced_bin = std::move(path); }
  const std::string& binary(size_t i) const {
    const NodeProcess& n = nodes_.at(i);
    return n.sluiced_bin.empty() ? spec_.sluiced_bin : n.sluiced_bin;
  }

 private:
  void write_config_text(size_t i, bool restart, std::ostream& cfg) const {
    const NodeProcess& n = nodes_.at(i);
    cfg << "udp: " << n.host << ":" << n.check_port << "\ntcp: " << n.host << ":" << n.check_port
        << "\nadmin: " << n.host << ":" << n.admin_port << "\ngrpc: " << n.host << ":"
        << n.grpc_port << "\nresp: " << n.host << ":" << n.resp_port
        << "\nthreads: " << spec_.threads << "\nrules: " << (dir_ / "rules.yaml").string()
        << "\ndata_dir: " << n.data_dir.string()
        << "\ninit_data: true\nlog_level: " << spec_.log_level << "\n";
    if (n.host.rfind("127.", 0) != 0)
      cfg << "resp_password_file: " << (dir_ / "resp-password").string() << "\n";
    for (const std::string& line : spec_.extra_config)
      cfg << line << "\n";
    if (spec_.standalone) return;
    cfg << "cluster:\n  node_id: " << n.id << "\n  name: " << n.name << "\n  listen: " << n.host
        << ":" << n.peer_port << "\n  secret: \"" << n.secret
        << "\"\n  replicas: " << spec_.replicas
        << "\n  sync_interval_ms: " << spec_.sync_interval_ms
        << "\n  anti_entropy_interval_ms: " << spec_.anti_entropy_interval_ms
        << "\n  probe_interval_ms: " << spec_.probe_interval_ms
        << "\n  forward_timeout_ms: " << spec_.forward_timeout_ms << "\n";
    std::vector<std::string> seeds;
    for (const NodeProcess& other : nodes_) {
      if (other.index == i) continue;
      if (restart || (other.index == 0)) {
        seeds.push_back(other.host + ":" + std::to_string(other.peer_port));
      }
    }
    if (spec_.seeds) seeds = spec_.seeds(i);
    if (!seeds.empty()) {
      cfg << "  seeds: [";
      for (size_t k = 0; k < seeds.size(); ++k)
        cfg << (k ? ", " : "") << '"' << seeds[k] << '"';
      cfg << "]\n";
    }
    for (const std::string& line : spec_.extra_cluster_config)
      cfg << "  " << line << "\n";
  }

 public:
  // Starts (or restarts: same id, name, ports and data directory) node i and waits until its
  // admin port answers. "" or why not (the log's tail included).
  std::string start_node(size_t i) {
    NodeProcess& n = nodes_.at(i);
    if (running(i)) return n.name + " is already running";
    write_config(i, n.started);
    n.started = true;
    std::vector<std::string> args = n.launch_prefix;
    for (const std::string& a : {binary(i), std::string("--config"), n.config.string()})
      args.push_back(a);
    std::vector<char*> argv;  // built before fork: the child only execs
    for (std::string& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = n.log.string();
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return "fork failed";
    if (pid == 0) {
      // Only async-signal-safe calls until exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    n.pid = pid;
    n.last_exit_status = -1;
    const bool up = wait_until(
        [&] {
          return !running(i) ||
                 http_request_at(n.host, n.admin_port, "GET", "/healthz").status == 200;
        },
        spec_.start_timeout, milliseconds(20));
    if (!running(i)) return n.name + " exited at start: " + file_tail(n.log);
    if (!up) return n.name + " did not answer on its admin port: " + file_tail(n.log);
    return "";
  }

  // True while node i's process has not exited (reaps it when it has).
  bool running(size_t i) {
    NodeProcess& n = nodes_.at(i);
    if (n.pid <= 0) return false;
    int status = 0;
    if (::waitpid(n.pid, &status, WNOHANG) == n.pid) {
      n.pid = -1;
      n.last_exit_status = status;
      return false;
    }
    return true;
  }

  // SIGKILL and reap.
  void kill9(size_t i) {
    NodeProcess& n = nodes_.at(i);
    if (n.pid <= 0) return;
    ::kill(n.pid, SIGKILL);
    int status = 0;
    ::waitpid(n.pid, &status, 0);
    n.pid = -1;
    n.last_exit_status = status;
  }

  // SIGTERM (leave, hand off, exit). Returns the wait status, or -1 when it did not exit in time
  // (it is then killed).
  int terminate(size_t i, milliseconds timeout = milliseconds(10000)) {
    NodeProcess& n = nodes_.at(i);
    if (n.pid <= 0) return n.last_exit_status;
    ::kill(n.pid, SIGTERM);
    return wait_exit(i, timeout);
  }

  // Waits for node i to exit on its own: its wait status, or -1 after the timeout (then killed).
  int wait_exit(size_t i, milliseconds timeout) {
    NodeProcess& n = nodes_.at(i);
    if (!wait_until([&] { return !running(i); }, timeout, milliseconds(10))) {
      kill9(i);
      n.last_exit_status = -1;
      return -1;
    }
    return n.last_exit_status;
  }

  HttpReply get(size_t i, const std::string& path) const {
    return http_request_at(nodes_.at(i).host, nodes_.at(i).admin_port, "GET", path);
  }
  HttpReply post(size_t i, const std::string& path, const Json& body) const {
    return http_request_at(nodes_.at(i).host, nodes_.at(i).admin_port, "POST", path, body.dump());
  }

  // GET /v1/cluster as JSON; nullopt when the node does not answer.
  std::optional<Json> cluster_json(size_t i) const {
    const HttpReply r = get(i, "/v1/cluster");
    if (r.status != 200) return std::nullopt;
    return r.json();
  }

  // The state ("alive", "suspect", "dead", "left") of member `id` as node `observer` sees it;
  // "" when it does not list it, "?" when the observer does not answer.
  std::string member_state(size_t observer, uint16_t id) const {
    const auto j = cluster_json(observer);
    if (!j) return "?";
    for (const Json& m : j->value("members", Json::array())) {
      if (m.value("id", 0) == id) return m.value("state", "");
    }
    return "";
  }

  // True when every observer lists member `id` in `state` right now.
  bool all_see(const std::vector<size_t>& observers, uint16_t id, const std::string& state) const {
    for (size_t o : observers) {
      if (member_state(o, id) != state) return false;
    }
    return true;
  }

  // Indices of the nodes whose process runs.
  std::vector<size_t> running_nodes() {
    std::vector<size_t> out;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (running(i)) out.push_back(i);
    }
    return out;
  }

  // True when every running node lists every running node (itself included) as alive, and
  // nothing else as alive (nodes started with another secret excluded on both sides).
  bool all_alive_now() {
    std::vector<size_t> up;
    for (size_t i : running_nodes()) {
      if (nodes_[i].secret == spec_.secret) up.push_back(i);
    }
    for (size_t o : up) {
      const auto j = cluster_json(o);
      if (!j) return false;
      std::set<int> alive;
      for (const Json& m : j->value("members", Json::array())) {
        if (m.value("state", "") == "alive") alive.insert(m.value("id", 0));
      }
      std::set<int> want;
      for (size_t i : up)
        want.insert(nodes_[i].id);
      if (alive != want) return false;
    }
    return true;
  }

  bool wait_all_alive(milliseconds timeout) {
    return wait_until([&] { return all_alive_now(); }, timeout, milliseconds(100));
  }

  // POST /v1/drain: the node leaves and stops about a second later.
  HttpReply drain(size_t i) const { return post(i, "/v1/drain", Json::object()); }

  // The owners (node ids, owner first) of the first limit's counter of {domain, k=key}, as node
  // `asked` sees them (POST /v1/ring); empty when it does not answer.
  std::vector<uint16_t> owners(size_t asked, const std::string& domain,
                               const std::string& key) const {
    std::vector<uint16_t> out;
    const HttpReply r =
        post(asked, "/v1/ring", Json{{"domain", domain}, {"descriptors", {{"k", key}}}});
    const auto j = r.json();
    if (r.status != 200 || !j) return out;
    // {"rules":[{"limits":[{"name","owners":[{"id","name"}]}]}]}, or a top-level "limits".
    const Json* limits = nullptr;
    if (j->contains("rules") && !(*j)["rules"].empty()) limits = &(*j)["rules"][0]["limits"];
    if (limits == nullptr && j->contains("limits")) limits = &(*j)["limits"];
    if (limits == nullptr || limits->empty()) return out;
    for (const Json& o : (*limits)[0].value("owners", Json::array()))
      out.push_back(static_cast<uint16_t>(o.value("id", 0)));
    return out;
  }

  // Per limit name: the sum over the buckets of own + others for {domain, k=key}, as node i knows
  // it (POST /v1/inspect); nullopt when it does not answer.
  std::optional<std::vector<std::pair<std::string, uint64_t>>> known_totals(
      size_t i, const std::string& domain, const std::string& key) const {
    const HttpReply r =
        post(i, "/v1/inspect", Json{{"domain", domain}, {"descriptors", {{"k", key}}}});
    const auto j = r.json();
    if (r.status != 200 || !j) return std::nullopt;
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const Json& rule : j->value("rules", Json::array())) {
      for (const Json& lim : rule.value("limits", Json::array())) {
        uint64_t sum = 0;
        for (const Json& b : lim.value("buckets", Json::array()))
          sum += b.value("own", uint64_t{0}) + b.value("others", uint64_t{0});
        out.emplace_back(lim.value("name", ""), sum);
      }
    }
    return out;
  }

  // The `total` limit of two_mode_rules: how many admitted checks of the key node i knows of.
  std::optional<uint64_t> known_admitted(size_t i, const std::string& domain,
                                         const std::string& key) const {
    const auto t = known_totals(i, domain, key);
    if (!t) return std::nullopt;
    for (const auto& [name, sum] : *t) {
      if (name == "total") return sum;
    }
    return std::nullopt;
  }

  // dropped.<reason> of node i's /v1/cluster (0 when absent); nullopt when it does not answer.
  std::optional<uint64_t> dropped(size_t i, const std::string& reason) const {
    const auto j = cluster_json(i);
    if (!j) return std::nullopt;
    return j->value("dropped", Json::object()).value(reason, uint64_t{0});
  }

  // One line per node: its view of the members, for failure messages.
  std::string describe() {
    std::string out;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      out += "\n  " + nodes_[i].name + (running(i) ? "" : " (not running)") + ": ";
      const auto j = running(i) ? cluster_json(i) : std::nullopt;
      if (!j) continue;
      for (const Json& m : j->value("members", Json::array())) {
        out += std::to_string(m.value("id", 0)) + "=" + m.value("state", "") + " ";
      }
    }
    return out;
  }

  std::string log_tail(size_t i, size_t max_bytes = 3000) const {
    return file_tail(nodes_.at(i).log, max_bytes);
  }

 private:
  ClusterSpec spec_;
  std::filesystem::path dir_;
  std::vector<NodeProcess> nodes_;
};

// ---- load --------------------------------------------------------------------------------------

enum class CheckOutcome : uint8_t { kAllowed, kDenied, kFailed };

struct CheckRecord {
  int64_t send_us = 0;     // since the driver's start, when the check was handed to the client
  int64_t latency_us = 0;  // until its result came back
  uint32_t node = 0;       // index of the node it was sent to first
  uint32_t key = 0;        // index into LoadOptions::keys
  CheckOutcome outcome = CheckOutcome::kFailed;
};

struct LoadOptions {
  std::string domain = "g";
  std::string entry = "k";        // the descriptor entry carrying the key
  std::vector<std::string> keys;  // each check names one, round-robin
  // Per key, its domain (e.g. one gossip and one owner key in the same traffic); empty: `domain`
  // for every key.
  std::vector<std::string> key_domains;
  double rate_per_s = 100;  // offered, over all keys and nodes together
  milliseconds duration{3000};
  // true: each node's Client lists every node, that one first, so a failed node is retried on
  // the next; false: a check goes to its node only.
  bool failover = true;
  sluice::Transport transport = sluice::Transport::kUdp;
  std::chrono::microseconds timeout = std::chrono::milliseconds(300);
  uint32_t attempts = 3;
};

class LoadDriver {
 public:
  // `ports`: the check port on loopback of every node that may receive traffic (index = node
  // index), known up front so a node added later can be targeted with set_targets().
  LoadDriver(LoadOptions options, const std::vector<uint16_t>& ports)
      : LoadDriver(std::move(options), loopback_addresses(ports)) {}
  // The same with "host:port" addresses (LocalCluster::check_addresses()).
  LoadDriver(LoadOptions options, std::vector<std::string> addresses)
      : opt_(std::move(options)), addresses_(std::move(addresses)) {
    capacity_ = static_cast<size_t>(opt_.rate_per_s * static_cast<double>(opt_.duration.count()) /
                                    1000.0 * 1.05) +
                16;
    records_.resize(capacity_);
  }

  ~LoadDriver() {
    stop_.store(true);
    if (pacer_.joinable()) pacer_.join();
    clients_.clear();  // completes pending checks (their callbacks write records_) first
  }

  LoadDriver(const LoadDriver&) = delete;
  LoadDriver& operator=(const LoadDriver&) = delete;

  // Creates the clients and starts sending to `targets` (node indices). "" or the error.
  std::string start(std::vector<size_t> targets) {
    if (opt_.keys.empty() || targets.empty() || opt_.rate_per_s <= 0) return "nothing to send";
    if (opt_.key_domains.empty()) opt_.key_domains.assign(opt_.keys.size(), opt_.domain);
    if (opt_.key_domains.size() != opt_.keys.size()) return "key_domains and keys differ in size";
    for (size_t i = 0; i < addresses_.size(); ++i) {
      ClientOptions co;
      for (size_t k = 0; k < (opt_.failover ? addresses_.size() : 1); ++k) {
        co.nodes.push_back(addresses_[(i + k) % addresses_.size()]);
      }
      co.transport = opt_.transport;
      co.fail_mode = FailMode::kClosed;
      co.timeout = opt_.timeout;
      co.attempts = opt_.attempts;
      std::string err;
      auto c = Client::create(co, &err);
      if (!c) return "client for node " + std::to_string(i) + ": " + err;
      clients_.push_back(std::move(c));
    }
    set_targets(std::move(targets));
    start_ = SteadyClock::now();
    pacer_ = std::thread([this] { pace(); });
    return "";
  }

  // Changes the nodes that get new checks (any time).
  void set_targets(std::vector<size_t> targets) {
    std::lock_guard g(targets_mu_);
    targets_ = std::move(targets);
  }

  // Microseconds since start().
  int64_t now_us() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - start_)
        .count();
  }

  // Waits until the duration has passed and every check has its result (bounded: the duration,
  // then the timeout plus a second). False if some result never came (a client bug).
  bool wait() {
    if (pacer_.joinable()) pacer_.join();
    const auto grace = std::chrono::duration_cast<milliseconds>(opt_.timeout) + milliseconds(1000);
    return wait_until([&] { return completed_.load() >= sent_.load(); }, grace, milliseconds(5));
  }

  // Valid after wait(): one record per check sent.
  std::vector<CheckRecord> records() const {
    const size_t n = sent_.load();
    return {records_.begin(), records_.begin() + static_cast<ptrdiff_t>(n)};
  }

  const LoadOptions& options() const { return opt_; }
  uint64_t retries() const {
    uint64_t r = 0;
    for (const auto& c : clients_)
      r += c->stats().retries;
    return r;
  }

 private:
  static std::vector<std::string> loopback_addresses(const std::vector<uint16_t>& ports) {
    std::vector<std::string> out;
    for (uint16_t p : ports)
      out.push_back("127.0.0.1:" + std::to_string(p));
    return out;
  }

  void pace() {
    const double period_us = 1e6 / opt_.rate_per_s;
    const int64_t end_us = static_cast<int64_t>(opt_.duration.count()) * 1000;
    const size_t nkeys = opt_.keys.size();
    for (size_t k = 0; k < capacity_ && !stop_.load(); ++k) {
      const auto at = start_ + std::chrono::microseconds(
                                   static_cast<int64_t>(static_cast<double>(k) * period_us));
      if (std::chrono::duration_cast<std::chrono::microseconds>(at - start_).count() >= end_us) {
        break;
      }
      std::this_thread::sleep_until(at);
      size_t node = 0;
      {
        std::lock_guard g(targets_mu_);
        node = targets_[(k / nkeys) % targets_.size()];
      }
      const uint32_t key = static_cast<uint32_t>(k % nkeys);
      CheckRecord& r = records_[k];
      r.send_us = now_us();
      r.node = static_cast<uint32_t>(node);
      r.key = key;
      const Entry e{opt_.entry, opt_.keys[key]};
      const Check c{opt_.key_domains[key], {&e, 1}, 1};
      sent_.store(k + 1);
      clients_[node]->async_check(c, [this, k](Result res) {
        CheckRecord& rec = records_[k];
        rec.latency_us = now_us() - rec.send_us;
        if (res.decided() && res.code == wire::Code::kOk) {
          rec.outcome = res.allowed ? CheckOutcome::kAllowed : CheckOutcome::kDenied;
        } else {
          rec.outcome = CheckOutcome::kFailed;
        }
        completed_.fetch_add(1);
      });
    }
  }

  LoadOptions opt_;
  std::vector<std::string> addresses_;  // "host:port" per node index
  size_t capacity_ = 0;
  std::vector<CheckRecord> records_;  // sized once; slot k written by the pacer, then a callback
  std::atomic<size_t> sent_{0};
  std::atomic<size_t> completed_{0};
  std::atomic<bool> stop_{false};
  SteadyClock::time_point start_{};
  std::mutex targets_mu_;  // guards targets_
  std::vector<size_t> targets_;
  std::vector<std::unique_ptr<Client>> clients_;  // declared after records_: destroyed first
  std::thread pacer_;
};

// ---- analysis ----------------------------------------------------------------------------------

struct WindowMax {
  size_t count = 0;      // the most times inside one window
  int64_t start_us = 0;  // where the first such window starts
};

// The largest number of `times` (any order) inside one half-open window [t, t + window), over
// every t, and where it is: exact (a best window starts at one of the times).
inline WindowMax sliding_window_max(std::vector<int64_t> times, int64_t window) {
  std::sort(times.begin(), times.end());
  WindowMax best;
  size_t j = 0;
  for (size_t i = 0; i < times.size(); ++i) {
    if (j < i) j = i;
    while (j < times.size() && times[j] < times[i] + window)
      ++j;
    if (j - i > best.count) best = {j - i, times[i]};
  }
  return best;
}

inline size_t max_in_sliding_window(std::vector<int64_t> times, int64_t window) {
  return sliding_window_max(std::move(times), window).count;
}

// "t0:n0 t1:n1 ...": admitted in the window [t, t + window) for t every `step` from `from` to
// `to` (seconds since the start), to show when a limit was overrun.
inline std::string window_timeline(const std::vector<int64_t>& times, int64_t window, int64_t step,
                                   int64_t from, int64_t to) {
  std::vector<int64_t> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  std::string out;
  char buf[64];
  for (int64_t t = from; t < to; t += step) {
    const auto lo = std::lower_bound(sorted.begin(), sorted.end(), t);
    const auto hi = std::lower_bound(sorted.begin(), sorted.end(), t + window);
    std::snprintf(buf, sizeof buf, "%.2f:%td ", static_cast<double>(t) / 1e6, hi - lo);
    out += buf;
  }
  return out;
}

// Send times of the admitted checks of key `key` (all keys when key < 0) sent in [from, to).
inline std::vector<int64_t> admit_times(const std::vector<CheckRecord>& records, int key = -1,
                                        int64_t from_us = INT64_MIN, int64_t to_us = INT64_MAX) {
  std::vector<int64_t> out;
  for (const CheckRecord& r : records) {
    if (r.outcome != CheckOutcome::kAllowed) continue;
    if (key >= 0 && r.key != static_cast<uint32_t>(key)) continue;
    if (r.send_us < from_us || r.send_us >= to_us) continue;
    out.push_back(r.send_us);
  }
  return out;
}

// The fewest admitted in any true window [t, t + window) with from_us <= t <= to_us - window,
// over the limit, with t stepped every millisecond; nullopt when no such window fits.
inline std::optional<double> admitted_min_over_limit(const std::vector<CheckRecord>& records,
                                                     int key, int64_t window_us, uint64_t limit,
                                                     int64_t from_us, int64_t to_us) {
  std::vector<int64_t> times = admit_times(records, key);
  std::sort(times.begin(), times.end());
  if (to_us - window_us < from_us) return std::nullopt;
  std::ptrdiff_t least = PTRDIFF_MAX;
  for (int64_t t = from_us; t <= to_us - window_us; t += 1000) {
    const auto lo = std::lower_bound(times.begin(), times.end(), t);
    const auto hi = std::lower_bound(times.begin(), times.end(), t + window_us);
    least = std::min(least, hi - lo);
  }
  return static_cast<double>(least) / static_cast<double>(limit);
}

// Max admitted in any true window of `window_us` for key `key`, over the limit.
inline double admitted_over_limit(const std::vector<CheckRecord>& records, int key,
                                  int64_t window_us, uint64_t limit) {
  return static_cast<double>(max_in_sliding_window(admit_times(records, key), window_us)) /
         static_cast<double>(limit);
}

struct LoadSummary {
  size_t sent = 0, allowed = 0, denied = 0, failed = 0;
};

inline LoadSummary summarize(const std::vector<CheckRecord>& records) {
  LoadSummary s;
  s.sent = records.size();
  for (const CheckRecord& r : records) {
    if (r.outcome == CheckOutcome::kAllowed) ++s.allowed;
    if (r.outcome == CheckOutcome::kDenied) ++s.denied;
    if (r.outcome == CheckOutcome::kFailed) ++s.failed;
  }
  return s;
}

// The p-th percentile (0..100, nearest rank) of the latencies of decided checks of key `key` sent
// to node `node` (< 0: any); -1 when there are none.
inline int64_t latency_percentile_us(const std::vector<CheckRecord>& records, double p,
                                     int node = -1, int key = -1) {
  std::vector<int64_t> l;
  for (const CheckRecord& r : records) {
    if (r.outcome == CheckOutcome::kFailed) continue;
    if (node >= 0 && r.node != static_cast<uint32_t>(node)) continue;
    if (key >= 0 && r.key != static_cast<uint32_t>(key)) continue;
    l.push_back(r.latency_us);
  }
  if (l.empty()) return -1;
  std::sort(l.begin(), l.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(l.size()));
  const size_t idx = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(l.size()))) - 1;
  return l[idx];
}

}  // namespace sluice::testing
