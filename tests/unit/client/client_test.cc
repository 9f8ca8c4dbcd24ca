#include "client/client.h"

#include <doctest/doctest.h>

#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "skip.h"
#include "wire/protocol.h"

// Every test runs against fake nodes started here, on free loopback ports: no sluiced needed.
// The fakes answer by a rule of their own: a check is allowed when hits <= 5; its one limit is
// named after the check's first entry value, so a test can tell which answer belongs to which
// check. A fake with Behaviour::kLeases plays a concurrency limit instead (LeaseRule).

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::ip::udp;
using Clock = std::chrono::steady_clock;
using sluice::Client;
using sluice::ClientOptions;
using sluice::Outcome;
using sluice::Result;
using sluice::wire::Code;
using std::chrono::milliseconds;

constexpr int64_t kRuleLimit = 5;

// Encodes the fake rule's answer to a decoded request.
void rule_answer(const sluice::wire::RequestDecoder& req, size_t max_bytes,
                 std::vector<uint8_t>& out, Code request_code = Code::kOk) {
  const auto checks = req.checks();
  std::vector<sluice::wire::LimitView> limits(checks.size());
  std::vector<sluice::wire::DecisionView> decisions(checks.size());
  for (size_t i = 0; i < checks.size(); ++i) {
    const sluice::wire::Check& c = checks[i];
    sluice::wire::DecisionView& d = decisions[i];
    d.code = req.check_code(i);
    if (d.code != Code::kOk) continue;
    const bool exceeded = c.hits > kRuleLimit;
    sluice::wire::LimitView& l = limits[i];
    l.name = c.entries.empty() ? std::string_view("anon") : c.entries[0].value;
    l.limit = kRuleLimit;
    l.window_ms = 60'000;
    l.remaining = exceeded ? 0 : static_cast<uint64_t>(kRuleLimit - c.hits);
    l.reset_ms = 60'000;
    l.retry_after_ms = exceeded ? 1'500 : 0;
    l.exceeded = exceeded;
    d.allowed = !exceeded;
    d.limits = std::span<const sluice::wire::LimitView>(&l, 1);
  }
  if (request_code != Code::kOk) decisions.clear();
  sluice::wire::encode_answer(req.id(), request_code, decisions, max_bytes, out);
}

enum class Behaviour {
  kRule,          // answer by the rule
  kSilent,        // read and never answer
  kMalformed,     // answer with garbage, an unknown id and a wrong number of decisions
  kRefuse,        // answer with a request-level error (kTooManyChecks)
  kReverse4,      // TCP: hold requests until 4 arrived, answer them newest first
  kCloseOnFirst,  // TCP: close the connection on the first request, unanswered
  kHugeFrame,     // TCP: answer with a frame length over the limit
  kLeases,        // answer by LeaseRule: leases and releases
};

// A concurrency limit as a node keeps it (docs/protocol.md, "Leases"): at most kMaxInFlight
// leases held per domain and entries; a release frees one with the same domain and entries.
// Lease ids start past 2^53, where a double (a JSON number) would lose them.
constexpr int kMaxInFlight = 2;
constexpr uint64_t kFirstLease = 0xc0ffee0000000001;

class LeaseRule {
 public:
  void answer(const sluice::wire::RequestDecoder& req, size_t max_bytes,
              std::vector<uint8_t>& out) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto checks = req.checks();
    std::vector<sluice::wire::DecisionView> decisions(checks.size());
    for (size_t i = 0; i < checks.size(); ++i) {
      const sluice::wire::Check& c = checks[i];
      sluice::wire::DecisionView& d = decisions[i];
      d.code = req.check_code(i);
      if (d.code != Code::kOk) continue;
      std::string key(c.domain);
      for (const sluice::wire::Entry& e : c.entries)
        key.append("|").append(e.key).append("=").append(e.value);
      if (c.is_release) {
        ++releases_;
        auto it = leases_.find(c.release);
        if (it == leases_.end() || it->second.key != key) {
          d.code = Code::kLeaseUnknown;
        } else if (it->second.released) {
          d.code = Code::kLeaseReleased;
        } else {
          it->second.released = true;
          --held_[key];
        }
        continue;
      }
      d.allowed = held_[key] < kMaxInFlight;
      if (!d.allowed) continue;
      ++held_[key];
      d.lease = next_++;
      leases_[d.lease] = Held{key, false};
    }
    sluice::wire::encode_answer(req.id(), Code::kOk, decisions, max_bytes, out);
  }
  int releases() const {
    std::lock_guard<std::mutex> lock(mu_);
    return releases_;
  }
  int held(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = held_.find(key);
    return it == held_.end() ? 0 : it->second;
  }

 private:
  struct Held {
    std::string key;
    bool released = false;
  };
  mutable std::mutex mu_;  // guards everything below: the fake's thread and the test's
  std::map<uint64_t, Held> leases_;
  std::map<std::string, int> held_;
  uint64_t next_ = kFirstLease;
  int releases_ = 0;  // release checks received
};

// A fake node on its own thread and io_context. Counts requests (datagrams/frames) and checks.
class FakeNode {
 public:
  FakeNode(sluice::Transport transport, Behaviour behaviour, bool v6 = false)
      : behaviour_(behaviour), udp_(io_), acceptor_(io_) {
    const asio::ip::address loopback = v6 ? asio::ip::address(asio::ip::address_v6::loopback())
                                          : asio::ip::address(asio::ip::address_v4::loopback());
    if (transport == sluice::Transport::kUdp) {
      udp_.open(v6 ? udp::v6() : udp::v4());
      udp_.bind(udp::endpoint(loopback, 0));
      port_ = udp_.local_endpoint().port();
      receive();
    } else {
      acceptor_.open(v6 ? tcp::v6() : tcp::v4());
      acceptor_.set_option(tcp::acceptor::reuse_address(true));
      acceptor_.bind(tcp::endpoint(loopback, 0));
      acceptor_.listen();
      port_ = acceptor_.local_endpoint().port();
      accept();
    }
    thread_ = std::thread([this] { io_.run(); });
  }
  ~FakeNode() {
    io_.stop();
    thread_.join();
  }

  std::string address() const {
    const bool v6 = udp_.is_open() ? udp_.local_endpoint().address().is_v6()
                                   : acceptor_.local_endpoint().address().is_v6();
    return (v6 ? "[::1]:" : "127.0.0.1:") + std::to_string(port_);
  }
  int requests() const { return requests_.load(); }
  int checks() const { return checks_.load(); }
  const LeaseRule& leases() const { return leases_; }
  size_t smallest_request() const { return smallest_request_.load(); }

 private:
  struct Session {
    explicit Session(asio::io_context& io) : socket(io) {}
    tcp::socket socket;
    std::vector<uint8_t> rx = std::vector<uint8_t>(65'536);
    sluice::wire::FrameReader reader;
    std::vector<std::vector<uint8_t>> held;  // kReverse4: encoded answers not yet sent
  };

  void count(const sluice::wire::RequestDecoder& req, size_t bytes) {
    requests_.fetch_add(1);
    checks_.fetch_add(static_cast<int>(req.checks().size()));
    size_t seen = smallest_request_.load();
    while (bytes < seen && !smallest_request_.compare_exchange_weak(seen, bytes)) {
    }
  }

  void receive() {
    udp_.async_receive_from(
        asio::buffer(rx_), peer_, [this](boost::system::error_code ec, size_t len) {
          if (ec) return;
          sluice::wire::RequestDecoder req;
          if (req.decode(std::span<const uint8_t>(rx_.data(), len)) == Code::kOk) {
            count(req, len);
            std::vector<uint8_t> out;
            switch (behaviour_) {
              case Behaviour::kRule:
                rule_answer(req, len, out);
                udp_.send_to(asio::buffer(out), peer_, 0, ec);
                break;
              case Behaviour::kLeases:
                leases_.answer(req, len, out);
                udp_.send_to(asio::buffer(out), peer_, 0, ec);
                break;
              case Behaviour::kRefuse:
                rule_answer(req, len, out, Code::kTooManyChecks);
                udp_.send_to(asio::buffer(out), peer_, 0, ec);
                break;
              case Behaviour::kMalformed: {
                const std::vector<uint8_t> garbage = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
                udp_.send_to(asio::buffer(garbage), peer_, 0, ec);
                std::vector<uint8_t> truncated;
                rule_answer(req, len, truncated);
                truncated.resize(truncated.size() / 2);
                udp_.send_to(asio::buffer(truncated), peer_, 0, ec);
                sluice::wire::encode_answer(req.id() + 1, Code::kOk, {}, 0, out);  // unknown id
                udp_.send_to(asio::buffer(out), peer_, 0, ec);
                sluice::wire::encode_answer(req.id(), Code::kOk, {}, 0, out);  // no decisions
                udp_.send_to(asio::buffer(out), peer_, 0, ec);
                break;
              }
              default:
                break;
            }
          }
          receive();
        });
  }

  void accept() {
    auto session = std::make_shared<Session>(io_);
    acceptor_.async_accept(session->socket, [this, session](boost::system::error_code ec) {
      if (ec) return;
      if (behaviour_ == Behaviour::kHugeFrame) {
        // Lengths over the frame limit: the stream cannot be trusted any further.
        const std::vector<uint8_t> bad = {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0};
        asio::write(session->socket, asio::buffer(bad), ec);
      }
      read(session);
      accept();
    });
  }

  void read(const std::shared_ptr<Session>& s) {
    s->socket.async_read_some(
        asio::buffer(s->rx), [this, s](boost::system::error_code ec, size_t len) {
          if (ec) return;
          s->reader.feed(std::span<const uint8_t>(s->rx.data(), len));
          sluice::wire::RequestDecoder req;
          while (auto frame = s->reader.next()) {
            if (req.decode(*frame) != Code::kOk) continue;
            count(req, frame->size());
            if (behaviour_ == Behaviour::kCloseOnFirst) {
              s->socket.close(ec);
              return;
            }
            if (behaviour_ == Behaviour::kSilent || behaviour_ == Behaviour::kHugeFrame) continue;
            std::vector<uint8_t> answer;
            if (behaviour_ == Behaviour::kLeases) {
              leases_.answer(req, 0, answer);
            } else {
              rule_answer(req, 0, answer);
            }
            std::vector<uint8_t> framed;
            sluice::wire::append_frame(answer, framed);
            if (behaviour_ == Behaviour::kReverse4) {
              s->held.push_back(std::move(framed));
              if (s->held.size() < 4) continue;
              std::vector<uint8_t> all;
              for (auto it = s->held.rbegin(); it != s->held.rend(); ++it) {
                all.insert(all.end(), it->begin(), it->end());
              }
              s->held.clear();
              asio::write(s->socket, asio::buffer(all), ec);
            } else {
              asio::write(s->socket, asio::buffer(framed), ec);
            }
          }
          read(s);
        });
  }

  const Behaviour behaviour_;
  LeaseRule leases_;
  asio::io_context io_;
  udp::socket udp_;
  udp::endpoint peer_;
  std::vector<uint8_t> rx_ = std::vector<uint8_t>(65'536);
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<int> requests_{0};
  std::atomic<int> checks_{0};
  std::atomic<size_t> smallest_request_{SIZE_MAX};
  std::thread thread_;
};

// A loopback port with nothing listening (bound once, then released).
std::string closed_port(sluice::Transport transport) {
  asio::io_context io;
  uint16_t port = 0;
  if (transport == sluice::Transport::kUdp) {
    udp::socket s(io, udp::endpoint(asio::ip::address_v4::loopback(), 0));
    port = s.local_endpoint().port();
  } else {
    tcp::acceptor a(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    port = a.local_endpoint().port();
  }
  return "127.0.0.1:" + std::to_string(port);
}

std::unique_ptr<Client> make_client(ClientOptions options) {
  std::string error;
  std::unique_ptr<Client> c = Client::create(std::move(options), &error);
  REQUIRE_MESSAGE(c != nullptr, error);
  return c;
}

// Collects async results; waits with a bound.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::optional<Result>> results;
  size_t got = 0;

  explicit Collector(size_t n) : results(n) {}
  Client::Callback callback(size_t i) {
    return [this, i](Result r) {
      std::lock_guard<std::mutex> lock(mu);
      results[i] = std::move(r);
      ++got;
      cv.notify_all();
    };
  }
  bool wait(milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit, [this] { return got == results.size(); });
  }
};

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void check_rule_result(const Result& r, std::string_view name, int64_t hits) {
  CHECK(r.outcome == Outcome::kDecided);
  CHECK(r.code == Code::kOk);
  CHECK(r.allowed == (hits <= kRuleLimit));
  REQUIRE(r.limits.size() == 1);
  CHECK(r.limits[0].name == name);
  CHECK(r.limits[0].limit == uint64_t{kRuleLimit});
  CHECK(r.limits[0].exceeded == (hits > kRuleLimit));
  CHECK(r.limits[0].remaining == (hits > kRuleLimit ? 0 : uint64_t(kRuleLimit - hits)));
  CHECK(r.limits[0].retry_after_ms == (hits > kRuleLimit ? 1'500 : 0));
  CHECK_FALSE(r.truncated);
}

}  // namespace

TEST_CASE("udp: blocking, callback and coroutine checks return the node's decisions and limits") {
  FakeNode node(sluice::Transport::kUdp, Behaviour::kRule);
  auto client = make_client({.nodes = {node.address()}, .timeout = milliseconds(500)});

  check_rule_result(client->check("api", {{"user", "alice"}}, 3), "alice", 3);
  check_rule_result(client->check("api", {{"user", "bob"}, {"ip", "203.0.113.9"}}, 6), "bob", 6);

  const std::vector<sluice::Entry> carol = {{"user", "carol"}};
  Collector collector(1);
  client->async_check({"api", carol, 7}, collector.callback(0));
  REQUIRE(collector.wait(milliseconds(2'000)));
  check_rule_result(*collector.results[0], "carol", 7);

  asio::io_context io;
  std::optional<Result> from_coroutine;
  std::string coroutine_error;
  auto coroutine = [&]() -> asio::awaitable<void> {
    try {
      const std::vector<sluice::Entry> dave = {{"user", "dave"}};
      // The entries die before the co_await: co_check copies the check when called.
      auto pending = client->co_check({"api", dave, 2});
      Result r = co_await std::move(pending);
      from_coroutine = std::move(r);
    } catch (const std::exception& e) {
      coroutine_error = e.what();
    }
  };
  asio::co_spawn(io, coroutine(), asio::detached);
  io.run_for(milliseconds(2'000));  // returns as soon as the coroutine is done
  CHECK(coroutine_error.empty());
  REQUIRE(from_coroutine.has_value());
  check_rule_result(*from_coroutine, "dave", 2);

  std::vector<sluice::Check> batch;
  const std::vector<sluice::Entry> e1 = {{"user", "b1"}};
  const std::vector<sluice::Entry> e2 = {{"user", "b2"}};
  batch.push_back({"api", e1, 1});
  batch.push_back({"api", e2, 9});
  std::vector<Result> results;
  client->check_batch(batch, results);
  REQUIRE(results.size() == 2);
  check_rule_result(results[0], "b1", 1);
  check_rule_result(results[1], "b2", 9);

  const sluice::ClientStats stats = client->stats();
  CHECK(stats.checks == 6);
  CHECK(stats.answers >= 5);
  CHECK(stats.unavailable == 0);
  CHECK(stats.dropped_answers == 0);
  // Padded so that the answers carry their details: 64 + 288 bytes per check at least.
  CHECK(node.smallest_request() >= 64 + 288);
}

TEST_CASE("udp over IPv6 loopback") {
  std::optional<FakeNode> node;
  try {
    node.emplace(sluice::Transport::kUdp, Behaviour::kRule, /*v6=*/true);
  } catch (const std::exception& e) {
    sluice::testing::skip_test(std::string("no IPv6 loopback here: ") + e.what());
    return;
  }
  auto client = make_client({.nodes = {node->address()}, .timeout = milliseconds(500)});
  check_rule_result(client->check("api", {{"user", "v6"}}, 1), "v6", 1);
}

TEST_CASE("batching: 50 concurrent checks from 5 threads share datagrams, each gets its answer") {
  FakeNode node(sluice::Transport::kUdp, Behaviour::kRule);
  auto client = make_client(
      {.nodes = {node.address()}, .timeout = milliseconds(1'000), .batch_window = milliseconds(5)});
  constexpr size_t kThreads = 5;
  constexpr size_t kPerThread = 10;
  Collector collector(kThreads * kPerThread);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < kPerThread; ++k) {
        const size_t i = t * kPerThread + k;
        const std::string name = "u" + std::to_string(i);
        const sluice::Entry entry{"user", name};
        client->async_check(
            {"api", std::span<const sluice::Entry>(&entry, 1), static_cast<int64_t>(i % 10)},
            collector.callback(i));
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  REQUIRE(collector.wait(milliseconds(3'000)));
  for (size_t i = 0; i < collector.results.size(); ++i) {
    check_rule_result(*collector.results[i], "u" + std::to_string(i), static_cast<int64_t>(i % 10));
  }
  CHECK(node.checks() == 50);
  CHECK(node.requests() < 50);
  MESSAGE("50 checks arrived in " << node.requests() << " datagrams");

  // Blocking checks from many threads at once, no batch window: all answered correctly.
  auto eager = make_client({.nodes = {node.address()}, .timeout = milliseconds(1'000)});
  std::atomic<int> right{0};
  threads.clear();
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 20; ++k) {
        const std::string name = "t" + std::to_string(t) + "-" + std::to_string(k);
        const Result r = eager->check("api", {{"user", name}}, k % 8);
        if (r.decided() && r.allowed == (k % 8 <= kRuleLimit) && r.limits.size() == 1 &&
            r.limits[0].name == name) {
          right.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  CHECK(right.load() == 8 * 20);
}

TEST_CASE("timeout: a silent node ends the check within the timeout with the fail mode") {
  FakeNode node(sluice::Transport::kUdp, Behaviour::kSilent);
  const auto timeout = milliseconds(30);
  for (const sluice::FailMode mode : {sluice::FailMode::kOpen, sluice::FailMode::kClosed}) {
    auto client = make_client({.nodes = {node.address()}, .fail_mode = mode, .timeout = timeout});
    const Clock::time_point start = Clock::now();
    const Result r = client->check("api", {{"user", "x"}});
    const double elapsed = ms_since(start);
    CHECK(r.outcome == Outcome::kUnavailable);
    CHECK(r.allowed == (mode == sluice::FailMode::kOpen));
    CHECK(r.failed_open() == (mode == sluice::FailMode::kOpen));
    CHECK(r.limits.empty());
    CHECK(elapsed >= 29.0);
    CHECK(elapsed < 30.0 + 50.0);
    // Two attempts on the one node: a lost datagram gets a second chance.
    CHECK(client->stats().retries == 1);

    Collector collector(1);
    const Clock::time_point async_start = Clock::now();
    const std::vector<sluice::Entry> e = {{"user", "y"}};
    client->async_check({"api", e, 1}, collector.callback(0));
    REQUIRE(collector.wait(milliseconds(1'000)));
    CHECK(ms_since(async_start) < 30.0 + 50.0);
    CHECK(collector.results[0]->outcome == Outcome::kUnavailable);
    CHECK(collector.results[0]->allowed == (mode == sluice::FailMode::kOpen));
  }
}

TEST_CASE("retry: first node silent, the second answers within the timeout") {
  FakeNode silent(sluice::Transport::kUdp, Behaviour::kSilent);
  FakeNode answering(sluice::Transport::kUdp, Behaviour::kRule);
  auto client = make_client({.nodes = {silent.address(), answering.address()},
                             .fail_mode = sluice::FailMode::kClosed,
                             .timeout = milliseconds(100)});
  const Clock::time_point start = Clock::now();
  const Result r = client->check("api", {{"user", "r"}}, 2);
  const double elapsed = ms_since(start);
  check_rule_result(r, "r", 2);
  CHECK(elapsed >= 49.0);  // the first attempt's share of the timeout
  CHECK(elapsed < 100.0);
  CHECK(silent.requests() == 1);
  CHECK(answering.requests() == 1);
  CHECK(client->stats().retries == 1);
}

TEST_CASE("retry: a closed UDP port (ICMP unreachable) moves on at once") {
  FakeNode answering(sluice::Transport::kUdp, Behaviour::kRule);
  auto client = make_client({.nodes = {closed_port(sluice::Transport::kUdp), answering.address()},
                             .timeout = milliseconds(400)});
  const Clock::time_point start = Clock::now();
  check_rule_result(client->check("api", {{"user", "i"}}, 1), "i", 1);
  CHECK(ms_since(start) < 150.0);  // well before the first attempt's 200 ms share
  // The closed node is now in backoff: the next check goes straight to the second node.
  check_rule_result(client->check("api", {{"user", "j"}}, 1), "j", 1);
  CHECK(answering.requests() == 2);
}

TEST_CASE("tcp: pipelined requests answered out of order are matched by id") {
  FakeNode node(sluice::Transport::kTcp, Behaviour::kReverse4);
  auto client = make_client({.nodes = {node.address()},
                             .transport = sluice::Transport::kTcp,
                             .timeout = milliseconds(1'000),
                             .max_checks_per_request = 1});
  Collector collector(4);
  std::vector<std::string> names;
  for (int i = 0; i < 4; ++i)
    names.push_back("p" + std::to_string(i));
  for (size_t i = 0; i < 4; ++i) {
    const sluice::Entry entry{"user", names[i]};
    client->async_check({"api", std::span<const sluice::Entry>(&entry, 1), int64_t(i) * 3},
                        collector.callback(i));
  }
  REQUIRE(collector.wait(milliseconds(2'000)));
  for (size_t i = 0; i < 4; ++i)
    check_rule_result(*collector.results[i], names[i], int64_t(i) * 3);
  CHECK(node.requests() == 4);
  CHECK(client->stats().link_failures == 0);
}

TEST_CASE("tcp: a node that closes the connection mid-way fails over, or fails fast, never hangs") {
  FakeNode closing(sluice::Transport::kTcp, Behaviour::kCloseOnFirst);
  FakeNode answering(sluice::Transport::kTcp, Behaviour::kRule);

  SUBCASE("to the next node") {
    auto client = make_client({.nodes = {closing.address(), answering.address()},
                               .transport = sluice::Transport::kTcp,
                               .timeout = milliseconds(500)});
    const Clock::time_point start = Clock::now();
    check_rule_result(client->check("api", {{"user", "f"}}, 4), "f", 4);
    CHECK(ms_since(start) < 250.0);  // did not wait for the first attempt's share
    CHECK(closing.requests() == 1);
    CHECK(client->stats().link_failures >= 1);
    // Later checks go to the healthy node while the other one is in backoff.
    check_rule_result(client->check("api", {{"user", "g"}}, 1), "g", 1);
  }
  SUBCASE("no other node: the fail mode, well before the timeout") {
    auto client = make_client({.nodes = {closing.address()},
                               .transport = sluice::Transport::kTcp,
                               .fail_mode = sluice::FailMode::kClosed,
                               .timeout = milliseconds(500)});
    const Clock::time_point start = Clock::now();
    const Result r = client->check("api", {{"user", "h"}});
    CHECK(ms_since(start) < 250.0);
    CHECK(r.outcome == Outcome::kUnavailable);
    CHECK_FALSE(r.allowed);
  }
  SUBCASE("nothing listening") {
    auto client = make_client({.nodes = {closed_port(sluice::Transport::kTcp)},
                               .transport = sluice::Transport::kTcp,
                               .timeout = milliseconds(500)});
    const Clock::time_point start = Clock::now();
    const Result r = client->check("api", {{"user", "h"}});
    CHECK(ms_since(start) < 250.0);
    CHECK(r.outcome == Outcome::kUnavailable);
    CHECK(r.failed_open());
  }
}

TEST_CASE("tcp: a silent node times out, a broken stream is dropped, not trusted") {
  SUBCASE("silent") {
    FakeNode node(sluice::Transport::kTcp, Behaviour::kSilent);
    auto client = make_client({.nodes = {node.address()},
                               .transport = sluice::Transport::kTcp,
                               .timeout = milliseconds(40)});
    const Clock::time_point start = Clock::now();
    const Result r = client->check("api", {{"user", "s"}});
    CHECK(ms_since(start) < 40.0 + 50.0);
    CHECK(r.outcome == Outcome::kUnavailable);
    CHECK(r.allowed);
  }
  SUBCASE("oversized frame length") {
    FakeNode node(sluice::Transport::kTcp, Behaviour::kHugeFrame);
    auto client = make_client({.nodes = {node.address()},
                               .transport = sluice::Transport::kTcp,
                               .timeout = milliseconds(200)});
    const Clock::time_point start = Clock::now();
    const Result r = client->check("api", {{"user", "s"}});
    CHECK(ms_since(start) < 200.0 + 50.0);
    CHECK(r.outcome == Outcome::kUnavailable);
    CHECK(client->stats().dropped_answers >= 1);
    CHECK(client->stats().link_failures >= 1);
  }
}

TEST_CASE("malformed, unknown-id and misshapen answers are ignored, then the fail mode") {
  FakeNode node(sluice::Transport::kUdp, Behaviour::kMalformed);
  auto client = make_client({.nodes = {node.address()},
                             .fail_mode = sluice::FailMode::kClosed,
                             .timeout = milliseconds(40)});
  const Clock::time_point start = Clock::now();
  const Result r = client->check("api", {{"user", "m"}});
  CHECK(ms_since(start) < 40.0 + 50.0);
  CHECK(r.outcome == Outcome::kUnavailable);
  CHECK_FALSE(r.allowed);
  const sluice::ClientStats stats = client->stats();
  CHECK(stats.answers == 0);
  CHECK(stats.dropped_answers >= 4);  // garbage, truncated, unknown id, no decisions
}

TEST_CASE("a request-level error from the node ends its checks as refused, with the fail mode") {
  FakeNode node(sluice::Transport::kUdp, Behaviour::kRefuse);
  auto client = make_client({.nodes = {node.address()}, .timeout = milliseconds(500)});
  const Result r = client->check("api", {{"user", "z"}});
  CHECK(r.outcome == Outcome::kRefused);
  CHECK(r.code == Code::kTooManyChecks);
  CHECK(r.allowed);             // fail-open
  CHECK(node.requests() == 1);  // not retried: every node would say the same
}

TEST_CASE("checks the client will not send are invalid and never allowed") {
  FakeNode node(sluice::Transport::kUdp, Behaviour::kRule);
  auto client = make_client({.nodes = {node.address()}, .timeout = milliseconds(500)});
  const Result empty_domain = client->check("", {{"user", "a"}});
  CHECK(empty_domain.outcome == Outcome::kInvalid);
  CHECK(empty_domain.code == Code::kEmptyDomain);
  CHECK_FALSE(empty_domain.allowed);
  const Result negative = client->check("api", {{"user", "a"}}, -1);
  CHECK(negative.code == Code::kNegativeHits);
  CHECK_FALSE(negative.allowed);
  std::vector<sluice::Entry> many(sluice::wire::kMaxEntries + 1, sluice::Entry{"k", "v"});
  CHECK(client->check("api", many).code == Code::kTooManyEntries);
  const std::string huge(70'000, 'x');  // fits no datagram
  const Result too_large = client->check("api", {{"user", huge}});
  CHECK(too_large.outcome == Outcome::kInvalid);
  CHECK(too_large.code == Code::kTooLarge);
  // A bad check in a batch does not spoil the others.
  const std::vector<sluice::Entry> e = {{"user", "ok"}};
  const std::vector<sluice::Check> batch = {{"", e, 1}, {"api", e, 1}};
  std::vector<Result> results;
  client->check_batch(batch, results);
  CHECK(results[0].outcome == Outcome::kInvalid);
  check_rule_result(results[1], "ok", 1);
  CHECK(node.requests() == 1);
}

TEST_CASE("destroying the client completes pending checks with the fail mode") {
  FakeNode node(sluice::Transport::kUdp, Behaviour::kSilent);
  Collector collector(3);
  {
    auto client = make_client({.nodes = {node.address()}, .timeout = milliseconds(5'000)});
    const std::vector<sluice::Entry> e = {{"user", "d"}};
    for (size_t i = 0; i < 3; ++i)
      client->async_check({"api", e, 1}, collector.callback(i));
    // Let at least one of them reach the node, so both queued and in-flight checks are covered.
    for (int i = 0; i < 200 && node.requests() == 0; ++i) {
      std::this_thread::sleep_for(milliseconds(1));
    }
  }  // ~Client returns only after every callback ran
  CHECK(collector.got == 3);
  for (const auto& r : collector.results) {
    REQUIRE(r.has_value());
    CHECK(r->outcome == Outcome::kUnavailable);
    CHECK(r->allowed);
  }
}

TEST_CASE("a blocking check from a callback is refused instead of deadlocking") {
  FakeNode node(sluice::Transport::kUdp, Behaviour::kRule);
  auto client = make_client({.nodes = {node.address()}, .timeout = milliseconds(500)});
  std::atomic<bool> refused{false};
  Collector collector(1);
  const std::vector<sluice::Entry> e = {{"user", "cb"}};
  auto inner = collector.callback(0);
  client->async_check({"api", e, 1}, [&](Result r) {
    try {
      client->check("api", {{"user", "nested"}});
    } catch (const std::logic_error&) {
      refused = true;
    }
    inner(std::move(r));
  });
  REQUIRE(collector.wait(milliseconds(2'000)));
  CHECK(refused.load());
  check_rule_result(*collector.results[0], "cb", 1);
}

TEST_CASE("create() rejects unusable options with a reason") {
  auto reason = [](ClientOptions o) {
    std::string error;
    CHECK(Client::create(std::move(o), &error) == nullptr);
    return error;
  };
  CHECK(reason({}) == "no nodes");
  CHECK(reason({.nodes = {"127.0.0.1"}}).find("host:port") != std::string::npos);
  CHECK(reason({.nodes = {"::1:7350"}}).find("brackets") != std::string::npos);
  CHECK(reason({.nodes = {"127.0.0.1:0"}}).find("port") != std::string::npos);
  CHECK(reason({.nodes = {"127.0.0.1:99999"}}).find("port") != std::string::npos);
  CHECK(reason({.nodes = {"[::1:7350"}}).find("ipv6") != std::string::npos);
  CHECK(reason({.nodes = {"127.0.0.1:7350"}, .attempts = 0}).find("attempts") != std::string::npos);
  CHECK(reason({.nodes = {"127.0.0.1:7350"}, .max_checks_per_request = 0})
            .find("max_checks_per_request") != std::string::npos);
  std::string error;
  CHECK(Client::create({.nodes = {"localhost:7350", "[::1]:7350"}}, &error) != nullptr);
  CHECK(error.empty());
}

// ---- leases -----------------------------------------------------------------------------------

namespace {

// Waits (bounded) until the fake node has received `n` releases in all.
bool wait_releases(const FakeNode& node, int n) {
  for (int i = 0; i < 2'000 && node.leases().releases() < n; ++i)
    std::this_thread::sleep_for(milliseconds(1));
  return node.leases().releases() == n;
}

}  // namespace

TEST_CASE("leases: a granted lease is in the result, release answers ok, then lease_released") {
  for (const sluice::Transport transport : {sluice::Transport::kUdp, sluice::Transport::kTcp}) {
    CAPTURE(static_cast<int>(transport));
    FakeNode node(transport, Behaviour::kLeases);
    auto client = make_client(
        {.nodes = {node.address()}, .transport = transport, .timeout = milliseconds(500)});
    const Result a = client->check("jobs", {{"tenant", "t1"}});
    CHECK(a.decided());
    CHECK(a.allowed);
    CHECK(a.lease == kFirstLease);  // past 2^53: carried exactly
    const Result b = client->check("jobs", {{"tenant", "t1"}});
    CHECK(b.lease == kFirstLease + 1);
    const Result full = client->check("jobs", {{"tenant", "t1"}});
    CHECK_FALSE(full.allowed);
    CHECK(full.lease == 0);

    sluice::ReleaseResult r = client->release("jobs", {{"tenant", "t1"}}, a.lease);
    CHECK(r.outcome == Outcome::kDecided);
    CHECK(r.code == Code::kOk);
    CHECK(r.released());
    CHECK(r.gone());
    CHECK(sluice::to_string(r) == "released");
    CHECK(client->check("jobs", {{"tenant", "t1"}}).allowed);  // its slot is free again

    r = client->release("jobs", {{"tenant", "t1"}}, a.lease);  // idempotent
    CHECK(r.code == Code::kLeaseReleased);
    CHECK_FALSE(r.released());
    CHECK(r.gone());
    CHECK(sluice::to_string(r) == "lease_released");

    // Another tenant's entries, or a lease never granted: unknown, nothing changes.
    r = client->release("jobs", {{"tenant", "t2"}}, b.lease);
    CHECK(r.code == Code::kLeaseUnknown);
    CHECK_FALSE(r.gone());
    CHECK(client->release("jobs", {{"tenant", "t1"}}, 42).code == Code::kLeaseUnknown);
    CHECK(node.leases().held("jobs|tenant=t1") == 2);
    CHECK(client->release("jobs", {{"tenant", "t1"}}, b.lease).released());

    // Lease 0 is no lease: refused by the client, never sent.
    const int sent = node.leases().releases();
    r = client->release("jobs", {{"tenant", "t1"}}, 0);
    CHECK(r.outcome == Outcome::kInvalid);
    CHECK(r.code == Code::kLeaseUnknown);
    CHECK(node.leases().releases() == sent);

    // Async, with a callback.
    const Result c = client->check("jobs", {{"tenant", "t3"}});
    std::mutex mu;
    std::condition_variable cv;
    std::optional<sluice::ReleaseResult> got;
    const std::vector<sluice::Entry> t3 = {{"tenant", "t3"}};
    client->async_release("jobs", t3, c.lease, [&](sluice::ReleaseResult rr) {
      std::lock_guard<std::mutex> lock(mu);
      got = rr;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, milliseconds(2'000), [&] { return got.has_value(); }));
    CHECK(got->released());
  }
}

TEST_CASE("leases: a Lease releases when it goes out of scope, unless released or detached") {
  FakeNode node(sluice::Transport::kUdp, Behaviour::kLeases);
  auto client = make_client({.nodes = {node.address()}, .timeout = milliseconds(500)});
  const std::string key = "jobs|tenant=t1";

  SUBCASE("destroyed: released in the background") {
    {
      auto [r, lease] = client->acquire("jobs", {{"tenant", "t1"}});
      CHECK(r.allowed);
      CHECK(lease.held());
      CHECK(lease.id() == r.lease);
      CHECK(node.leases().held(key) == 1);
    }
    REQUIRE(wait_releases(node, 1));
    CHECK(node.leases().held(key) == 0);
  }
  SUBCASE("released by hand: the outcome, and nothing more at destruction") {
    {
      auto [r, lease] = client->acquire("jobs", {{"tenant", "t1"}});
      const sluice::ReleaseResult rr = lease.release();
      CHECK(rr.released());
      CHECK_FALSE(lease.held());
      CHECK(node.leases().held(key) == 0);
      // Holding nothing: nothing sent.
      CHECK(lease.release().outcome == Outcome::kInvalid);
    }
    CHECK(node.leases().releases() == 1);
  }
  SUBCASE("detached: held until the caller releases it") {
    uint64_t id = 0;
    {
      auto [r, lease] = client->acquire("jobs", {{"tenant", "t1"}});
      id = lease.detach();
      CHECK(id == r.lease);
      CHECK_FALSE(lease.held());
    }
    CHECK(node.leases().releases() == 0);
    CHECK(node.leases().held(key) == 1);
    CHECK(client->release("jobs", {{"tenant", "t1"}}, id).released());
  }
  SUBCASE("moved: released once, by its last owner; move assignment releases what it held") {
    {
      auto [r1, first] = client->acquire("jobs", {{"tenant", "t1"}});
      sluice::Lease owner = std::move(first);
      CHECK_FALSE(first.held());  // NOLINT(bugprone-use-after-move): moved from holds nothing
      CHECK(owner.held());
      auto [r2, second] = client->acquire("jobs", {{"tenant", "t1"}});
      CHECK(node.leases().held(key) == 2);
      owner = std::move(second);  // the first lease is released now
      CHECK(owner.id() == r2.lease);
      REQUIRE(wait_releases(node, 1));
      CHECK(node.leases().held(key) == 1);
    }
    REQUIRE(wait_releases(node, 2));
    CHECK(node.leases().held(key) == 0);
  }
  SUBCASE("built from a decision: the entries are copied") {
    sluice::Lease lease;
    {
      const std::string tenant = "t1";
      const std::vector<sluice::Entry> entries = {{"tenant", tenant}};
      const Result r = client->check("jobs", entries);
      lease = sluice::Lease(*client, "jobs", entries, r);
    }  // the caller's strings are gone; the lease kept its own copy
    CHECK(lease.release().released());
  }
}

TEST_CASE("leases: a denied or undecided check holds no lease, and nothing is released for it") {
  SUBCASE("denied") {
    FakeNode node(sluice::Transport::kUdp, Behaviour::kLeases);
    auto client = make_client({.nodes = {node.address()}, .timeout = milliseconds(500)});
    auto [r1, l1] = client->acquire("jobs", {{"tenant", "t"}});
    auto [r2, l2] = client->acquire("jobs", {{"tenant", "t"}});
    {
      auto [r3, l3] = client->acquire("jobs", {{"tenant", "t"}});
      CHECK_FALSE(r3.allowed);
      CHECK_FALSE(l3.held());
    }
    CHECK(node.leases().releases() == 0);
    CHECK(l1.held());
    CHECK(l2.held());
  }
  SUBCASE("no node answers: fail-open, and no lease") {
    FakeNode node(sluice::Transport::kUdp, Behaviour::kSilent);
    auto client = make_client({.nodes = {node.address()}, .timeout = milliseconds(30)});
    auto [r, lease] = client->acquire("jobs", {{"tenant", "t"}});
    CHECK(r.failed_open());
    CHECK(r.lease == 0);
    CHECK_FALSE(lease.held());
    // A release nobody answers: unavailable, the lease is left to expire.
    const sluice::ReleaseResult rr = client->release("jobs", {{"tenant", "t"}}, 7);
    CHECK(rr.outcome == Outcome::kUnavailable);
    CHECK(sluice::to_string(rr) == "unavailable");
    CHECK_FALSE(rr.gone());
  }
}
