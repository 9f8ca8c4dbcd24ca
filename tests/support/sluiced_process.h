// Process-test support: a real sluiced on free loopback ports, started with fork/exec from a
// config file this helper writes, driven over the wire protocol (UDP), signalled (SIGHUP,
// SIGTERM, SIGKILL), restarted on the same ports and data directory, and operated with sluicectl.
//
// Contract:
// - Everything stays on 127.0.0.1. Ports come from free_port() (free_port.h): free when probed
//   and below the ephemeral range, so a test that restarts a daemon reuses ports it already held
//   and no client socket can be handed them in between.
// - Every wait is bounded (start: 10 s, exit: the caller's timeout, a program run: 10 s by
//   default); a process still running when its Daemon is destroyed gets SIGKILL and is reaped.
// - The Daemon owns a scratch directory (config, rules, logs, and the data directory unless the
//   test names another one) and removes it at destruction.
// - The test binary must define SLUICED_BIN; ctl() exists when it also defines SLUICECTL_BIN
//   (tests/CMakeLists.txt passes both as $<TARGET_FILE:...>).
// - Not thread-safe: one test thread drives a Daemon.
#pragma once

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "free_port.h"
#include "wire/protocol.h"

#ifndef SLUICED_BIN
#error "define SLUICED_BIN, the path of the sluiced binary (tests/CMakeLists.txt)"
#endif

namespace sluice::testing {

inline uint16_t free_port() {
  const uint16_t port = free_loopback_port();
  REQUIRE_MESSAGE(port != 0, "no free loopback port below the ephemeral range");
  return port;
}

inline sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

inline std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Starts `argv` (argv[0] is the program's path) with stdout and stderr sent to the given files
// (the same file twice merges them). Returns the child's pid.
inline pid_t spawn(const std::vector<std::string>& argv, const std::filesystem::path& out,
                   const std::filesystem::path& err) {
  REQUIRE(!argv.empty());
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string out_path = out.string();
  const std::string err_path = err.string();
  const bool merged = out_path == err_path;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = merged ? o : ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) std::_Exit(126);
    ::dup2(o, STDOUT_FILENO);
    ::dup2(e, STDERR_FILENO);
    ::execv(args[0], args.data());
    std::_Exit(127);
  }
  REQUIRE(pid > 0);
  return pid;
}

// Waits for `pid` to exit (bounded); returns its wait status and sets pid to -1, or returns -1
// (pid unchanged) when it is still running after timeout_ms.
inline int wait_exit(pid_t& pid, int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      return status;
    }
    if (std::chrono::steady_clock::now() >= until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// A program run to its end.
struct ProcessResult {
  int status = -1;  // wait status; -1: still running at the timeout (then killed)
  std::string out;  // stdout
  std::string err;  // stderr
  // The exit code, or -1 when the program did not exit normally (timeout or signal).
  int exit_code() const { return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

// Runs `argv` to completion, at most timeout_ms (then SIGKILL), capturing stdout and stderr in
// files under `scratch`.
inline ProcessResult run_process(const std::vector<std::string>& argv,
                                 const std::filesystem::path& scratch, int timeout_ms = 10'000) {
  static int runs = 0;
  const std::string stem = "run-" + std::to_string(++runs);
  const auto out = scratch / (stem + ".out");
  const auto err = scratch / (stem + ".err");
  pid_t pid = spawn(argv, out, err);
  ProcessResult r;
  r.status = wait_exit(pid, timeout_ms);
  if (r.status == -1) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

// How a Daemon is configured. Every start writes the config file from it.
struct DaemonConfig {
  std::string rules;  // the rules file's text
  // The data directory; empty: <scratch>/data. Kept across restarts of the same Daemon.
  std::filesystem::path data_dir;
  bool init_data = true;
  std::optional<int64_t> snapshot_interval_ms;  // unset: sluiced's default
  std::vector<std::string> extra_config;        // more config lines, e.g. "sweep_interval_ms: 100"
  unsigned threads = 2;
  std::string log_level = "warn";
  // Checks to this domain tell when the node is up: any answer will do (an unknown domain is
  // answered with an error code and counts nothing).
  std::string probe_domain = "sluice-test-probe";
};

class Daemon {
 public:
  // Creates the scratch directory, picks the ports, writes the rules; starts the node when
  // `start_now` (and fails the test if it is not answering within 10 s).
  explicit Daemon(DaemonConfig config, bool start_now = true) : config_(std::move(config)) {
    dir = std::filesystem::temp_directory_path() / ("sluiced-test-" + std::to_string(::getpid()) +
                                                    "-" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir);
    data_dir = config_.data_dir.empty() ? dir / "data" : config_.data_dir;
    write_rules(config_.rules);
    port = free_port();
    admin = free_port();
    grpc = free_port();
    resp = free_port();
    if (start_now) start();
  }

  ~Daemon() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // The config of the next start (each start rewrites the config file): a test may change it,
  // or `data_dir`, while the node is stopped.
  DaemonConfig& config() { return config_; }
  std::filesystem::path config_file() const { return dir / "sluiced.yaml"; }
  std::filesystem::path rules_file() const { return dir / "rules.yaml"; }
  std::string admin_address() const { return "127.0.0.1:" + std::to_string(admin); }

  // Replaces the rules file atomically (a SIGHUP then reloads it).
  void write_rules(const std::string& text) {
    std::ofstream(dir / "rules.yaml.tmp") << text;
    std::filesystem::rename(dir / "rules.yaml.tmp", rules_file());
  }

  // Starts sluiced (not running now) on this Daemon's ports and data directory and waits, at
  // most 10 s, until it answers a check; fails the test, with the node's log, otherwise.
  void start(const std::vector<std::string>& extra_args = {}) {
    REQUIRE(pid == -1);
    const auto log = next_log();
    pid = spawn(argv(extra_args), log, log);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      if (check(config_.probe_domain, {{"probe", "1"}}, 0).has_value()) return;
      if (const int status = testing::wait_exit(pid, 0); status != -1) {
        FAIL("sluiced exited at start (status " << status << "):\n" << read_text(log));
      }
    }
    FAIL("sluiced did not answer within 10 s:\n" << read_text(log));
  }

  // Starts sluiced as start() would, expecting it to exit by itself (a start that must fail);
  // at most timeout_ms, then it is killed and the result's status is -1.
  ProcessResult run_to_exit(const std::vector<std::string>& extra_args = {},
                            int timeout_ms = 10'000) {
    REQUIRE(pid == -1);
    write_config();
    return run_process(argv(extra_args), dir, timeout_ms);
  }

  // Starts it again on the same ports and data directory after stop() or kill9().
  void restart(const std::vector<std::string>& extra_args = {}) { start(extra_args); }

  bool running() const { return pid > 0; }

  void signal(int sig) {
    REQUIRE(pid > 0);
    REQUIRE(::kill(pid, sig) == 0);
  }

  // SIGKILL, then reaps the process. Returns its wait status.
  int kill9() {
    signal(SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    pid = -1;
    return status;
  }

  // SIGTERM, then waits (bounded) for the exit. Returns the wait status, or -1 on timeout.
  int stop(int timeout_ms = 10'000) {
    signal(SIGTERM);
    return wait_exit(timeout_ms);
  }

  // Waits for the process to exit (bounded); returns its wait status, or -1 on timeout.
  int wait_exit(int timeout_ms) { return testing::wait_exit(pid, timeout_ms); }

  // What the latest start wrote to stdout and stderr (its log lines and error messages).
  std::string log() const { return starts_ == 0 ? std::string() : read_text(log_path(starts_)); }

  // ---- checks over UDP (the wire protocol) ----------------------------------------------------

  // Sends raw bytes as one datagram; returns the answer bytes, or nullopt after the timeout.
  std::optional<std::vector<uint8_t>> udp_raw(const std::vector<uint8_t>& bytes,
                                              int timeout_ms = 300) const {
    const int s = ::socket(AF_INET, SOCK_DGRAM, 0);
    const sockaddr_in a = loopback(port);
    ::sendto(s, bytes.data(), bytes.size(), 0, reinterpret_cast<const sockaddr*>(&a), sizeof a);
    pollfd p{s, POLLIN, 0};
    std::optional<std::vector<uint8_t>> out;
    if (::poll(&p, 1, timeout_ms) == 1) {
      std::vector<uint8_t> buf(70'000);
      const ssize_t n = ::recv(s, buf.data(), buf.size(), 0);
      if (n >= 0) {
        buf.resize(static_cast<size_t>(n));
        out = std::move(buf);
      }
    }
    ::close(s);
    return out;
  }

  // One check; nullopt when no decodable answer came within 300 ms.
  std::optional<wire::Answer> check(const std::string& domain,
                                    const std::vector<std::pair<std::string, std::string>>& entries,
                                    int64_t hits, size_t pad = 512) const {
    std::vector<wire::Entry> es;
    for (const auto& [k, v] : entries)
      es.push_back({k, v});
    const wire::Check c{domain, es, hits};
    std::vector<uint8_t> req;
    wire::encode_request(42, {&c, 1}, pad, req);
    auto bytes = udp_raw(req);
    if (!bytes) return std::nullopt;
    wire::Answer a;
    if (wire::decode_answer(*bytes, a) != wire::Code::kOk) return std::nullopt;
    return a;
  }

  // A check keyed by one `user` entry, the shape most process tests use.
  std::optional<wire::Answer> udp_check(const std::string& user, int64_t hits,
                                        const std::string& domain = "t", size_t pad = 512) const {
    return check(domain, {{"user", user}}, hits, pad);
  }

  // Sends n checks of 1 hit for `user`; returns how many were allowed. Every check must be
  // answered with one decision.
  int admitted(int n, const std::string& user, const std::string& domain = "t") const {
    int ok = 0;
    for (int i = 0; i < n; ++i) {
      auto a = udp_check(user, 1, domain);
      REQUIRE(a.has_value());
      REQUIRE(a->decisions.size() == 1);
      ok += a->decisions[0].allowed ? 1 : 0;
    }
    return ok;
  }

#ifdef SLUICECTL_BIN
  // Runs `sluicectl ARGS... --admin 127.0.0.1:<admin>` to its end (at most 10 s). Only for the
  // commands that talk to the admin port (every one but `check`).
  ProcessResult ctl(std::vector<std::string> args) const {
    args.insert(args.begin(), SLUICECTL_BIN);
    args.push_back("--admin");
    args.push_back(admin_address());
    return run_process(args, dir);
  }
#endif

  std::filesystem::path dir;       // scratch: config, rules, logs (removed at destruction)
  std::filesystem::path data_dir;  // config().data_dir, or <dir>/data
  uint16_t port = 0;               // UDP and TCP checks
  uint16_t admin = 0;              // admin HTTP
  uint16_t grpc = 0;               // the gRPC front (Envoy's rate limit service)
  uint16_t resp = 0;               // the RESP (Redis protocol) door
  pid_t pid = -1;                  // the running sluiced, -1 when none

 private:
  void write_config() const {
    std::ofstream f(config_file());
    f << "udp: 127.0.0.1:" << port << "\ntcp: 127.0.0.1:" << port << "\nadmin: 127.0.0.1:" << admin
      << "\ngrpc: 127.0.0.1:" << grpc << "\nresp: 127.0.0.1:" << resp
      << "\nrules: " << rules_file().string() << "\nthreads: " << config_.threads
      << "\nlog_level: " << config_.log_level << "\ndata_dir: " << data_dir.string()
      << "\ninit_data: " << (config_.init_data ? "true" : "false") << "\n";
    if (config_.snapshot_interval_ms) {
      f << "snapshot_interval_ms: " << *config_.snapshot_interval_ms << "\n";
    }
    for (const std::string& line : config_.extra_config)
      f << line << "\n";
  }

  std::vector<std::string> argv(const std::vector<std::string>& extra_args) const {
    write_config();
    std::vector<std::string> a{SLUICED_BIN, "--config", config_file().string()};
    a.insert(a.end(), extra_args.begin(), extra_args.end());
    return a;
  }

  std::filesystem::path log_path(int start) const {
    return dir / ("sluiced-" + std::to_string(start) + ".log");
  }
  std::filesystem::path next_log() {
    return log_path(++starts_);
  }

  DaemonConfig config_;
  int starts_ = 0;
};

}  // namespace sluice::testing
