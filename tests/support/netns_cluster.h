// A LocalCluster (cluster_process.h) whose nodes each run in a network namespace of their own, so
// that the network between them can be cut, made one-way or lossy while the load driver still
// reaches every node: for tests/cluster/partition_test.cc and the `partition`
// scenario of sluice-bench-cluster. Header-only test support like cluster_process.h, whose
// LocalCluster, LoadDriver and analysis it reuses (through ClusterSpec::placement).
//
// Layout, P being this process's pid and k = 1..N the node's number (node_id):
//   - namespace sluice-P-k: lo and eth0 with 10.A.B.k/24; sluiced runs there (started through
//     `ip netns exec`, which execs it in place) with its check, admin and peer ports on
//     7350, 7351 and 7352 of 10.A.B.k;
//   - veth sluP-k in the root namespace, the other end of that eth0, a port of
//   - bridge sluP-br in the root namespace, with 10.A.B.254/24: the root namespace's way to the
//     nodes, so the load driver and the admin requests run here and reach them through it.
// A.B comes from P (200..249 and 0..255), moved on while the root namespace already has an
// address or route in it. Only addresses inside these namespaces are ever sent to.
//
// Faults are nftables rules (this kernel has no netem) in the nodes' namespaces, table
// `inet sluice_fault`, input hook: a node drops what arrives from some other nodes' addresses on
// the check and peer ports (their gossip, sync and forwarded checks) or from those ports (their
// answers to forwarded checks), always or at random (`numgen random mod 100 < X`). The driver's
// packets come from 10.A.B.254 and never match. heal() deletes the table in every namespace.
//
// Cleanup: the destructor kills the nodes, then deletes the links and namespaces. Every name
// carries P, so start() first deletes whatever a run whose process no longer exists left behind
// (a crash, kill -9), and never a live run's.
//
// Requires root, `ip` (iproute2) and `nft` (nftables; deploy/setup.sh installs both):
// netns_unavailable() says why a run cannot happen here. Thread safety: as LocalCluster's, one
// thread; one NetnsCluster per process at a time (the names carry only the pid).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cluster_process.h"

namespace sluice::testing {

// ---- running a command -------------------------------------------------------------------------

struct CommandResult {
  int status = -1;     // exit code; -1 when it could not run, was killed, or ran out of time
  std::string output;  // stdout and stderr together
};

// Runs argv (argv[0] a path) with stdin from /dev/null, within `timeout` (then SIGKILL).
inline CommandResult run_command(const std::vector<std::string>& argv,
                                 milliseconds timeout = milliseconds(10000)) {
  CommandResult r;
  if (argv.empty()) return r;
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;  // built before fork: the child of a threaded process only execs
  for (std::string& a : args)
    cargv.push_back(a.data());
  cargv.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return r;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return r;
  }
  if (pid == 0) {
    const int in = ::open("/dev/null", O_RDONLY);
    if (in >= 0) ::dup2(in, 0);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  const auto deadline = SteadyClock::now() + timeout;
  bool timed_out = false;
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - SteadyClock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      timed_out = ready == 0;
      break;
    }
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.output.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  if (::waitpid(pid, &status, 0) == pid && !timed_out && WIFEXITED(status)) {
    r.status = WEXITSTATUS(status);
  }
  return r;
}

// The path of an executable named `name` in $PATH or the sbin directories; "" when none.
inline std::string find_program(const std::string& name) {
  const char* env = std::getenv("PATH");
  std::string dirs = std::string(env != nullptr ? env : "") + ":/usr/local/sbin:/usr/sbin:/sbin";
  std::stringstream in(dirs);
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty()) continue;
    const std::string path = dir + "/" + name;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

// "" when a NetnsCluster can run here, else why not (a reason to skip, not a failure).
inline std::string netns_unavailable() {
  if (::geteuid() != 0) return "not root: network namespaces, veths and nftables need root";
  if (find_program("ip").empty()) return "`ip` (iproute2) not found";
  if (find_program("nft").empty()) return "`nft` (nftables) not found; deploy/setup.sh installs it";
  return "";
}

// ---- the cluster -------------------------------------------------------------------------------

class NetnsCluster {
 public:
  static constexpr uint16_t kCheckPort = 7350, kAdminPort = 7351, kPeerPort = 7352;

  // `spec.placement` is replaced: node i runs in namespace sluice-P-(i+1). Nodes beyond
  // spec.nodes (add_node) are not supported: only spec.nodes namespaces are made.
  explicit NetnsCluster(ClusterSpec spec)
      : spec_(std::move(spec)),
        pid_(static_cast<unsigned>(::getpid())),
        ip_(find_program("ip")),
        nft_(find_program("nft")) {}

  ~NetnsCluster() {
    cluster_
        .reset();  // kill the nodes first: a namespace outlives its name while a process is in it
    teardown();
  }

  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  // Removes leftovers of dead runs, builds the network, starts the nodes and waits until every
  // one lists all of them alive. "" or the error (the cluster is then not usable).
  std::string start(milliseconds converge_timeout = milliseconds(20000)) {
    if (std::string why = netns_unavailable(); !why.empty()) return why;
    remove_leftovers();
    if (std::string err = build_network(); !err.empty()) return "network: " + err;
    ClusterSpec spec = spec_;
    spec.placement = [this](size_t i) {
      NodePlacement p;
      p.host = address(i);
      p.check_port = kCheckPort;
      p.admin_port = kAdminPort;
      p.peer_port = kPeerPort;
      p.launch_prefix = {ip_, "netns", "exec", netns(i)};
      return p;
    };
    cluster_ = std::make_unique<LocalCluster>(std::move(spec));
    return cluster_->start(converge_timeout);
  }

  // Valid after start().
  LocalCluster& cluster() { return *cluster_; }
  size_t size() const { return spec_.nodes; }
  std::string netns(size_t i) const { return "sluice-" + std::to_string(pid_) + "-" + num(i); }
  std::string address(size_t i) const { return subnet_ + num(i); }
  std::string driver_address() const { return subnet_ + "254"; }

  // ---- faults: each adds rules to what is there; heal() removes them all ----

  // The nodes in `side` and the others stop exchanging peer traffic and forwarded checks, both
  // ways (each drops what the other side sends it).
  std::string split(const std::vector<size_t>& side) {
    std::vector<bool> in_side(size(), false);
    for (size_t i : side)
      in_side.at(i) = true;
    for (size_t i = 0; i < size(); ++i) {
      std::vector<size_t> other;
      for (size_t j = 0; j < size(); ++j) {
        if (in_side[j] != in_side[i]) other.push_back(j);
      }
      if (std::string err = drop_from(i, other, 100); !err.empty()) return err;
    }
    return "";
  }

  // Node i still sends to the others but drops everything they send it (a one-way fault), or
  // `percent` % of it at random (one-way loss).
  std::string deafen(size_t i, unsigned percent = 100) { return drop_from(i, all_but(i), percent); }

  // Every node drops `percent` % of what the other nodes send it, at random per packet.
  std::string lose(unsigned percent) {
    for (size_t i = 0; i < size(); ++i) {
      if (std::string err = drop_from(i, all_but(i), percent); !err.empty()) return err;
    }
    return "";
  }

  // Deletes every fault rule in every namespace.
  std::string heal() {
    std::string errors;
    for (size_t i = 0; i < size(); ++i) {
      // Declaring the table first makes the delete succeed whether or not a fault was set.
      const std::string err =
          nft(i, "table inet sluice_fault {}\ndelete table inet sluice_fault\n", "heal");
      if (!err.empty()) errors += err + "; ";
    }
    return errors;
  }

  struct FaultCounters {
    uint64_t seen = 0;     // packets from the faulted-against nodes that reached the rules
    uint64_t dropped = 0;  // of which the rules dropped
  };
  // Summed over the nodes' current fault tables (zero after heal()).
  FaultCounters fault_counters() const {
    FaultCounters c;
    static const std::regex packets(R"(counter packets (\d+) bytes)");
    for (size_t i = 0; i < size(); ++i) {
      const CommandResult r = run_command(
          {ip_, "netns", "exec", netns(i), nft_, "list", "table", "inet", "sluice_fault"});
      if (r.status != 0) continue;
      std::stringstream in(r.output);
      for (std::string line; std::getline(in, line);) {
        std::smatch m;
        if (!std::regex_search(line, m, packets)) continue;
        const uint64_t n = std::strtoull(m[1].str().c_str(), nullptr, 10);
        (line.find(" drop") != std::string::npos ? c.dropped : c.seen) += n;
      }
    }
    return c;
  }

  // Deletes namespaces sluice-P-k and links sluP-* whose P is not a live process (or is this
  // process: one NetnsCluster at a time, so they are a previous one's). Returns how many.
  size_t remove_leftovers() const {
    size_t removed = 0;
    const auto stale = [this](const std::string& pid_text) {
      const long p = std::strtol(pid_text.c_str(), nullptr, 10);
      if (p <= 0) return false;
      if (static_cast<unsigned>(p) == pid_) return true;
      return ::kill(static_cast<pid_t>(p), 0) != 0 && errno == ESRCH;
    };
    static const std::regex link_name(R"(^\d+: (slu(\d+)-[0-9a-z]+)[@:])");
    std::stringstream links(run_command({ip_, "-o", "link", "show"}).output);
    for (std::string line; std::getline(links, line);) {
      std::smatch m;
      if (std::regex_search(line, m, link_name) && stale(m[2].str())) {
        if (run_command({ip_, "link", "del", m[1].str()}).status == 0) ++removed;
      }
    }
    static const std::regex ns_name(R"(^(sluice-(\d+)-\d+)\b)");
    std::stringstream spaces(run_command({ip_, "netns", "list"}).output);
    for (std::string line; std::getline(spaces, line);) {
      std::smatch m;
      if (std::regex_search(line, m, ns_name) && stale(m[2].str())) {
        if (run_command({ip_, "netns", "del", m[1].str()}).status == 0) ++removed;
      }
    }
    return removed;
  }

 private:
  static std::string num(size_t i) { return std::to_string(i + 1); }
  std::string bridge() const { return "slu" + std::to_string(pid_) + "-br"; }
  std::string veth(size_t i) const { return "slu" + std::to_string(pid_) + "-" + num(i); }

  std::vector<size_t> all_but(size_t skip) const {
    std::vector<size_t> out;
    for (size_t j = 0; j < size(); ++j) {
      if (j != skip) out.push_back(j);
    }
    return out;
  }

  // Runs `ip args...`; "" or the command and its output.
  std::string ip(std::vector<std::string> args) {
    args.insert(args.begin(), ip_);
    const CommandResult r = run_command(args);
    if (r.status == 0) return "";
    std::string cmd;
    for (const std::string& a : args)
      cmd += a + " ";
    return cmd + "-> " + std::to_string(r.status) + ": " + r.output;
  }

  // A /24 of 10/8 that the root namespace has no address or route in.
  std::string pick_subnet() {
    const std::string taken = run_command({ip_, "-4", "-o", "addr", "show"}).output +
                              run_command({ip_, "-4", "route", "show", "table", "all"}).output;
    const unsigned a = 200 + (pid_ / 256) % 50;
    for (unsigned k = 0; k < 256; ++k) {
      const std::string net =
          "10." + std::to_string(a) + "." + std::to_string((pid_ + k) % 256) + ".";
      if (taken.find(" " + net) == std::string::npos &&
          taken.find("\n" + net) == std::string::npos && taken.compare(0, net.size(), net) != 0) {
        return net;
      }
    }
    return "";
  }

  std::string build_network() {
    subnet_ = pick_subnet();
    if (subnet_.empty()) return "no free 10.x.y.0/24";
    built_ = true;
    if (std::string e = ip({"link", "add", bridge(), "type", "bridge"}); !e.empty()) return e;
    if (std::string e = ip({"addr", "add", driver_address() + "/24", "dev", bridge()});
        !e.empty()) {
      return e;
    }
    if (std::string e = ip({"link", "set", bridge(), "up"}); !e.empty()) return e;
    for (size_t i = 0; i < size(); ++i) {
      const std::string ns = netns(i);
      for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
               {"netns", "add", ns},
               {"link", "add", veth(i), "type", "veth", "peer", "name", "eth0", "netns", ns},
               {"link", "set", veth(i), "master", bridge()},
               {"link", "set", veth(i), "up"},
               {"-n", ns, "addr", "add", address(i) + "/24", "dev", "eth0"},
               {"-n", ns, "link", "set", "eth0", "up"},
               {"-n", ns, "link", "set", "lo", "up"}}) {
        if (std::string e = ip(cmd); !e.empty()) return e;
      }
    }
    return "";
  }

  void teardown() {
    if (!built_) return;
    for (size_t i = 0; i < size(); ++i) {
      ip({"link", "del", veth(i)});  // both ends, at once (a namespace's own go asynchronously)
      ip({"netns", "del", netns(i)});
    }
    ip({"link", "del", bridge()});
  }

  // Applies an nft script in node i's namespace ("" or the error); `what` names it in errors and
  // in the script's file name (kept in the cluster's directory for a look).
  std::string nft(size_t i, const std::string& script, const std::string& what) {
    if (!cluster_) return "nft " + what + ": not started";
    const std::filesystem::path file =
        cluster_->dir() / ("nft-" + num(i) + "-" + std::to_string(++scripts_) + "-" + what);
    std::ofstream(file) << script;
    const CommandResult r =
        run_command({ip_, "netns", "exec", netns(i), nft_, "-f", file.string()});
    if (r.status == 0) return "";
    return "nft " + what + " in " + netns(i) + ": " + r.output;
  }

  // Node i drops `percent` % (100: all) of the packets the nodes `from` send to its check and
  // peer ports or from theirs. The two rules are disjoint, so each packet is drawn once.
  std::string drop_from(size_t i, const std::vector<size_t>& from, unsigned percent) {
    if (from.empty()) return "";
    std::string saddr = "ip saddr { ";
    for (size_t k = 0; k < from.size(); ++k)
      saddr += (k ? ", " : "") + address(from[k]);
    saddr += " } meta l4proto { tcp, udp } ";
    const std::string ports =
        "{ " + std::to_string(kCheckPort) + ", " + std::to_string(kPeerPort) + " }";
    const std::string chance =
        percent >= 100 ? "" : "numgen random mod 100 < " + std::to_string(percent) + " ";
    const std::string rule = "add rule inet sluice_fault input " + saddr;
    const std::string script =
        "table inet sluice_fault {\n  chain input {\n"
        "    type filter hook input priority 0; policy accept;\n  }\n}\n" +
        rule + "counter\n" +  // seen: every packet from those nodes
        rule + "th dport " + ports + " " + chance + "counter drop\n" + rule + "th sport " + ports +
        " th dport != " + ports + " " + chance + "counter drop\n";
    return nft(i, script, "drop");
  }

  ClusterSpec spec_;
  unsigned pid_;
  std::string ip_, nft_;  // paths
  std::string subnet_;    // "10.A.B."
  bool built_ = false;    // build_network() ran (teardown deletes what it may have made)
  unsigned scripts_ = 0;
  std::unique_ptr<LocalCluster> cluster_;  // declared last: its nodes die before the network
};

// ---- a fault under load ------------------------------------------------------------------------

// Sum over the running nodes of "membership.deaths_declared" of /v1/cluster (suspicion timeouts
// that ended on that node); nullopt when one does not answer.
inline std::optional<uint64_t> deaths_declared(LocalCluster& c) {
  uint64_t sum = 0;
  for (size_t i : c.running_nodes()) {
    const auto j = c.cluster_json(i);
    if (!j) return std::nullopt;
    sum += j->value("membership", Json::object()).value("deaths_declared", uint64_t{0});
  }
  return sum;
}

struct FaultRunOptions {
  // Sets the fault ("" or the error); the run heals it after `fault`.
  std::function<std::string(NetnsCluster&)> apply;
  LoadOptions load;  // keys, key_domains, rate, failover, timeout; duration is set from below
  std::vector<size_t> targets;  // nodes the traffic is spread over; empty: all
  milliseconds before{2000}, fault{10000}, after{6000};
  milliseconds merge_timeout{15000};  // after the heal, until every node lists all alive
};

struct FaultRunResult {
  std::vector<CheckRecord> records;
  int64_t fault_us = 0, heal_us = 0, end_us = 0;  // since the load's start
  std::optional<double> merged_s;                 // heal until every node listed every node alive
  std::optional<uint64_t> deaths_before, deaths_at_heal, deaths_at_end;  // deaths_declared()
  NetnsCluster::FaultCounters counters;  // read just before the heal
  std::string views_at_heal;             // every node's member list just before the heal
  bool all_running = false;              // every node still running at the end
  std::string error;

  std::optional<uint64_t> deaths_during() const {
    if (!deaths_before || !deaths_at_heal) return std::nullopt;
    return *deaths_at_heal - *deaths_before;
  }
  std::optional<uint64_t> deaths_after() const {
    if (!deaths_at_heal || !deaths_at_end) return std::nullopt;
    return *deaths_at_end - *deaths_at_heal;
  }
  // Most admitted checks of `key` in a true 1 s window within [from, to) / limit.
  double ratio(int key, uint64_t limit, int64_t from_us, int64_t to_us) const {
    return static_cast<double>(
               max_in_sliding_window(admit_times(records, key, from_us, to_us), 1'000'000)) /
           static_cast<double>(limit);
  }
  double during_fault(int key, uint64_t limit) const {
    return ratio(key, limit, fault_us, heal_us);
  }
  // The checks of `key` admitted in each 100 ms from 1 s before the fault to 2 s after the heal,
  // by the node they were sent to: "t:n1+n2+... " per 100 ms with any admitted, t in s.
  std::string node_timeline(int key, size_t nodes) const {
    const int64_t step = 100'000, from = fault_us - 1'000'000;
    const int64_t to = std::min(end_us, heal_us + 2'000'000);
    if (to <= from) return "";
    std::vector<std::vector<uint32_t>> per(static_cast<size_t>((to - from) / step) + 1,
                                           std::vector<uint32_t>(nodes, 0));
    for (const CheckRecord& r : records) {
      if (r.key != static_cast<uint32_t>(key) || r.outcome != CheckOutcome::kAllowed) continue;
      if (r.send_us < from || r.send_us >= to || r.node >= nodes) continue;
      ++per[static_cast<size_t>((r.send_us - from) / step)][r.node];
    }
    std::string out;
    char t[32];
    for (size_t i = 0; i < per.size(); ++i) {
      if (std::all_of(per[i].begin(), per[i].end(), [](uint32_t n) { return n == 0; })) continue;
      std::snprintf(t, sizeof t,
                    "%.1f:", static_cast<double>(from + static_cast<int64_t>(i) * step) / 1e6);
      out += t;
      for (size_t k = 0; k < nodes; ++k)
        out += (k ? "+" : "") + std::to_string(per[i][k]);
      out += ' ';
    }
    return out;
  }
  // From 1 s after the heal to the end.
  double after_heal(int key, uint64_t limit) const {
    return ratio(key, limit, heal_us + 1'000'000, INT64_MAX);
  }
  uint64_t failed(int key, int64_t from_us = INT64_MIN, int64_t to_us = INT64_MAX) const {
    uint64_t n = 0;
    for (const CheckRecord& r : records) {
      if (r.outcome == CheckOutcome::kFailed && r.key == static_cast<uint32_t>(key) &&
          r.send_us >= from_us && r.send_us < to_us) {
        ++n;
      }
    }
    return n;
  }
};

// Traffic for before + fault + after; the fault set at `before` and healed `fault` later; then
// the time until membership merged (polled every 100 ms, bounded by merge_timeout, traffic still
// running) and the deaths declared during and after the fault. Every wait is bounded.
inline FaultRunResult run_fault_under_load(NetnsCluster& net, FaultRunOptions o) {
  FaultRunResult res;
  LocalCluster& c = net.cluster();
  o.load.duration = o.before + o.fault + o.after;
  LoadDriver load(o.load, c.check_addresses());
  std::vector<size_t> targets = o.targets;
  if (targets.empty()) {
    for (size_t i = 0; i < c.size(); ++i)
      targets.push_back(i);
  }
  res.deaths_before = deaths_declared(c);
  if (res.error = load.start(targets); !res.error.empty()) return res;
  const auto t0 = SteadyClock::now();
  std::this_thread::sleep_until(t0 + o.before);
  res.fault_us = load.now_us();
  if (res.error = o.apply(net); !res.error.empty()) {
    net.heal();
    load.wait();
    return res;
  }
  std::this_thread::sleep_until(t0 + o.before + o.fault);
  res.counters = net.fault_counters();
  res.views_at_heal = c.describe();
  res.deaths_at_heal = deaths_declared(c);
  const auto healing = SteadyClock::now();
  res.error = net.heal();
  res.heal_us = load.now_us();
  if (c.wait_all_alive(o.merge_timeout)) {
    res.merged_s = std::chrono::duration<double>(SteadyClock::now() - healing).count();
  }
  if (!load.wait() && res.error.empty()) res.error = "some checks never completed";
  res.end_us = load.now_us();
  res.records = load.records();
  res.deaths_at_end = deaths_declared(c);
  res.all_running = c.running_nodes().size() == c.size();
  return res;
}

}  // namespace sluice::testing
