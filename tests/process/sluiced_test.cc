// Process-level tests: a real sluiced on free loopback ports, driven over UDP and TCP with the
// wire protocol, signalled with SIGHUP and SIGTERM, and fed hostile input.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "sluiced_process.h"
#include "wire/protocol.h"

namespace {

using sluice::testing::loopback;
using sluice::wire::Answer;
using sluice::wire::Check;
using sluice::wire::Code;
using sluice::wire::Entry;

constexpr const char* kRules = R"(domains:
  - name: t
    rules:
      - name: per-user
        key: [user]
        limits: [LIMIT/1m]
)";

std::string per_user_rules(int limit) {
  std::string r = kRules;
  r.replace(r.find("LIMIT"), 5, std::to_string(limit));
  return r;
}

// A sluiced whose rules hold one per-user limit in domain `t` (data in its scratch directory).
struct Daemon : sluice::testing::Daemon {
  explicit Daemon(int limit) : sluice::testing::Daemon(config(limit)) {}
  static sluice::testing::DaemonConfig config(int limit) {
    sluice::testing::DaemonConfig c;
    c.rules = per_user_rules(limit);
    return c;
  }
  void write_rules(int limit) { sluice::testing::Daemon::write_rules(per_user_rules(limit)); }
};

int tcp_connect(uint16_t port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  const sockaddr_in a = loopback(port);
  REQUIRE(::connect(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  const int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

// Reads frames until `count` answers arrived or the timeout passed.
std::vector<Answer> tcp_read_answers(int s, size_t count, int timeout_ms) {
  sluice::wire::FrameReader reader;
  std::vector<Answer> answers;
  std::vector<uint8_t> buf(65'536);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (answers.size() < count && std::chrono::steady_clock::now() < until) {
    pollfd p{s, POLLIN, 0};
    if (::poll(&p, 1, 50) != 1) continue;
    const ssize_t n = ::recv(s, buf.data(), buf.size(), 0);
    if (n <= 0) break;
    reader.feed({buf.data(), static_cast<size_t>(n)});
    while (auto f = reader.next()) {
      Answer a;
      REQUIRE(sluice::wire::decode_answer(*f, a) == Code::kOk);
      answers.push_back(std::move(a));
    }
  }
  return answers;
}

bool peer_closed(int s, int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<uint8_t> buf(4096);
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{s, POLLIN, 0};
    if (::poll(&p, 1, 50) != 1) continue;
    const ssize_t n = ::recv(s, buf.data(), buf.size(), 0);
    if (n <= 0) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("sluiced holds the limit over UDP and answers with limit details") {
  Daemon d(3);
  CHECK(d.admitted(5, "42") == 3);
  auto a = d.udp_check("42", 1);
  REQUIRE(a.has_value());
  REQUIRE(a->decisions[0].limits.size() == 1);
  const auto& l = a->decisions[0].limits[0];
  CHECK(l.limit == 3);
  CHECK(l.window_ms == 60'000);
  CHECK(l.remaining == 0);
  CHECK(l.exceeded);
  CHECK(l.retry_after_ms > 0);
  CHECK(l.name == "per-user:3/1m");
}

TEST_CASE("sluiced answers pipelined TCP requests, matched by id") {
  Daemon d(4);
  const int s = tcp_connect(d.port);
  std::vector<uint8_t> out, req;
  const Entry e{"user", "7"};
  const Check c{"t", {&e, 1}, 1};
  for (uint64_t id = 1; id <= 6; ++id) {
    sluice::wire::encode_request(id, {&c, 1}, 0, req);
    sluice::wire::append_frame(req, out);
  }
  REQUIRE(::send(s, out.data(), out.size(), 0) == static_cast<ssize_t>(out.size()));
  const auto answers = tcp_read_answers(s, 6, 3000);
  REQUIRE(answers.size() == 6);
  int allowed = 0;
  for (size_t i = 0; i < answers.size(); ++i) {
    CHECK(answers[i].id == i + 1);
    allowed += answers[i].decisions.at(0).allowed ? 1 : 0;
  }
  CHECK(allowed == 4);
  ::close(s);
}

TEST_CASE("SIGHUP reloads the rules and keeps the counters") {
  Daemon d(3);
  CHECK(d.admitted(3, "u") == 3);
  d.write_rules(5);  // same rule, same window, higher limit
  REQUIRE(::kill(d.pid, SIGHUP) == 0);
  // The reload is asynchronous: wait (bounded) until the new limit shows.
  bool reloaded = false;
  for (int i = 0; i < 200 && !reloaded; ++i) {
    auto a = d.udp_check("u", 0);
    REQUIRE(a.has_value());
    reloaded = a->decisions[0].limits.at(0).limit == 5;
    if (!reloaded) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(reloaded);
  CHECK(d.admitted(5, "u") == 2);  // 3 counted before the reload still count
}

TEST_CASE("a rules file with errors on SIGHUP leaves the old rules in force") {
  Daemon d(2);
  std::ofstream(d.dir / "rules.yaml")
      << "domains: [ {name: t, rules: [ {name: x, limts: 1} ] } ]\n";
  REQUIRE(::kill(d.pid, SIGHUP) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(d.admitted(3, "v") == 2);
}

TEST_CASE("SIGTERM stops sluiced cleanly with exit status 0") {
  Daemon d(3);
  CHECK(d.admitted(1, "w") == 1);
  REQUIRE(::kill(d.pid, SIGTERM) == 0);
  const int status = d.wait_exit(5000);
  REQUIRE(status != -1);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("hostile datagrams are dropped or answered with an error, and counters survive") {
  Daemon d(3);
  CHECK(d.admitted(3, "victim") == 3);

  // Not Cap'n Proto at all: dropped, no answer.
  CHECK_FALSE(d.udp_raw({}).has_value());
  CHECK_FALSE(d.udp_raw({1, 2, 3, 4, 5, 6, 7}).has_value());
  std::mt19937_64 rng(7);
  for (int i = 0; i < 50; ++i) {
    std::vector<uint8_t> junk(1 + rng() % 2000);
    for (auto& b : junk)
      b = static_cast<uint8_t>(rng());
    d.udp_raw(junk, 20);
  }
  std::vector<uint8_t> big(60'000, 0xff);
  d.udp_raw(big, 50);
  // A valid request cut short.
  {
    const Entry e{"user", "x"};
    const Check c{"t", {&e, 1}, 1};
    std::vector<uint8_t> req;
    sluice::wire::encode_request(9, {&c, 1}, 0, req);
    for (size_t cut = 8; cut < req.size(); cut += 8) {
      d.udp_raw(std::vector<uint8_t>(req.begin(), req.begin() + static_cast<long>(cut)), 20);
    }
  }

  // Well-formed but wrong: error answers.
  auto unknown = d.udp_check("x", 1, "no-such-domain");
  REQUIRE(unknown.has_value());
  CHECK(unknown->decisions.at(0).code == Code::kUnknownDomain);
  auto empty = d.udp_check("x", 1, "");
  REQUIRE(empty.has_value());
  CHECK(empty->decisions.at(0).code == Code::kEmptyDomain);
  auto negative = d.udp_check("x", -5);
  REQUIRE(negative.has_value());
  CHECK(negative->decisions.at(0).code == Code::kNegativeHits);
  CHECK_FALSE(negative->decisions.at(0).allowed);
  auto huge = d.udp_check("x", int64_t{1} << 50);
  REQUIRE(huge.has_value());
  CHECK(huge->decisions.at(0).code == Code::kHitsTooLarge);
  auto long_key = d.udp_check(std::string(64 * 1024 - 200, 'k'), 1, "t", 0);
  if (long_key.has_value()) {  // may exceed one datagram with framing; if answered, refused
    CHECK(long_key->decisions.at(0).code == Code::kEntryTooLong);
  }
  auto long_key_small = d.udp_check(std::string(4096, 'k'), 1);
  REQUIRE(long_key_small.has_value());
  CHECK(long_key_small->decisions.at(0).code == Code::kEntryTooLong);

  // The counter of the victim is intact: still at its limit.
  auto a = d.udp_check("victim", 1);
  REQUIRE(a.has_value());
  CHECK_FALSE(a->decisions.at(0).allowed);
  CHECK(d.admitted(1, "fresh") == 1);
}

TEST_CASE("a bad TCP frame closes that connection only") {
  Daemon d(3);
  const int bad = tcp_connect(d.port);
  const uint32_t len = 2u << 20;  // 2 MiB: over the 1 MiB frame limit
  uint8_t header[4] = {static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8),
                       static_cast<uint8_t>(len >> 16), static_cast<uint8_t>(len >> 24)};
  REQUIRE(::send(bad, header, sizeof header, 0) == 4);
  CHECK(peer_closed(bad, 3000));
  ::close(bad);
  // A well-sized frame that is not a request: that connection is closed (its sender learns at
  // once), others are served.
  const int junk = tcp_connect(d.port);
  std::vector<uint8_t> bad_frame;
  sluice::wire::append_frame(std::vector<uint8_t>(64, 0xee), bad_frame);
  REQUIRE(::send(junk, bad_frame.data(), bad_frame.size(), 0) ==
          static_cast<ssize_t>(bad_frame.size()));
  CHECK(peer_closed(junk, 3000));
  ::close(junk);
  const int s = tcp_connect(d.port);
  std::vector<uint8_t> out;
  const Entry e{"user", "t1"};
  const Check c{"t", {&e, 1}, 1};
  std::vector<uint8_t> req;
  sluice::wire::encode_request(5, {&c, 1}, 0, req);
  sluice::wire::append_frame(req, out);
  REQUIRE(::send(s, out.data(), out.size(), 0) == static_cast<ssize_t>(out.size()));
  const auto answers = tcp_read_answers(s, 1, 3000);
  REQUIRE(answers.size() == 1);
  CHECK(answers[0].id == 5);
  CHECK(answers[0].decisions.at(0).allowed);
  ::close(s);
  CHECK(d.admitted(1, "t2") == 1);
}

TEST_CASE("libsluice over UDP and TCP gets the same decisions from a real sluiced") {
  Daemon d(4);
  for (const auto transport : {sluice::Transport::kUdp, sluice::Transport::kTcp}) {
    sluice::ClientOptions opt;
    opt.nodes = {"127.0.0.1:" + std::to_string(d.port)};
    opt.transport = transport;
    opt.fail_mode = sluice::FailMode::kClosed;
    opt.timeout = std::chrono::milliseconds(500);
    std::string error;
    auto client = sluice::Client::create(opt, &error);
    REQUIRE_MESSAGE(client, error);
    const std::string user = transport == sluice::Transport::kUdp ? "udp-user" : "tcp-user";
    int allowed = 0;
    for (int i = 0; i < 6; ++i) {
      const sluice::Result r = client->check("t", {{"user", user}});
      REQUIRE(r.decided());
      allowed += r.allowed ? 1 : 0;
    }
    CHECK(allowed == 4);
    // A batch shares one request; each check has its own answer.
    std::vector<sluice::Entry> es{{"user", user + "-b"}};
    std::vector<sluice::Check> batch(6, sluice::Check{"t", es, 1});
    std::vector<sluice::Result> results;
    client->check_batch(batch, results);
    REQUIRE(results.size() == 6);
    int batch_allowed = 0;
    for (const auto& r : results)
      batch_allowed += r.allowed ? 1 : 0;
    CHECK(batch_allowed == 4);
    CHECK(results.back().limits.at(0).remaining == 0);
  }
}

TEST_CASE(
    "with udp_busy_poll_us, UDP checks hold the limit and TCP checks on the worker still run") {
  sluice::testing::DaemonConfig c = Daemon::config(5);
  c.threads = 1;  // one worker: its TCP sessions share the io_context the spin turns
  c.extra_config = {"udp_busy_poll_us: 10000"};
  sluice::testing::Daemon d(c);
  // A datagram starts the spin; a TCP request sent while it spins is answered within it.
  CHECK(d.admitted(3, "9") == 3);
  const int s = tcp_connect(d.port);
  std::vector<uint8_t> out, req;
  const Entry e{"user", "9"};
  const Check ch{"t", {&e, 1}, 1};
  for (uint64_t id = 1; id <= 4; ++id) {
    sluice::wire::encode_request(id, {&ch, 1}, 0, req);
    sluice::wire::append_frame(req, out);
  }
  REQUIRE(::send(s, out.data(), out.size(), 0) == static_cast<ssize_t>(out.size()));
  const auto answers = tcp_read_answers(s, 4, 3000);
  REQUIRE(answers.size() == 4);
  int allowed = 0;
  for (const Answer& a : answers)
    allowed += a.decisions.at(0).allowed ? 1 : 0;
  CHECK(allowed == 2);  // 3 over UDP + 2 over TCP = the limit of 5
  CHECK(d.admitted(3, "9") == 0);
  ::close(s);
}

TEST_CASE("libsluice leases from a real sluiced: a Lease frees its slot when it goes, once") {
  sluice::testing::DaemonConfig config;
  config.rules = R"(domains:
  - name: jobs
    rules:
      - name: per-tenant
        key: [tenant]
        limits:
          - {algorithm: concurrency, max_in_flight: 2, lease_ttl: 30s}
)";
  sluice::testing::Daemon d(config);
  for (const auto transport : {sluice::Transport::kUdp, sluice::Transport::kTcp}) {
    CAPTURE(static_cast<int>(transport));
    sluice::ClientOptions opt;
    opt.nodes = {"127.0.0.1:" + std::to_string(d.port)};
    opt.transport = transport;
    opt.fail_mode = sluice::FailMode::kClosed;
    opt.timeout = std::chrono::milliseconds(500);
    std::string error;
    auto client = sluice::Client::create(opt, &error);
    REQUIRE_MESSAGE(client, error);
    const std::string tenant = transport == sluice::Transport::kUdp ? "udp" : "tcp";
    const std::vector<sluice::Entry> entries = {{"tenant", tenant}};

    auto [r1, kept] = client->acquire("jobs", entries);
    REQUIRE(r1.decided());
    CHECK(r1.allowed);
    CHECK(kept.held());
    {
      auto [r2, dropped] = client->acquire("jobs", entries);
      CHECK(dropped.held());
      auto [r3, none] = client->acquire("jobs", entries);  // both slots held
      CHECK_FALSE(r3.allowed);
      CHECK_FALSE(none.held());
    }  // `dropped` releases in the background: its slot comes back
    std::optional<sluice::Lease> again;
    for (int i = 0; i < 200 && !again; ++i) {
      auto [r, lease] = client->acquire("jobs", entries);
      if (lease.held()) {
        again = std::move(lease);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    REQUIRE(again.has_value());
    CHECK_FALSE(client->acquire("jobs", entries).result.allowed);

    const uint64_t id = kept.id();
    const sluice::ReleaseResult rr = kept.release();
    CHECK(rr.released());
    CHECK(client->release("jobs", entries, id).code == Code::kLeaseReleased);
    CHECK(client->release("jobs", {{"tenant", "other"}}, again->id()).code == Code::kLeaseUnknown);
    CHECK(again->release().released());
    // Both free again.
    auto [a, la] = client->acquire("jobs", entries);
    auto [b, lb] = client->acquire("jobs", entries);
    CHECK(la.held());
    CHECK(lb.held());
  }
}
