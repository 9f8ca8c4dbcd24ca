// The node's network front: Asio UDP and TCP listeners, workers, signals, timers. The only Asio
// translation unit of the check path (the admin port has its own, admin_http.cc). A worker and
// its TCP sessions are in worker.h; cluster owner mode's forwarding, in forwarder.h.
#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include "node/node.h"

#include <spdlog/spdlog.h>

#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <sys/socket.h>

#include "node/admin_auth.h"
#include "node/check_handler.h"
#include "node/admin_http.h"
#include "node/forwarder.h"
#include "node/node_cluster.h"
#include "node/node_state.h"
#include "node/owner_routing.h"
#include "node/rules_watch.h"
#include "node/worker.h"

#include <future>

namespace sluice::node {

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::ip::udp;

namespace {

// "127.0.0.1:7350", "[::1]:7350", ":7350" (all IPv4 interfaces). Hostnames are not resolved:
// a listener must name an address.
std::pair<asio::ip::address, uint16_t> parse_listen(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos)
    throw std::runtime_error("listen address '" + s + "' has no port");
  std::string host = s.substr(0, colon);
  const std::string port = s.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) host = "0.0.0.0";
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  if (ec)
    throw std::runtime_error("listen address '" + s + "': '" + host + "' is not an IP address");
  char* end = nullptr;
  const unsigned long p = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p > 65535) {
    throw std::runtime_error("listen address '" + s + "': bad port '" + port + "'");
  }
  return {addr, static_cast<uint16_t>(p)};
}

}  // namespace

struct Node::Impl : NodeState {
  explicit Impl(NodeOptions o) : NodeState(std::move(o)) {
    // Malformed listen addresses are config errors: report them before anything starts.
    for (const std::string* l : {&opt.udp_listen, &opt.tcp_listen}) {
      if (!l->empty()) parse_listen(*l);
    }
    // load_node_config read the token; options built in code may name only the file.
    if (!opt.admin_token_file.empty() && opt.admin_token.empty()) {
      if (std::string err = read_admin_token_file(opt.admin_token_file, opt.admin_token);
          !err.empty()) {
        throw std::runtime_error("admin_token_file: " + err);
      }
    }
    if (opt.admin_token_reads && opt.admin_token.empty()) {
      throw std::runtime_error("admin_token_reads needs admin_token_file (the token to ask for)");
    }
    admin_auth = std::make_unique<AdminAuth>(opt.admin_token, opt.admin_token_reads);
  }

  // SIGHUP: the admin token file is read again; a file that became unreadable or empty keeps the
  // token in force (and says so).
  void reload_admin_token() {
    if (opt.admin_token_file.empty()) return;
    std::string token;
    if (std::string err = read_admin_token_file(opt.admin_token_file, token); !err.empty()) {
      spdlog::error("SIGHUP: admin token not reloaded, the old token stays: {}", err);
      return;
    }
    admin_auth->set_token(token);
    spdlog::info("admin token reloaded from {}", opt.admin_token_file);
  }

  std::unique_ptr<AdminAuth> admin_auth;    // used by the admin thread; set_token from control
  std::unique_ptr<RulesWatch> rules_watch;  // control thread

  // Every I/O object on `control` or `admin_io` is declared below them, so it is destroyed
  // before them: an object that outlives its io_context reads the freed service in its destructor
  // (the rules watch's timer once did, at every clean stop: tests/node_lifetime_test.cc).
  asio::io_context control{1};
  // The admin port has its own thread: operator actions may wait on the disk (overrides are
  // synced, `snapshot` waits for a pass) without holding up accepts, timers or signals.
  asio::io_context admin_io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> admin_work;
  std::thread admin_thread;
  std::optional<tcp::acceptor> acceptor;
  std::unique_ptr<AdminHttp> admin;
  std::unique_ptr<rls::RlsServer> rls;  // the gRPC front; gRPC's threads
  std::optional<asio::signal_set> signals;
  std::optional<asio::steady_timer> sweep_timer;
  std::optional<asio::steady_timer> rules_watch_timer;  // control thread
  std::vector<std::unique_ptr<Worker>> workers;
  size_t next_worker = 0;
  std::atomic<uint16_t> udp_port{0}, tcp_port{0}, admin_port{0}, grpc_port{0};
  std::atomic<bool> stopped{false};
  std::atomic<size_t> next_async_worker{0};  // Node::check_async's round-robin
  // Tells check_here's per-thread handlers of this node from those of a node that is gone.
  const uint64_t instance = next_instance.fetch_add(1) + 1;
  static inline std::atomic<uint64_t> next_instance{0};
  std::unique_ptr<ClusterNode> cluster;  // null for a single node; control thread
};

int64_t TcpSession::node_now() const {
  return w_.opt.clock();
}

CheckHandler::Outcome TcpSession::serve_frame(std::span<const uint8_t> frame,
                                              std::chrono::steady_clock::time_point t0) {
  if (w_.fwd) {
    Worker::Forwarder::Client c;
    c.tcp = true;
    c.session = weak_from_this();
    return w_.fwd->handle(frame, wire::kMaxFrameBytes, node_now(), w_.out, c, t0);
  }
  return w_.handler.handle(frame, wire::kMaxFrameBytes, node_now(), w_.out)
             ? CheckHandler::Outcome::kAnswer
             : CheckHandler::Outcome::kDrop;
}

namespace {

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
      CheckHandler::Outcome o;
      if (w.fwd) {
        Worker::Forwarder::Client c;
        c.addr = w.peers[i];
        c.addr_len = w.msgs[i].msg_hdr.msg_namelen;
        o = w.fwd->handle(request, n, now, out, c, t0);
        if (o == CheckHandler::Outcome::kForward) continue;  // answered when the owners have
      } else {
        o = w.handler.handle(request, n, now, out) ? CheckHandler::Outcome::kAnswer
                                                   : CheckHandler::Outcome::kDrop;
      }
      if (o == CheckHandler::Outcome::kAnswer) {
        if (w.handler.last_code() != wire::Code::kOk) {
          w.counters.rejected_requests.fetch_add(1, std::memory_order_relaxed);
        }
        w.iov_out[answers] = {out.data(), out.size()};
        w.replies[answers] = {};
        w.replies[answers].msg_hdr.msg_name = &w.peers[i];
        w.replies[answers].msg_hdr.msg_namelen = w.msgs[i].msg_hdr.msg_namelen;
        w.replies[answers].msg_hdr.msg_iov = &w.iov_out[answers];
        w.replies[answers].msg_hdr.msg_iovlen = 1;
        ++answers;
      } else {
        w.counters.dropped_datagrams.fetch_add(1, std::memory_order_relaxed);
      }
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
      w.counters.latency[latency_bucket(us)].fetch_add(1, std::memory_order_relaxed);
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

// NodeOptions::udp_busy_poll_us: reads the socket again until `until` has passed with nothing
// new, one non-blocking read per turn of the worker's io_context (so its TCP sessions and timers
// still run in between), then goes back to waiting for the kernel to wake it.
void udp_spin(Worker& w, std::chrono::steady_clock::time_point until) {
  asio::post(w.io, [&w, until] {
    if (w.stopping) return;
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
    if (ec == asio::error::operation_aborted || w.stopping) return;
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
  std::shared_ptr<TcpSession> oldest;
  for (const auto& p : w.sessions) {
    auto s = p.lock();
    if (s && s->waiting() && (!oldest || s->waiting_since() < oldest->waiting_since())) {
      oldest = std::move(s);
    }
  }
  if (!oldest) return;  // every session busy: this one is served all the same
  w.counters.tcp_closed_shed.fetch_add(1, std::memory_order_relaxed);
  oldest->close_now();
}

// Every quarter of client_timeout_ms (at most 1 s): sessions that began a frame longer ago than
// client_timeout_ms and have not finished it are closed (a client sending a byte at a time).
void arm_tcp_deadlines(Worker& w, int64_t timeout_ms) {
  w.tcp_deadlines->expires_after(
      std::chrono::milliseconds(std::min<int64_t>(1'000, timeout_ms / 4)));
  w.tcp_deadlines->async_wait([&w, timeout_ms](boost::system::error_code ec) {
    if (ec || w.stopping) return;
    const auto limit = std::chrono::steady_clock::now() - std::chrono::milliseconds(timeout_ms);
    for (const auto& p : w.sessions) {
      auto s = p.lock();
      if (s && s->frame_started() < limit) {
        w.counters.tcp_closed_frame.fetch_add(1, std::memory_order_relaxed);
        s->close_now();
      }
    }
    w.sessions.remove_if([](const auto& p) { return p.expired(); });
    arm_tcp_deadlines(w, timeout_ms);
  });
}

void accept_next(Node::Impl& n) {
  Worker& w = *n.workers[n.next_worker++ % n.workers.size()];
  n.acceptor->async_accept(w.io, [&n, &w](boost::system::error_code ec, tcp::socket s) {
    if (ec) {
      if (ec == asio::error::operation_aborted || n.stopped.load()) return;
      spdlog::warn("tcp accept: {}", ec.message());
      accept_next(n);
      return;
    }
    boost::system::error_code ignored;
    s.set_option(tcp::no_delay(true), ignored);
    w.counters.tcp_connections.fetch_add(1, std::memory_order_relaxed);
    // The session lives on its worker's thread from here on.
    asio::post(w.io, [&w, &n, sock = std::move(s), max = n.opt.max_tcp_pending_bytes]() mutable {
      if (w.stopping) return;
      auto session = std::make_shared<TcpSession>(w, std::move(sock), max);
      w.sessions.remove_if([](const auto& p) { return p.expired(); });
      // Each worker holds its part of max_connections (accepts go round the workers); at it, the
      // session that has waited longest for a request makes room (slow or idle clients).
      const size_t cap = (n.opt.max_connections + n.workers.size() - 1) / n.workers.size();
      if (w.sessions.size() >= cap) shed_oldest_waiting(w);
      w.sessions.push_back(session);
      session->start();
    });
    accept_next(n);
  });
}

void schedule_sweep(Node::Impl& n) {
  n.sweep_timer->expires_after(std::chrono::milliseconds(n.opt.sweep_interval_ms));
  n.sweep_timer->async_wait([&n](boost::system::error_code ec) {
    if (ec || n.stopped.load()) return;
    const size_t dropped = n.engine->sweep(n.opt.clock());
    if (dropped > 0) spdlog::debug("sweep: dropped {} expired counters", dropped);
    // Expired overrides already stopped applying; dropping them touches the disk: admin thread.
    if (n.admin_work) asio::post(n.admin_io, [&n] { n.prune_overrides(); });
    schedule_sweep(n);
  });
}

// "serving: udp 7350 tcp 7350 ...": the log line at start and the service manager's status.
std::string serving_status(const Node::Impl& n) {
  return fmt::format(
      "serving: udp {} tcp {} admin {} grpc {}, {} threads, rules {}{}{}", n.udp_port.load(),
      n.tcp_port.load(), n.admin_port.load(), n.grpc_port.load(), n.opt.threads,
      n.opt.rules_file.empty() ? (n.opt.envoy_rules.empty() ? "<embedded>" : "<none>")
                               : n.opt.rules_file,
      n.opt.envoy_rules.empty() ? "" : ", envoy rules ", n.opt.envoy_rules);
}

// Reloads the rules when their files' content changes (rules_watch.h), as SIGHUP does; a failed
// reload is logged once per change (the next look sees the same content) and counted.
void schedule_rules_watch(Node& node, Node::Impl& n) {
  n.rules_watch_timer->expires_after(std::chrono::milliseconds(n.opt.rules_watch_interval_ms));
  n.rules_watch_timer->async_wait([&node, &n](boost::system::error_code ec) {
    if (ec || n.stopped.load()) return;
    if (n.rules_watch->changed()) {
      spdlog::info("rules changed on disk: reloading");
      if (const std::string err = node.reload(); !err.empty()) {
        spdlog::error("rules changed on disk but were not reloaded, the old rules stay:\n{}", err);
      }
    }
    schedule_rules_watch(node, n);
  });
}

}  // namespace

Node::Node(NodeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  state_ = impl_.get();
}

Node::~Node() {
  stop();
  for (auto& w : impl_->workers) {
    if (w->thread.joinable()) w->thread.join();
  }
  if (impl_->admin_thread.joinable()) impl_->admin_thread.join();
}

void Node::run(bool handle_signals) {
  Impl& n = *impl_;
  // Workers and their UDP sockets (one per worker, SO_REUSEPORT on one port).
  for (unsigned i = 0; i < n.opt.threads; ++i) {
    n.workers.push_back(std::make_unique<Worker>(n, n.opt, *n.engine));
  }
  if (!n.opt.udp_listen.empty()) {
    auto [addr, port] = parse_listen(n.opt.udp_listen);
    for (auto& w : n.workers) {
      udp::socket s(w->io);
      const udp::endpoint ep(addr, port);
      s.open(ep.protocol());
      s.set_option(asio::socket_base::reuse_address(true));
      const int one = 1;
      ::setsockopt(s.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
      s.set_option(asio::socket_base::receive_buffer_size(4 << 20));
      boost::system::error_code ec;
      s.bind(ep, ec);
      if (ec) throw std::runtime_error("udp " + n.opt.udp_listen + ": " + ec.message());
      port = s.local_endpoint().port();  // the first bind picks the port for the others
      w->udp_socket.emplace(std::move(s));
    }
    n.udp_port = port;
  }
  if (!n.opt.tcp_listen.empty()) {
    auto [addr, port] = parse_listen(n.opt.tcp_listen);
    const tcp::endpoint ep(addr, port);
    n.acceptor.emplace(n.control);
    n.acceptor->open(ep.protocol());
    n.acceptor->set_option(asio::socket_base::reuse_address(true));
    boost::system::error_code ec;
    n.acceptor->bind(ep, ec);
    if (ec) throw std::runtime_error("tcp " + n.opt.tcp_listen + ": " + ec.message());
    n.acceptor->listen(asio::socket_base::max_listen_connections);
    n.tcp_port = n.acceptor->local_endpoint().port();
  }
  if (!n.opt.admin_listen.empty()) {
    n.admin = std::make_unique<AdminHttp>(n.admin_io, n.opt.admin_listen, *this, *n.admin_auth);
    n.admin_port = n.admin->port();
    if (!n.admin_auth->has_token() && !n.admin_auth->loopback_listener()) {
      spdlog::warn(
          "admin port {} is not on loopback and no admin_token_file is set: operator writes "
          "(overrides, plans, drain, snapshot) are refused; reads stay open",
          n.opt.admin_listen);
    }
  }
  if (!n.opt.grpc_listen.empty()) {
    rls::RlsOptions ro;
    ro.listen = n.opt.grpc_listen;
    ro.rate_limit_headers = n.opt.grpc_rate_limit_headers;
    ro.client_timeout_ms = n.opt.client_timeout_ms;
    rls::Backend backend;
    backend.check = [this](std::vector<uint8_t> request,
                           std::function<void(std::span<const uint8_t>)> done) {
      check_async(std::move(request), std::move(done));
    };
    backend.check_here = [this](std::span<const uint8_t> request, std::vector<uint8_t>& out) {
      return check_here(request, out);
    };
    backend.policy = [&n] { return n.engine->policy(); };
    n.rls = std::make_unique<rls::RlsServer>(std::move(ro), std::move(backend));
    n.rls->start();
    n.grpc_port = n.rls->port();
  }
  if (n.opt.cluster.enabled) {
    n.cluster = std::make_unique<ClusterNode>(n.control, n);
    n.cluster->start(n.udp_port.load(), n.admin_port.load());
    // Owner mode forwards over UDP to the owners' check ports.
    if (n.udp_port.load() != 0) {
      for (auto& w : n.workers)
        w->fwd = std::make_unique<Worker::Forwarder>(*w, *n.cluster, n.opt.cluster.secret);
    }
  }
  // Declared here, referenced by the signal handler while control runs below.
  std::function<void(boost::system::error_code, int)> on_signal;
  if (handle_signals) {
    n.signals.emplace(n.control, SIGHUP, SIGTERM, SIGINT);
    on_signal = [this, &n, &on_signal](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGHUP) {
        if (n.opt.on_event) n.opt.on_event(NodeEvent::kReloading, "reloading the rules");
        const std::string err = reload();
        if (!err.empty()) spdlog::error("SIGHUP: rules not reloaded, the old rules stay:\n{}", err);
        n.reload_admin_token();
        if (n.opt.on_event) {
          if (err.empty()) {
            n.opt.on_event(NodeEvent::kReloaded, serving_status(n));
          } else {
            n.opt.on_event(NodeEvent::kReloadFailed,
                           "rules not reloaded (see the log); the old rules stay in force");
          }
        }
        n.signals->async_wait(on_signal);
      } else {
        spdlog::info("signal {}: stopping; answering what is in flight", sig);
        stop();
      }
    };
    n.signals->async_wait(on_signal);
  }
  n.sweep_timer.emplace(n.control);
  schedule_sweep(n);
  if (n.opt.rules_watch_interval_ms > 0 &&
      !(n.opt.rules_file.empty() && n.opt.envoy_rules.empty())) {
    n.rules_watch =
        std::make_unique<RulesWatch>(std::vector<std::string>{n.opt.rules_file, n.opt.envoy_rules});
    n.rules_watch_timer.emplace(n.control);
    schedule_rules_watch(*this, n);
  }
  for (auto& w : n.workers) {
    w->work.emplace(w->io.get_executor());
    if (w->udp_socket) udp_receive(*w);
    if (n.acceptor) {
      w->tcp_deadlines.emplace(w->io);
      arm_tcp_deadlines(*w, n.opt.client_timeout_ms);
    }
    w->thread = std::thread([&io = w->io] { io.run(); });
  }
  if (n.acceptor) accept_next(n);
  n.admin_work.emplace(n.admin_io.get_executor());
  n.admin_thread = std::thread([&n] { n.admin_io.run(); });
  n.start_snapshots();
  spdlog::info("sluiced {}", serving_status(n));
  ready_ = true;
  if (n.rls) n.rls->set_serving(true);
  if (n.opt.on_event) n.opt.on_event(NodeEvent::kReady, serving_status(n));
  n.control.run();
  for (auto& w : n.workers) {
    if (w->thread.joinable()) w->thread.join();
  }
  if (n.admin_thread.joinable()) n.admin_thread.join();
  n.stop_snapshots();  // every check has been answered: this pass holds them all
  ready_ = false;
}

void Node::stop() {
  Impl& n = *impl_;
  if (n.stopped.exchange(true)) return;
  asio::post(n.control, [&n] {
    if (n.opt.on_event) {
      n.opt.on_event(NodeEvent::kStopping, "stopping: leaving, answering what is in flight");
    }
    boost::system::error_code ec;
    // First, while the workers still answer: gRPC calls in flight get their answers.
    if (n.rls) n.rls->shutdown(2'000);
    if (n.cluster) {
      n.cluster->leave();  // the other members take over this node's keys, with its counts
      n.cluster->stop();
    }
    if (n.acceptor) n.acceptor->close(ec);
    asio::post(n.admin_io, [&n] {
      if (n.admin) n.admin->stop();
      n.admin_work.reset();  // the admin thread ends once open answers are written
    });
    if (n.signals) n.signals->cancel(ec);
    if (n.sweep_timer) n.sweep_timer->cancel();
    if (n.rules_watch_timer) n.rules_watch_timer->cancel();
    for (auto& w : n.workers) {
      asio::post(w->io, [&w = *w] {
        if (w.fwd) w.fwd->stop();  // decides here what the owners have not answered yet
        w.stopping = true;
        boost::system::error_code e;
        if (w.udp_socket) w.udp_socket->close(e);
        if (w.tcp_deadlines) w.tcp_deadlines->cancel();
        for (auto& p : w.sessions) {
          if (auto s = p.lock()) s->drain();
        }
        w.work.reset();  // io.run() returns once the last answers are written
      });
    }
  });
}

std::string Node::reload() {
  return impl_->reload();
}

ClusterStatus Node::cluster_status() const {
  Impl& n = *impl_;
  if (!n.opt.cluster.enabled) return {};
  auto done = std::make_shared<std::promise<ClusterStatus>>();
  auto result = done->get_future();
  asio::post(n.control, [&n, done] {
    done->set_value(n.cluster && !n.stopped.load() ? n.cluster->status() : ClusterStatus{});
  });
  if (result.wait_for(std::chrono::seconds(2)) != std::future_status::ready) return {};
  return result.get();
}

std::string Node::not_ready() const {
  const Impl& n = *impl_;
  if (n.stopped.load()) return "stopping";
  if (!ready_.load()) return "starting";
  if (!n.opt.cluster.enabled) return {};
  const ClusterStatus c = cluster_status();
  if (!c.enabled) return n.stopped.load() ? "stopping" : "cluster status did not answer in 2 s";
  return c.not_ready;
}

std::vector<std::pair<uint16_t, std::string>> Node::owners_of(uint64_t counter) const {
  std::vector<std::pair<uint16_t, std::string>> out;
  const Impl& n = *impl_;
  if (!n.opt.cluster.enabled || !n.cluster) return out;
  const ClusterNode::View v = n.cluster->view();
  std::array<uint16_t, cluster::HashRing::kMaxReplicas> ids{};
  const size_t k = v.ring->owners(rules::routing_key(counter), ids);
  for (size_t i = 0; i < k; ++i)
    out.emplace_back(ids[i], std::string(v.ring->name_of(ids[i])));
  return out;
}

bool Node::check_here(std::span<const uint8_t> request, std::vector<uint8_t>& out) {
  Impl& n = *impl_;
  if (n.opt.cluster.enabled || n.stopped.load()) return false;
  struct Local {
    uint64_t node = 0;
    std::unique_ptr<CheckHandler> handler;
  };
  thread_local Local local;
  if (local.node != n.instance) {
    local.handler = std::make_unique<CheckHandler>(*n.engine);
    local.node = n.instance;
  }
  return local.handler->handle(request, wire::kMaxFrameBytes, n.opt.clock(), out);
}

void Node::check_async(std::vector<uint8_t> request,
                       std::function<void(std::span<const uint8_t>)> done) {
  Impl& n = *impl_;
  if (n.workers.empty() || n.stopped.load()) {
    done({});
    return;
  }
  Worker& w = *n.workers[n.next_async_worker.fetch_add(1) % n.workers.size()];
  asio::post(w.io, [&w, request = std::move(request), done = std::move(done)]() mutable {
    std::vector<uint8_t> out;
    const int64_t now = w.opt.clock();
    CheckHandler::Outcome o;
    if (w.fwd) {
      Worker::Forwarder::Client c;
      c.callback = done;
      o = w.fwd->handle(request, wire::kMaxFrameBytes, now, out, c,
                        std::chrono::steady_clock::now());
      if (o == CheckHandler::Outcome::kForward) return;  // `done` runs when the owners answered
    } else {
      o = w.handler.handle(request, wire::kMaxFrameBytes, now, out) ? CheckHandler::Outcome::kAnswer
                                                                    : CheckHandler::Outcome::kDrop;
    }
    done(o == CheckHandler::Outcome::kAnswer ? std::span<const uint8_t>(out)
                                             : std::span<const uint8_t>());
  });
}

bool Node::drain() {
  Impl& n = *impl_;
  if (!n.opt.cluster.enabled) return false;
  asio::post(n.control, [this, &n] {
    if (!n.cluster || n.stopped.load()) return;
    spdlog::info("drain: leaving the cluster, then stopping");
    // Leave and hand off (stop() does both), and stop answering at once: a node that kept
    // deciding after it left would decide without the others' counts (clients retry the others).
    stop();
  });
  return true;
}

uint16_t Node::udp_port() const {
  return impl_->udp_port.load();
}
uint16_t Node::tcp_port() const {
  return impl_->tcp_port.load();
}
uint16_t Node::grpc_port() const {
  return impl_->grpc_port.load();
}
uint16_t Node::admin_port() const {
  return impl_->admin_port.load();
}
engine::Engine& Node::engine() {
  return *impl_->engine;
}
int64_t Node::now_ms() const {
  return impl_->opt.clock();
}
int64_t Node::started_ms() const {
  return impl_->started_ms;
}
const NodeOptions& Node::options() const {
  return impl_->opt;
}

NodeCounters Node::counters() const {
  NodeCounters c;
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
    c.closed_connections_bad_frame += k.bad_frames.load(std::memory_order_relaxed);
    c.rejected_requests += k.rejected_requests.load(std::memory_order_relaxed);
    c.forwarded_requests += k.forwarded_requests.load(std::memory_order_relaxed);
    c.forwarded_parts += k.forwarded_parts.load(std::memory_order_relaxed);
    c.forward_fallbacks += k.forward_fallbacks.load(std::memory_order_relaxed);
    c.forward_failovers += k.forward_failovers.load(std::memory_order_relaxed);
    c.slice_prefetches += k.slice_prefetches.load(std::memory_order_relaxed);
    c.untrusted_forwards += w->handler.untrusted_forwards();
    for (size_t i = 0; i < kLatencyBuckets; ++i) {
      c.latency_us_buckets[i] += k.latency[i].load(std::memory_order_relaxed);
    }
  }
  c.reloads = impl_->reloads.load();
  c.reload_failures = impl_->reload_failures.load();
  if (impl_->rls) c.rls = impl_->rls->counters();
  return c;
}

}  // namespace sluice::node
