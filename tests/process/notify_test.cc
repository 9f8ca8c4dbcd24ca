// systemd's readiness protocol on a real sluiced (daemon/sd_notify.h): with NOTIFY_SOCKET set,
// sluiced sends READY=1 once its check port answers, RELOADING=1 and READY=1 around a SIGHUP
// reload, and STOPPING=1 when SIGTERM starts its stop; to a path socket and to an abstract one.
// The test's datagram socket stands in for systemd's. Every wait is bounded (at most 10 s).
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "sluiced_process.h"

namespace {

using sluice::testing::Daemon;
using sluice::testing::DaemonConfig;
using Clock = std::chrono::steady_clock;

constexpr const char* kRules = R"(domains:
  - name: t
    rules:
      - name: per-user
        key: [user]
        limits: [100/1m]
)";

DaemonConfig notify_config() {
  DaemonConfig c;
  c.rules = kRules;
  return c;
}

// A bound AF_UNIX datagram socket: a path (starting with '/') or an abstract name ('@...', as in
// NOTIFY_SOCKET).
class NotifySocket {
 public:
  explicit NotifySocket(std::string name) : name_(std::move(name)) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    REQUIRE(name_.size() < sizeof a.sun_path);
    std::memcpy(a.sun_path, name_.data(), name_.size());
    socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_.size());
    if (name_[0] == '@') {
      a.sun_path[0] = '\0';
    } else {
      len = static_cast<socklen_t>(len + 1);
    }
    REQUIRE(::bind(fd_, reinterpret_cast<const sockaddr*>(&a), len) == 0);
  }
  ~NotifySocket() {
    ::close(fd_);
    if (name_[0] == '/') ::unlink(name_.c_str());
  }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  const std::string& name() const { return name_; }

  // The next datagram, or nullopt when none came within timeout_ms.
  std::optional<std::string> next(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return std::nullopt;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0) return std::nullopt;
    return std::string(buf, static_cast<size_t>(n));
  }

  // The next datagram that holds `line` as one of its lines (others are skipped), within
  // timeout_ms in all.
  std::optional<std::string> wait_for(const std::string& line, int timeout_ms) {
    const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) return std::nullopt;
      auto msg = next(static_cast<int>(left));
      if (!msg) return std::nullopt;
      if (("\n" + *msg + "\n").find("\n" + line + "\n") != std::string::npos) return msg;
    }
  }

 private:
  std::string name_;
  int fd_ = -1;
};

// Starts sluiced on `d`'s ports, rules and data directory (log level info) with NOTIFY_SOCKET set
// to `notify_socket`, without waiting for it: the test decides what "ready" means. `d` owns the
// process from here on (killed at its destruction).
// `extra`: more lines of config (a cluster section).
void spawn_with_notify(Daemon& d, const std::string& notify_socket, const std::string& extra = "") {
  const auto config = d.dir / "notify.yaml";
  std::ofstream(config) << "udp: 127.0.0.1:" << d.port << "\ntcp: 127.0.0.1:" << d.port
                        << "\nadmin: 127.0.0.1:" << d.admin << "\ngrpc: 127.0.0.1:" << d.grpc
                        << "\nresp: 127.0.0.1:" << d.resp << "\nrules: " << d.rules_file().string()
                        << "\ndata_dir: " << d.data_dir.string()
                        << "\ninit_data: true\nlog_level: info\n"
                        << extra;
  // The child inherits the environment at fork; the test's own stays as it was.
  REQUIRE(::setenv("NOTIFY_SOCKET", notify_socket.c_str(), 1) == 0);
  d.pid = sluice::testing::spawn({SLUICED_BIN, "--config", config.string()}, d.dir / "notify.log",
                                 d.dir / "notify.log");
  ::unsetenv("NOTIFY_SOCKET");
}

std::string node_log(const Daemon& d) {
  return sluice::testing::read_text(d.dir / "notify.log");
}

// READY=1 (with a status naming the port) arrives, and at that moment a check is answered at
// once; nothing else was sent before it. Then SIGTERM brings STOPPING=1 and a clean exit.
void ready_then_stopping(Daemon& d, NotifySocket& sock) {
  const auto first = sock.next(10'000);
  REQUIRE_MESSAGE(first.has_value(), "no notification within 10 s; log:\n" << node_log(d));
  CHECK(first->find("READY=1") != std::string::npos);
  CHECK(first->find("STATUS=serving: udp " + std::to_string(d.port)) != std::string::npos);
  // The first check after READY, with a short timeout: the port must already answer.
  const auto answer = d.check("t", {{"user", "u1"}}, 1);
  REQUIRE_MESSAGE(answer.has_value(), "READY=1 came before the check port answered");
  REQUIRE(answer->decisions.size() == 1);
  CHECK(answer->decisions[0].allowed);

  d.signal(SIGTERM);
  const auto stopping = sock.wait_for("STOPPING=1", 10'000);
  REQUIRE_MESSAGE(stopping.has_value(), "no STOPPING=1 within 10 s of SIGTERM; log:\n"
                                            << node_log(d));
  const int status = d.wait_exit(10'000);
  REQUIRE_MESSAGE(status != -1, "sluiced still running 10 s after SIGTERM");
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace

TEST_CASE(
    "sluiced sends READY=1 to a path NOTIFY_SOCKET once checks are answered, STOPPING=1 on "
    "SIGTERM") {
  Daemon d(notify_config(), false);
  NotifySocket sock((d.dir / "notify.sock").string());
  spawn_with_notify(d, sock.name());
  ready_then_stopping(d, sock);
}

TEST_CASE("sluiced notifies an abstract NOTIFY_SOCKET (@name)") {
  Daemon d(notify_config(), false);
  NotifySocket sock("@sluice-notify-test-" + std::to_string(::getpid()) + "-" +
                    std::to_string(d.port));
  spawn_with_notify(d, sock.name());
  ready_then_stopping(d, sock);
}

TEST_CASE("sluiced sends RELOADING=1 with MONOTONIC_USEC, then READY=1, around a SIGHUP reload") {
  Daemon d(notify_config(), false);
  NotifySocket sock((d.dir / "notify.sock").string());
  spawn_with_notify(d, sock.name());
  REQUIRE_MESSAGE(sock.wait_for("READY=1", 10'000).has_value(), "no READY=1; log:\n"
                                                                    << node_log(d));

  d.signal(SIGHUP);
  const auto reloading = sock.wait_for("RELOADING=1", 10'000);
  REQUIRE_MESSAGE(reloading.has_value(), "no RELOADING=1 after SIGHUP; log:\n" << node_log(d));
  CHECK(reloading->find("\nMONOTONIC_USEC=") != std::string::npos);
  const auto ready = sock.next(10'000);
  REQUIRE(ready.has_value());
  CHECK(ready->find("READY=1") != std::string::npos);
  CHECK(ready->find("STATUS=serving") != std::string::npos);

  // A rules file with an error: the old rules stay, and the node says it is ready again.
  d.write_rules("domains: [oops");
  d.signal(SIGHUP);
  REQUIRE(sock.wait_for("RELOADING=1", 10'000).has_value());
  const auto after_failure = sock.next(10'000);
  REQUIRE(after_failure.has_value());
  CHECK(after_failure->find("READY=1") != std::string::npos);
  CHECK(after_failure->find("STATUS=rules not reloaded") != std::string::npos);
  CHECK(d.check("t", {{"user", "u1"}}, 1).has_value());
}

TEST_CASE("an unusable NOTIFY_SOCKET is logged and the node serves all the same") {
  Daemon d(notify_config(), false);
  spawn_with_notify(d, "relative/notify.sock");
  const auto until = Clock::now() + std::chrono::seconds(10);
  bool answered = false;
  while (!answered && Clock::now() < until)
    answered = d.check("t", {{"user", "u1"}}, 1).has_value();
  REQUIRE_MESSAGE(answered, "sluiced did not answer within 10 s; log:\n" << node_log(d));
  // The warning is logged where READY=1 would have been sent: about when the port answers.
  bool warned = false;
  while (!warned && Clock::now() < until + std::chrono::seconds(10)) {
    warned = node_log(d).find("NOTIFY_SOCKET=relative/notify.sock: only path") != std::string::npos;
    if (!warned) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK_MESSAGE(warned, "no warning about NOTIFY_SOCKET; log:\n" << node_log(d));
  CHECK(d.stop() != -1);
}

// In a cluster READY=1 waits for what /readyz waits for: the first join's outcome. Its only seed
// never answers, so the node is ready alone once every join round went unanswered (5 rounds, 1 s
// apart), not when its ports open; then checks are answered.
TEST_CASE("sluiced in a cluster sends READY=1 only once its first join has an outcome") {
  Daemon d(notify_config(), false);
  NotifySocket sock((d.dir / "notify.sock").string());
  const uint16_t peer = sluice::testing::free_loopback_port();
  const uint16_t silent_seed = sluice::testing::free_loopback_port();
  const auto started = Clock::now();
  spawn_with_notify(d, sock.name(),
                    "cluster:\n  node_id: 1\n  listen: 127.0.0.1:" + std::to_string(peer) +
                        "\n  seeds: [127.0.0.1:" + std::to_string(silent_seed) + "]\n  secret: \"" +
                        std::string(64, 'a') + "\"\n");
  const auto ready = sock.wait_for("READY=1", 20'000);
  REQUIRE_MESSAGE(ready.has_value(), "no READY=1 within 20 s; log:\n" << node_log(d));
  const auto waited = Clock::now() - started;
  CHECK_MESSAGE(waited >= std::chrono::milliseconds(2'000),
                "READY=1 came before the join rounds ended; log:\n"
                    << node_log(d));
  CHECK(ready->find("in its cluster") != std::string::npos);
  CHECK(node_log(d).find("cluster: ready alone") != std::string::npos);
  const auto answer = d.check("t", {{"user", "u1"}}, 1);
  REQUIRE(answer.has_value());
  CHECK(answer->decisions[0].allowed);
}
