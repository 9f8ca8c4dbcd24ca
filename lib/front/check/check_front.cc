// The check front: UDP and TCP listeners, workers, slow-client deadlines. The front's only Asio
// translation unit; a worker and its TCP connections are in check_worker.h.
#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include "front/check/check_front.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <cstring>
#include <stdexcept>

#include "base/host_port.h"
#include "front/check/check_worker.h"

namespace sluice::front::check {

namespace {

// "127.0.0.1:7350", "[::1]:7350", ":7350" (all IPv4 interfaces). Hostnames are not resolved:
// a listener must name an address.
StatusOr<std::pair<asio::ip::address, uint16_t>> parse_listen(const std::string& s) {
  StatusOr<HostPort> hp = split_host_port(s);
  if (!hp.ok()) return Status::InvalidArgument("listen address '" + s + "': " + hp.message());
  if (hp->host.empty()) hp->host = "0.0.0.0";
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(hp->host, ec);
  if (ec) {
    return Status::InvalidArgument("listen address '" + s + "': '" + hp->host +
                                   "' is not an IP address");
  }
  return std::pair{addr, hp->port};
}

// The address of a validated listener (validate()).
std::pair<asio::ip::address, uint16_t> validated_listen(const std::string& s) {
  StatusOr<std::pair<asio::ip::address, uint16_t>> p = parse_listen(s);
  if (!p.ok()) throw std::logic_error("CheckFront with unvalidated options: " + p.message());
  return *p;
}

// Fills the reply headers of answer `k` for the datagram in slot i.
void queue_udp_answer(Worker& w, size_t i, size_t k, std::vector<uint8_t>& out) {
  w.iov_out[k] = {out.data(), out.size()};
  w.replies[k] = {};
  w.replies[k].msg_hdr.msg_name = &w.peers[i];
  w.replies[k].msg_hdr.msg_namelen = w.msgs[i].msg_hdr.msg_namelen;
  w.replies[k].msg_hdr.msg_iov = &w.iov_out[k];
  w.replies[k].msg_hdr.msg_iovlen = 1;
}

// Serves every datagram waiting on the socket, up to kUdpBurst per system call in each
// direction (recvmmsg / sendmmsg): under load one wake-up answers many checks, which is where a
// UDP server's time goes (a profile of the one-datagram-per-call loop showed ~65 % in the kernel).
bool udp_serve_ready(Worker& w) {
  const int fd = w.udp_socket->native_handle();
  bool served = false;
  for (int round = 0; round < kUdpRounds; ++round) {
    for (size_t i = 0; i < kUdpBurst; ++i) {
      w.iov_in[i] = {w.udp_in.data() + i * kUdpSlot, kUdpSlot};
      w.msgs[i] = {};
      w.msgs[i].msg_hdr.msg_name = &w.peers[i];
      w.msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
      w.msgs[i].msg_hdr.msg_iov = &w.iov_in[i];
      w.msgs[i].msg_hdr.msg_iovlen = 1;
    }
    const int got = ::recvmmsg(fd, w.msgs.data(), kUdpBurst, MSG_DONTWAIT, nullptr);
    // EAGAIN: drained; other errors (ICMP) are per-send and harmless here.
    if (got <= 0) return served;
    served = true;
    const int64_t now = w.opt.clock();
    size_t answers = 0;
    for (size_t i = 0; i < static_cast<size_t>(got); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const size_t n = w.msgs[i].msg_len;
      w.counters.udp_requests.fetch_add(1, std::memory_order_relaxed);
      if ((w.msgs[i].msg_hdr.msg_flags & MSG_TRUNC) != 0) {
        w.counters.dropped_datagrams.fetch_add(1, std::memory_order_relaxed);  // over 64 KiB
        continue;
      }
      std::vector<uint8_t>& out = w.udp_out[answers];
      // An answer is never larger than its request (no amplification).
      const std::span<const uint8_t> request(w.udp_in.data() + i * kUdpSlot, n);
      Reply& reply = w.udp_reply;
      reply.udp_peer_len = w.msgs[i].msg_hdr.msg_namelen;
      std::memcpy(&reply.udp_peer, &w.peers[i], reply.udp_peer_len);
      reply.t0 = t0;
      const CheckPath::Outcome o = w.path->decide(request, n, now, out, reply);
      if (o == CheckPath::Outcome::kLater) continue;  // answered when the owners have
      if (o == CheckPath::Outcome::kDrop) {
        w.counters.dropped_datagrams.fetch_add(1, std::memory_order_relaxed);
      } else {
        if (o == CheckPath::Outcome::kRejected) {
          w.counters.rejected_requests.fetch_add(1, std::memory_order_relaxed);
        }
        queue_udp_answer(w, i, answers++, out);
      }
      w.counters.record_latency(t0);
    }
    for (size_t sent = 0; sent < answers;) {
      const int k = ::sendmmsg(fd, w.replies.data() + sent, static_cast<unsigned>(answers - sent),
                               MSG_DONTWAIT);
      if (k <= 0) {  // socket buffer full or an error: those answers are lost, and counted
        w.counters.dropped_datagrams.fetch_add(answers - sent, std::memory_order_relaxed);
        break;
      }
      sent += static_cast<size_t>(k);
    }
    if (static_cast<size_t>(got) < kUdpBurst) return served;  // drained
  }
  return served;
}

void udp_receive(Worker& w);

// CheckFrontOptions::udp_busy_poll_us: reads the socket again until `until` has passed with
// nothing new, one non-blocking read per turn of the worker's io_context (so its TCP connections
// and timers still run in between), then goes back to waiting for the kernel to wake it.
void udp_spin(Worker& w, std::chrono::steady_clock::time_point until) {
  asio::post(w.io_ctx, [&w, until] {
    if (w.stopped) return;
    const auto now = std::chrono::steady_clock::now();
    if (udp_serve_ready(w)) {
      udp_spin(w, now + std::chrono::microseconds(w.opt.udp_busy_poll_us));
    } else if (now < until) {
      udp_spin(w, until);
    } else {
      udp_receive(w);
    }
  });
}

void udp_receive(Worker& w) {
  w.udp_socket->async_wait(udp::socket::wait_read, [&w](boost::system::error_code ec) {
    if (ec == asio::error::operation_aborted || w.stopped) return;
    if (!ec) udp_serve_ready(w);
    if (!ec && w.opt.udp_busy_poll_us > 0) {
      udp_spin(
          w, std::chrono::steady_clock::now() + std::chrono::microseconds(w.opt.udp_busy_poll_us));
      return;
    }
    udp_receive(w);
  });
}

void shed_oldest_waiting(Worker& w) {
  std::shared_ptr<Connection> oldest;
  for (const auto& p : w.connections) {
    auto s = p.lock();
    if (s && s->waiting() && (!oldest || s->waiting_since() < oldest->waiting_since())) {
      oldest = std::move(s);
    }
  }
  if (!oldest) return;  // every connection busy: this one is served all the same
  w.counters.tcp_closed_shed.fetch_add(1, std::memory_order_relaxed);
  oldest->close_now();
}

// Every quarter of client_timeout_ms (at most 1 s): connections that began a frame longer ago
// than client_timeout_ms and have not finished it are closed (a client sending a byte at a time).
void arm_tcp_deadlines(Worker& w, int64_t timeout_ms) {
  w.tcp_deadlines->expires_after(
      std::chrono::milliseconds(std::min<int64_t>(1'000, timeout_ms / 4)));
  w.tcp_deadlines->async_wait([&w, timeout_ms](boost::system::error_code ec) {
    if (ec || w.stopped) return;
    const auto limit = std::chrono::steady_clock::now() - std::chrono::milliseconds(timeout_ms);
    for (const auto& p : w.connections) {
      auto s = p.lock();
      if (s && s->frame_started() < limit) {
        w.counters.tcp_closed_frame.fetch_add(1, std::memory_order_relaxed);
        s->close_now();
      }
    }
    w.connections.remove_if([](const auto& p) { return p.expired(); });
    arm_tcp_deadlines(w, timeout_ms);
  });
}

}  // namespace

Status validate(const CheckFrontOptions& options) {
  for (const std::string* l : {&options.udp_listen, &options.tcp_listen}) {
    if (l->empty()) continue;
    if (auto p = parse_listen(*l); !p.ok()) return p.status();
  }
  return {};
}

// ---- a worker's later answers -------------------------------------------------------------------

void Worker::answer(Reply& to, std::span<const uint8_t> answer) {
  if (to.callback) {
    const auto done = std::move(to.callback);
    to.callback = nullptr;
    done(answer);
  } else if (answer.empty()) {
    counters.dropped_datagrams.fetch_add(1, std::memory_order_relaxed);
  } else if (auto c = to.connection.lock()) {
    c->deliver(answer);
    counters.record_latency(to.t0);
  } else if (to.udp_peer_len != 0 && udp_socket) {
    ::sendto(udp_socket->native_handle(), answer.data(), answer.size(), MSG_DONTWAIT,
             reinterpret_cast<const sockaddr*>(&to.udp_peer), to.udp_peer_len);
    counters.record_latency(to.t0);
  }
}

// ---- the front ----------------------------------------------------------------------------------

struct CheckFront::Impl {
  Impl(CheckFrontOptions o, asio::io_context& c) : opt(std::move(o)), control(c) {}

  void accept_next();

  CheckFrontOptions opt;
  asio::io_context& control;
  std::optional<tcp::acceptor> acceptor;  // control thread
  std::vector<std::unique_ptr<Worker>> workers;
  size_t next_worker = 0;                    // accept_next's round-robin; control thread
  std::atomic<size_t> next_async_worker{0};  // check_async's round-robin
  std::atomic<uint16_t> udp_port{0}, tcp_port{0};
  std::atomic<bool> open{false};  // bound and not stopped: check_async posts to the workers
};

void CheckFront::Impl::accept_next() {
  Worker& w = *workers[next_worker++ % workers.size()];
  acceptor->async_accept(w.io_ctx, [this, &w](boost::system::error_code ec, tcp::socket s) {
    if (ec) {
      if (ec == asio::error::operation_aborted || !open.load()) return;
      spdlog::warn("tcp accept: {}", ec.message());
      accept_next();
      return;
    }
    boost::system::error_code ignored;
    s.set_option(tcp::no_delay(true), ignored);
    w.counters.tcp_connections.fetch_add(1, std::memory_order_relaxed);
    // The connection lives on its worker's thread from here on.
    asio::post(w.io_ctx, [this, &w, sock = std::move(s)]() mutable {
      if (w.stopped) return;
      auto c = std::make_shared<Connection>(w, std::move(sock), opt.max_tcp_pending_bytes);
      w.connections.remove_if([](const auto& p) { return p.expired(); });
      // Each worker holds its part of max_connections (accepts go round the workers); at it, the
      // connection that has waited longest for a request makes room (slow or idle clients).
      const size_t cap = (opt.max_connections + workers.size() - 1) / workers.size();
      if (w.connections.size() >= cap) shed_oldest_waiting(w);
      w.connections.push_back(c);
      c->start();
    });
    accept_next();
  });
}

CheckFront::CheckFront(CheckFrontOptions options, asio::io_context& control) {
  impl_ = std::make_unique<Impl>(std::move(options), control);
}

CheckFront::~CheckFront() {
  join();
}

// Workers and their UDP sockets (one per worker, SO_REUSEPORT on one port), and the TCP listener.
void CheckFront::bind() {
  Impl& f = *impl_;
  for (unsigned i = 0; i < f.opt.threads; ++i)
    f.workers.push_back(std::make_unique<Worker>(f.opt));
  if (!f.opt.udp_listen.empty()) {
    auto [addr, port] = validated_listen(f.opt.udp_listen);
    for (auto& w : f.workers) {
      udp::socket s(w->io_ctx);
      const udp::endpoint ep(addr, port);
      s.open(ep.protocol());
      s.set_option(asio::socket_base::reuse_address(true));
      const int one = 1;
      ::setsockopt(s.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
      s.set_option(asio::socket_base::receive_buffer_size(4 << 20));
      boost::system::error_code ec;
      s.bind(ep, ec);
      if (ec) throw std::runtime_error("udp " + f.opt.udp_listen + ": " + ec.message());
      port = s.local_endpoint().port();  // the first bind picks the port for the others
      w->udp_socket.emplace(std::move(s));
    }
    f.udp_port = port;
  }
  if (!f.opt.tcp_listen.empty()) {
    auto [addr, port] = validated_listen(f.opt.tcp_listen);
    const tcp::endpoint ep(addr, port);
    f.acceptor.emplace(f.control);
    f.acceptor->open(ep.protocol());
    f.acceptor->set_option(asio::socket_base::reuse_address(true));
    boost::system::error_code ec;
    f.acceptor->bind(ep, ec);
    if (ec) throw std::runtime_error("tcp " + f.opt.tcp_listen + ": " + ec.message());
    f.acceptor->listen(asio::socket_base::max_listen_connections);
    f.tcp_port = f.acceptor->local_endpoint().port();
  }
  // A request posted to a worker from now on waits for start(), which builds its path before
  // the worker's thread runs it.
  f.open = true;
}

std::vector<asio::io_context*> CheckFront::worker_contexts() {
  std::vector<asio::io_context*> out;
  for (auto& w : impl_->workers)
    out.push_back(&w->io_ctx);
  return out;
}

uint16_t CheckFront::udp_port() const {
  return impl_->udp_port.load();
}
uint16_t CheckFront::tcp_port() const {
  return impl_->tcp_port.load();
}

void CheckFront::start(const CheckPathFactory& make_path) {
  Impl& f = *impl_;
  for (auto& w : f.workers)
    w->path = make_path(*w);
  for (auto& w : f.workers) {
    w->work.emplace(w->io_ctx.get_executor());
    if (w->udp_socket) udp_receive(*w);
    if (f.acceptor) {
      w->tcp_deadlines.emplace(w->io_ctx);
      arm_tcp_deadlines(*w, f.opt.client_timeout_ms);
    }
    w->thread = std::thread([&io = w->io_ctx] { io.run(); });
  }
  if (f.acceptor) f.accept_next();
}

void CheckFront::stop() {
  Impl& f = *impl_;
  f.open = false;
  boost::system::error_code ec;
  if (f.acceptor) f.acceptor->close(ec);
  for (auto& w : f.workers) {
    asio::post(w->io_ctx, [&w = *w] {
      if (w.path) w.path->stop();  // decides here what the owners have not answered yet
      w.stopped = true;
      boost::system::error_code e;
      if (w.udp_socket) w.udp_socket->close(e);
      if (w.tcp_deadlines) w.tcp_deadlines->cancel();
      for (auto& p : w.connections) {
        if (auto c = p.lock()) c->drain();
      }
      w.work.reset();  // io.run() returns once the last answers are written
    });
  }
}

void CheckFront::join() {
  for (auto& w : impl_->workers) {
    if (w->thread.joinable()) w->thread.join();
  }
}

void CheckFront::check_async(std::vector<uint8_t> request,
                             std::function<void(std::span<const uint8_t>)> done) {
  Impl& f = *impl_;
  if (!f.open.load() || f.workers.empty()) {
    done({});
    return;
  }
  Worker& w = *f.workers[f.next_async_worker.fetch_add(1) % f.workers.size()];
  asio::post(w.io_ctx, [&w, request = std::move(request), done = std::move(done)]() mutable {
    Reply reply;
    reply.callback = std::move(done);
    reply.t0 = std::chrono::steady_clock::now();
    std::vector<uint8_t> out;
    const CheckPath::Outcome o =
        w.path->decide(request, wire::kMaxFrameBytes, w.opt.clock(), out, reply);
    if (o == CheckPath::Outcome::kLater) return;  // `done` runs when the owners answered
    reply.callback(o == CheckPath::Outcome::kDrop ? std::span<const uint8_t>()
                                                  : std::span<const uint8_t>(out));
  });
}

CheckFrontCounters CheckFront::counters() const {
  CheckFrontCounters c;
  c.latency_us_buckets.assign(kLatencyBuckets, 0);
  for (const auto& w : impl_->workers) {
    const WorkerCounters& k = w->counters;
    c.udp_requests += k.udp_requests.load(std::memory_order_relaxed);
    c.tcp_requests += k.tcp_requests.load(std::memory_order_relaxed);
    c.tcp_connections += k.tcp_connections.load(std::memory_order_relaxed);
    c.tcp_open += k.tcp_open.load(std::memory_order_relaxed);
    c.tcp_closed_shed += k.tcp_closed_shed.load(std::memory_order_relaxed);
    c.tcp_closed_frame += k.tcp_closed_frame.load(std::memory_order_relaxed);
    c.dropped_datagrams += k.dropped_datagrams.load(std::memory_order_relaxed);
    c.bad_frames += k.bad_frames.load(std::memory_order_relaxed);
    c.rejected_requests += k.rejected_requests.load(std::memory_order_relaxed);
    for (size_t i = 0; i < kLatencyBuckets; ++i) {
      c.latency_us_buckets[i] += k.latency[i].load(std::memory_order_relaxed);
    }
  }
  return c;
}

}  // namespace sluice::front::check
