// Unit tests of the check front (lib/front/check/check_front.h) on its own, with a fake
// CheckPath in place of the node's routed check path: UDP datagrams and TCP frames reach the
// worker's path and its answers reach the client; an answer decided later (kLater) reaches its
// UDP client or TCP connection through WorkerLoop::answer; drops and rejections are counted;
// check_async runs on a worker and answers nothing once the front has stopped.
#include "front/check/check_front.h"

#include <doctest/doctest.h>

#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <cctype>
#include <cstdint>
#include <future>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "wire/protocol.h"

namespace {

using sluice::front::check::CheckFront;
using sluice::front::check::CheckFrontOptions;
using sluice::front::check::CheckPath;
using sluice::front::check::Reply;
using sluice::front::check::WorkerLoop;
using Bytes = std::vector<uint8_t>;
using sluice::Status;
using sluice::StatusCode;
using sluice::front::check::validate;

Bytes bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}
std::string text(std::span<const uint8_t> b) {
  return std::string(b.begin(), b.end());
}

// Answers the request in capitals (as long as the request, so it fits any cap); "drop" is
// dropped, "bad" rejected, "later" kept and answered (as "late:later") when the next "flush"
// comes in, on the same worker.
class FakePath final : public CheckPath {
 public:
  explicit FakePath(WorkerLoop& loop) : loop_(loop) {}
  Outcome decide(std::span<const uint8_t> request, size_t max_answer_bytes, int64_t,
                 std::vector<uint8_t>& out, const Reply& reply) override {
    const std::string r = text(request);
    if (r == "drop") return Outcome::kDrop;
    if (r == "later") {
      kept_ = reply;
      return Outcome::kLater;
    }
    if (r == "flush" && kept_) {
      const Bytes late = bytes("late:later");
      loop_.answer(*kept_, late);
      kept_.reset();
    }
    out.assign(request.begin(), request.end());
    for (uint8_t& c : out)
      c = static_cast<uint8_t>(std::toupper(c));
    if (out.size() > max_answer_bytes) return Outcome::kDrop;
    return r == "bad" ? Outcome::kRejected : Outcome::kAnswer;
  }
  void stop() override { stopped = true; }
  bool stopped = false;

 private:
  WorkerLoop& loop_;
  std::optional<Reply> kept_;
};

// A front with one worker on loopback (ports picked by the kernel), its acceptor on a control
// thread of the test's.
struct Harness {
  explicit Harness(unsigned threads = 1) {
    CheckFrontOptions o;
    o.udp_listen = "127.0.0.1:0";
    o.tcp_listen = "127.0.0.1:0";
    o.threads = threads;
    o.clock = [] { return int64_t{1'000}; };
    front.emplace(std::move(o), control);
    front->bind();
    front->start([this](WorkerLoop& loop) {
      auto p = std::make_unique<FakePath>(loop);
      paths.push_back(p.get());
      return p;
    });
    control_thread = std::thread([this] { control.run(); });
  }
  ~Harness() { shut(); }
  void shut() {
    if (!control_thread.joinable()) return;
    std::promise<void> stopped;
    boost::asio::post(control, [&] {
      front->stop();
      work.reset();
      stopped.set_value();
    });
    stopped.get_future().wait();
    front->join();
    control_thread.join();
  }

  boost::asio::io_context control{1};
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work{
      control.get_executor()};
  std::optional<CheckFront> front;
  std::vector<FakePath*> paths;
  std::thread control_thread;
};

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

void receive_timeout(int fd) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

struct UdpClient {
  explicit UdpClient(uint16_t port) : to(loopback(port)) {
    fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    receive_timeout(fd);
  }
  ~UdpClient() { ::close(fd); }
  void send(const std::string& s) {
    ::sendto(fd, s.data(), s.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
  }
  std::string receive() {
    char buf[2048];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    return n < 0 ? std::string("<timeout>") : std::string(buf, static_cast<size_t>(n));
  }
  int fd;
  sockaddr_in to;
};

struct TcpClient {
  explicit TcpClient(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    const sockaddr_in a = loopback(port);
    REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
    receive_timeout(fd);
  }
  ~TcpClient() { ::close(fd); }
  void send(const std::string& s) {
    Bytes frame;
    sluice::wire::append_frame(bytes(s), frame);
    REQUIRE(::send(fd, frame.data(), frame.size(), 0) == static_cast<ssize_t>(frame.size()));
  }
  std::string receive() {
    while (true) {
      if (auto f = frames.next()) return text(*f);
      uint8_t buf[2048];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return "<closed>";
      frames.feed({buf, static_cast<size_t>(n)});
    }
  }
  int fd;
  sluice::wire::FrameReader frames;
};

TEST_CASE(
    "check front: a datagram is answered by the worker's path, and a dropped one is counted") {
  Harness h;
  UdpClient c(h.front->udp_port());
  c.send("hello");
  CHECK(c.receive() == "HELLO");
  c.send("bad");
  CHECK(c.receive() == "BAD");
  c.send("drop");
  c.send("after");
  CHECK(c.receive() == "AFTER");
  const auto k = h.front->counters();
  CHECK(k.udp_requests == 4);
  CHECK(k.rejected_requests == 1);
  CHECK(k.dropped_datagrams == 1);
}

TEST_CASE("check front: TCP frames on one connection are answered in order, as frames") {
  Harness h;
  TcpClient c(h.front->tcp_port());
  c.send("one");
  c.send("two");
  CHECK(c.receive() == "ONE");
  CHECK(c.receive() == "TWO");
  const auto k = h.front->counters();
  CHECK(k.tcp_requests == 2);
  CHECK(k.tcp_connections == 1);
  CHECK(k.tcp_open == 1);
}

TEST_CASE("check front: a TCP frame the path drops closes the connection and is counted") {
  Harness h;
  TcpClient c(h.front->tcp_port());
  c.send("drop");
  CHECK(c.receive() == "<closed>");
  CHECK(h.front->counters().bad_frames == 1);
}

TEST_CASE("check front: an answer decided later reaches its UDP client and its TCP connection") {
  Harness h;
  UdpClient u(h.front->udp_port());
  u.send("later");
  u.send("flush");
  CHECK(u.receive() == "late:later");
  CHECK(u.receive() == "FLUSH");
  TcpClient t(h.front->tcp_port());
  t.send("later");
  t.send("flush");
  CHECK(t.receive() == "late:later");
  CHECK(t.receive() == "FLUSH");
}

TEST_CASE("check front: check_async decides on a worker, and answers nothing after stop") {
  Harness h(2);
  std::promise<std::string> answer;
  h.front->check_async(bytes("async"),
                       [&](std::span<const uint8_t> a) { answer.set_value(text(a)); });
  CHECK(answer.get_future().get() == "ASYNC");
  std::promise<std::string> dropped;
  h.front->check_async(bytes("drop"),
                       [&](std::span<const uint8_t> a) { dropped.set_value(text(a)); });
  CHECK(dropped.get_future().get().empty());

  h.shut();
  for (const FakePath* p : h.paths)
    CHECK(p->stopped);
  bool called = false;
  size_t size = 1;
  h.front->check_async(bytes("late"), [&](std::span<const uint8_t> a) {
    called = true;
    size = a.size();
  });
  CHECK(called);
  CHECK(size == 0);
}

TEST_CASE("check front: a malformed listen address is refused, naming it") {
  CheckFrontOptions o;
  o.udp_listen = "localhost:7350";
  Status s = validate(o);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "listen address 'localhost:7350': 'localhost' is not an IP address");
  o.udp_listen = "";
  o.tcp_listen = "127.0.0.1";
  CHECK(validate(o).message() == "listen address '127.0.0.1': expected HOST:PORT");
  o.tcp_listen = "127.0.0.1:70000";
  CHECK(validate(o).message() == "listen address '127.0.0.1:70000': bad port '70000'");
  o.tcp_listen = "[::1]:0";
  CHECK(validate(o).ok());
  o.tcp_listen = ":7350";
  CHECK(validate(o).ok());
}

}  // namespace
