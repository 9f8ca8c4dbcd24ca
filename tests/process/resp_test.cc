// The RESP door on a real sluiced, talked to by Debian's redis-cli (redis-tools) and by a raw
// socket: redis-cell's README example, a pipelined burst answered in order, DEL, redis-cell's
// error texts, AUTH with a password file, HELLO 3, deadlines, shedding over max_connections, and
// the door's /metrics.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sluiced_process.h"

namespace {

using sluice::testing::Daemon;
using sluice::testing::DaemonConfig;
using sluice::testing::ProcessResult;
using sluice::testing::run_process;

constexpr const char* kRedisCli = "/usr/bin/redis-cli";

constexpr const char* kRules = R"(domains:
  - name: api
    rules:
      - name: per-user
        key: [user]
        limits: [{limit: 3, window: 1m, name: per-user}]
  - name: modes
    rules:
      - name: shadow-ban
        key: [ip]
        limits: [1/1m]
        mode: shadow
      - name: trial
        key: [user]
        limits: [1/1m]
        mode: dry-run
)";

bool have_redis_cli() {
  return ::access(kRedisCli, X_OK) == 0;
}

// redis-cli against the door, its arguments after the port; stdout.
std::string cli(const Daemon& d, std::vector<std::string> args) {
  args.insert(args.begin(), {kRedisCli, "-p", std::to_string(d.resp)});
  const ProcessResult r = run_process(args, d.dir);
  INFO("redis-cli stderr: " << r.err);
  CHECK(r.exit_code() == 0);
  return r.out;
}

// Sends `bytes` on a new connection to 127.0.0.1:`port` and reads until `done(read)` holds, the
// peer closes, or 5 s pass.
template <class Done>
std::string exchange(uint16_t port, const std::string& bytes, Done done) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    REQUIRE(n > 0);
    sent += static_cast<size_t>(n);
  }
  std::string got;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done(got) && std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + what.size()))
    ++n;
  return n;
}

std::string metrics(const Daemon& d) {
  return exchange(d.admin, "GET /metrics HTTP/1.0\r\n\r\n", [](const std::string&) {
    return false;  // until the server closes
  });
}

std::string throttle_frame(const std::string& key, const std::string& burst,
                           const std::string& count, const std::string& period) {
  std::string f = "*5\r\n$11\r\nCL.THROTTLE\r\n";
  for (const std::string* a : {&key, &burst, &count, &period})
    f += "$" + std::to_string(a->size()) + "\r\n" + *a + "\r\n";
  return f;
}

DaemonConfig config() {
  DaemonConfig c;
  c.rules = kRules;
  return c;
}

}  // namespace

TEST_CASE("redis-cli: CL.THROTTLE answers redis-cell's README example, DEL resets the key") {
  REQUIRE_MESSAGE(have_redis_cli(), "no /usr/bin/redis-cli (deploy/setup.sh installs redis-tools)");
  Daemon d(config());
  CHECK(cli(d, {"CL.THROTTLE", "user123", "15", "30", "60"}) == "0\n16\n15\n-1\n2\n");
  CHECK(cli(d, {"CL.THROTTLE", "user123", "15", "30", "60"}) == "0\n16\n14\n-1\n4\n");
  CHECK(cli(d, {"DEL", "user123", "never-seen"}) == "1\n");
  CHECK(cli(d, {"CL.THROTTLE", "user123", "15", "30", "60"}) == "0\n16\n15\n-1\n2\n");
  // SELECT's database is part of the key: db 1's user123 is new.
  CHECK(cli(d, {"-n", "1", "CL.THROTTLE", "user123", "15", "30", "60"}) == "0\n16\n15\n-1\n2\n");
  // redis-cell's own texts, without ERR.
  CHECK(cli(d, {"CL.THROTTLE", "user123", "15", "0", "60"}) ==
        "Cell error: Store error: Zero rates are not supported\n\n");
  CHECK(cli(d, {"PING"}) == "PONG\n");
  // The rules' checks over RESP: 3 a minute per user.
  CHECK(cli(d, {"SLUICE.CHECK", "api", "user", "ann"}).starts_with("1\n3\n2\n"));
  CHECK(cli(d, {"SLUICE.CHECK", "api", "user", "ann", "HITS", "2"}).starts_with("1\n3\n0\n"));
  CHECK(cli(d, {"SLUICE.CHECK", "api", "user", "ann"}).starts_with("0\n3\n0\n"));
  // The modes reach the caller: a shadow denial (fail silently), a dry-run rule's would-deny.
  CHECK(cli(d, {"SLUICE.CHECK", "modes", "ip", "10.0.0.1"}).ends_with("\n0\n0\n"));
  const std::string shadow = cli(d, {"SLUICE.CHECK", "modes", "ip", "10.0.0.1"});
  CHECK(shadow.starts_with("0\n"));
  CHECK(shadow.ends_with("\n1\n0\n"));
  CHECK(cli(d, {"SLUICE.CHECK", "modes", "user", "eve"}).ends_with("\n0\n0\n"));
  const std::string trial = cli(d, {"SLUICE.CHECK", "modes", "user", "eve"});
  CHECK(trial.starts_with("1\n"));
  CHECK(trial.ends_with("\n0\n1\n"));

  const std::string m = metrics(d);
  CHECK(m.find("sluice_resp_connections_total ") != std::string::npos);
  CHECK(m.find(
            "sluice_rule_decisions_total{domain=\"redis\",rule=\"cell\",decision=\"allowed\"} 4") !=
        std::string::npos);
}

TEST_CASE("redis-cli -3: HELLO 3 answers Redis's map with proto 3") {
  REQUIRE_MESSAGE(have_redis_cli(), "no /usr/bin/redis-cli (deploy/setup.sh installs redis-tools)");
  Daemon d(config());
  const std::string hello = cli(d, {"-3", "HELLO", "3"});
  CHECK(hello.find("proto") != std::string::npos);
  CHECK(hello.find("3") != std::string::npos);
  CHECK(hello.find("server") != std::string::npos);
  // SLUICE.CHECK is a map after HELLO 3.
  const std::string check = cli(d, {"-3", "SLUICE.CHECK", "api", "user", "bo"});
  CHECK(check.find("allowed") != std::string::npos);
  CHECK(check.find("remaining") != std::string::npos);
}

TEST_CASE(
    "a pipelined burst of 200 commands is answered in order, and a bad frame closes only its "
    "connection") {
  Daemon d(config());
  // Burst 4 (limit 5) at 1 per minute: five allowed, the rest limited, in order.
  std::string burst;
  for (int i = 0; i < 200; ++i)
    burst += throttle_frame("burst", "4", "1", "60");
  burst += "PING\r\n";
  const std::string got =
      exchange(d.resp, burst, [](const std::string& s) { return s.ends_with("+PONG\r\n"); });
  REQUIRE(got.ends_with("+PONG\r\n"));
  CHECK(count(got, "*5\r\n") == 200);
  CHECK(got.starts_with("*5\r\n:0\r\n:5\r\n:4\r\n:-1\r\n:60\r\n*5\r\n:0\r\n:5\r\n:3\r\n"));
  CHECK(count(got, "*5\r\n:0\r\n") == 5);
  CHECK(count(got, "*5\r\n:1\r\n") == 195);
  // Refused frames close the connection after their error; the door stays up for others.
  const std::string bad = exchange(d.resp, "*1\r\n$99999999\r\n", [](const std::string& s) {
    return s.find("\r\n") != std::string::npos;
  });
  CHECK(bad.starts_with("-ERR Protocol error"));
  CHECK(exchange(d.resp, "PING\r\n", [](const std::string& s) { return s.size() >= 7; }) ==
        "+PONG\r\n");
  const std::string m = metrics(d);
  CHECK(m.find("sluice_resp_protocol_errors_total{reason=\"invalid_bulk_length\"} 1") !=
        std::string::npos);
}

TEST_CASE(
    "with resp_password_file, commands get NOAUTH until AUTH succeeds, and failures are counted") {
  REQUIRE_MESSAGE(have_redis_cli(), "no /usr/bin/redis-cli (deploy/setup.sh installs redis-tools)");
  Daemon d(config(), /*start_now=*/false);
  std::ofstream(d.dir / "resp-password") << "s3cret-door\n";
  d.config().extra_config.push_back("resp_password_file: " + (d.dir / "resp-password").string());
  d.start();
  CHECK(cli(d, {"CL.THROTTLE", "k", "1", "1", "1"}).starts_with("NOAUTH Authentication required."));
  CHECK(cli(d, {"-a", "wrong", "--no-auth-warning", "CL.THROTTLE", "k", "1", "1", "1"})
            .find("NOAUTH") != std::string::npos);
  CHECK(cli(d, {"PING"}) == "PONG\n");  // a health probe needs no password
  CHECK(cli(d, {"-a", "s3cret-door", "--no-auth-warning", "CL.THROTTLE", "k", "1", "1", "1"}) ==
        "0\n2\n1\n-1\n1\n");
  CHECK(metrics(d).find("sluice_resp_auth_failures_total 1") != std::string::npos);
}

TEST_CASE("a RESP door off loopback without a password is refused at start, saying why") {
  Daemon d(config(), /*start_now=*/false);
  const ProcessResult r = d.run_to_exit({"--resp", "0.0.0.0:" + std::to_string(d.resp)});
  CHECK(r.exit_code() != 0);
  CHECK(r.err.find("not loopback and no resp_password_file") != std::string::npos);
}

TEST_CASE("a command not finished within client_timeout_ms closes its connection, counted") {
  Daemon d(config(), /*start_now=*/false);
  d.config().extra_config.push_back("client_timeout_ms: 300");
  d.start();
  const auto t0 = std::chrono::steady_clock::now();
  // Half a PING: the door waits for the rest, then gives up on it.
  const std::string got =
      exchange(d.resp, "*1\r\n$4\r\nPI", [](const std::string&) { return false; });
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(got.empty());
  CHECK(waited < std::chrono::seconds(4));  // closed by the door, not by the 5 s give-up
  CHECK(metrics(d).find("sluice_resp_connections_closed_total{reason=\"frame\"} 1") !=
        std::string::npos);
}

namespace {

// A connection kept open across exchanges (exchange() above opens one per call).
class Conn {
 public:
  explicit Conn(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    REQUIRE(fd_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  }
  ~Conn() { ::close(fd_); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Sends `bytes` and reads `want` bytes; what it read (less when the peer closed or 5 s passed).
  std::string ask(const std::string& bytes, size_t want) {
    if (::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size()))
      return {};
    return read(want, std::chrono::seconds(5));
  }
  // True once the peer has closed (within `within`).
  bool closed_by_peer(std::chrono::milliseconds within) {
    const auto until = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char c;
      const ssize_t n = ::recv(fd_, &c, 1, 0);
      if (n <= 0) return true;
    }
    return false;
  }

 private:
  std::string read(size_t want, std::chrono::seconds within) {
    std::string got;
    const auto until = std::chrono::steady_clock::now() + within;
    while (got.size() < want && std::chrono::steady_clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, std::min(sizeof buf, want - got.size()), 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }

  int fd_;
};

}  // namespace

TEST_CASE(
    "over max_connections the door closes the connection idle longest, counted as shed, and "
    "serves the new one") {
  Daemon d(config(), /*start_now=*/false);
  d.config().extra_config.push_back("max_connections: 3");
  d.start();
  std::vector<std::unique_ptr<Conn>> conns;
  for (int i = 0; i < 3; ++i) {
    conns.push_back(std::make_unique<Conn>(d.resp));
    REQUIRE(conns.back()->ask("PING\r\n", 7) == "+PONG\r\n");
    // Idle since distinct instants: the first is the one idle longest.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The two most recent take one more command each, so the first stays the one idle longest.
  REQUIRE(conns[2]->ask("PING\r\n", 7) == "+PONG\r\n");
  REQUIRE(conns[1]->ask("PING\r\n", 7) == "+PONG\r\n");
  Conn fourth(d.resp);
  CHECK(fourth.ask("PING\r\n", 7) == "+PONG\r\n");
  CHECK(conns[0]->closed_by_peer(std::chrono::milliseconds(2000)));
  CHECK(conns[1]->ask("PING\r\n", 7) == "+PONG\r\n");
  CHECK(conns[2]->ask("PING\r\n", 7) == "+PONG\r\n");
  CHECK(metrics(d).find("sluice_resp_connections_closed_total{reason=\"shed\"} 1") !=
        std::string::npos);
}

TEST_CASE(
    "SIGHUP reads resp_password_file again: new connections ask for the new password, an "
    "authenticated one stays") {
  Daemon d(config(), /*start_now=*/false);
  const std::filesystem::path file = d.dir / "resp-password";
  std::ofstream(file) << "first-password\n";
  d.config().extra_config.push_back("resp_password_file: " + file.string());
  d.start();
  Conn before(d.resp);
  REQUIRE(before.ask("AUTH first-password\r\n", 5) == "+OK\r\n");

  { std::ofstream(file, std::ios::trunc) << "second-password\n"; }
  d.signal(SIGHUP);
  // The reload is done once a new connection refuses the old password (bounded wait).
  bool rotated = false;
  for (int i = 0; i < 100 && !rotated; ++i) {
    Conn probe(d.resp);
    rotated = probe.ask("AUTH first-password\r\n", 10).starts_with("-WRONGPASS");
    if (!rotated) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(rotated);
  Conn after(d.resp);
  CHECK(after.ask("AUTH second-password\r\n", 5) == "+OK\r\n");
  CHECK(before.ask("PING\r\n", 7) == "+PONG\r\n");
  CHECK(before.ask(throttle_frame("rotated", "1", "1", "60"), 4) == "*5\r\n");

  // An emptied file keeps the password in force.
  { std::ofstream(file, std::ios::trunc); }
  d.signal(SIGHUP);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Conn last(d.resp);
  CHECK(last.ask("AUTH second-password\r\n", 5) == "+OK\r\n");
}
