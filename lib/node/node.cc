// The node's network front: Asio UDP and TCP listeners, workers, signals, timers. The only Asio
// translation unit of the check path (the admin port has its own, admin_http.cc).
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

#include "cluster/peer_codec.h"
#include "node/admin_auth.h"
#include "node/admin_http.h"
#include "node/node_cluster.h"
#include "node/node_state.h"
#include "node/owner_routing.h"
#include "node/rules_watch.h"

#include <future>

namespace sluice::node {

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::ip::udp;

namespace {

constexpr size_t kLatencyBuckets = 24;  // < 1 us ... < 2^23 us (8 s), last: slower
constexpr size_t kUdpBurst = 32;        // datagrams per recvmmsg / sendmmsg
constexpr size_t kUdpSlot = 65'536;     // one datagram's buffer (the largest UDP payload fits)
constexpr int kUdpRounds = 8;           // bursts per wake-up before other work gets a turn

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

size_t latency_bucket(int64_t us) {
  size_t b = 0;
  while (b + 1 < kLatencyBuckets && (int64_t{1} << b) <= us)
    ++b;
  return b;
}

// Counters one worker updates and the control thread reads (relaxed: they are statistics).
struct alignas(64) WorkerCounters {
  std::atomic<uint64_t> udp_requests{0};
  std::atomic<uint64_t> tcp_requests{0};
  std::atomic<uint64_t> tcp_connections{0};
  std::atomic<uint64_t> tcp_open{0};
  std::atomic<uint64_t> tcp_closed_shed{0};   // the oldest waiting one, over max_connections
  std::atomic<uint64_t> tcp_closed_frame{0};  // a frame not finished within client_timeout_ms
  std::atomic<uint64_t> dropped_datagrams{0};
  std::atomic<uint64_t> bad_frames{0};
  std::atomic<uint64_t> rejected_requests{0};
  std::atomic<uint64_t> forwarded_requests{0};  // client requests split to owners
  std::atomic<uint64_t> forwarded_parts{0};     // parts sent to another node
  std::atomic<uint64_t> forward_fallbacks{0};   // parts decided here: owner silent or unreachable
  std::atomic<uint64_t> forward_failovers{0};   // checks a replica decided: owner out of reach
  std::array<std::atomic<uint64_t>, kLatencyBuckets> latency{};
};

}  // namespace

// One worker thread: its io_context, its UDP socket, the TCP sessions handed to it.
struct Worker {
  Worker(Node::Impl& n, engine::Engine& e) : node(n), handler(e) {}
  Node::Impl& node;
  asio::io_context io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::optional<udp::socket> udp_socket;
  // recvmmsg / sendmmsg state, reused for every burst.
  std::vector<uint8_t> udp_in = std::vector<uint8_t>(kUdpBurst * kUdpSlot);
  std::array<std::vector<uint8_t>, kUdpBurst> udp_out;
  std::array<mmsghdr, kUdpBurst> msgs{};
  std::array<mmsghdr, kUdpBurst> replies{};
  std::array<iovec, kUdpBurst> iov_in{};
  std::array<iovec, kUdpBurst> iov_out{};
  std::array<sockaddr_storage, kUdpBurst> peers{};
  std::vector<uint8_t> out;  // TCP answers
  CheckHandler handler;
  WorkerCounters counters;
  struct Forwarder;  // cluster owner mode: null without a cluster (defined below)
  std::unique_ptr<Forwarder> fwd;
  std::thread thread;
  std::list<std::weak_ptr<class TcpSession>> sessions;  // owned by this worker's thread
  std::optional<asio::steady_timer> tcp_deadlines;      // closes sessions past a frame's deadline
  bool stopping = false;                                // this worker's thread only
};

class TcpSession : public std::enable_shared_from_this<TcpSession> {
 public:
  TcpSession(Worker& w, tcp::socket socket, size_t max_pending)
      : w_(w), socket_(std::move(socket)), max_pending_(max_pending) {
    w_.counters.tcp_open.fetch_add(1, std::memory_order_relaxed);
  }
  ~TcpSession() { w_.counters.tcp_open.fetch_sub(1, std::memory_order_relaxed); }

  void start() { read(); }

  // Slow and idle clients (NodeOptions::max_connections, client_timeout_ms). Waiting: nothing of
  // this connection's is being decided or written, since waiting_since() (its last answer, or
  // its start); a connection over the cap closes the longest-waiting one first.
  using Clock = std::chrono::steady_clock;
  bool waiting() const { return reading_ && !writing_ && pending_.empty() && !draining_; }
  Clock::time_point waiting_since() const { return active_; }
  // A frame begun (some of its bytes in) at this time and not finished; max() when none.
  Clock::time_point frame_started() const { return frame_started_; }
  void close_now() {
    draining_ = true;
    close();
  }

  // An answer decided later (forwarded to the key's owner): queued like any other.
  void deliver(std::span<const uint8_t> answer) {
    if (socket_.is_open() && !(draining_ && !writing_ && !reading_)) {
      wire::append_frame(answer, pending_);
      flush();
    }
  }

  // Stop reading; answers already being written still go out, then the socket closes.
  void drain() {
    draining_ = true;
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_receive, ec);
    if (!writing_ && !reading_) close();
  }

 private:
  void read() {
    if (draining_ || paused_) return;
    reading_ = true;
    auto self = shared_from_this();
    socket_.async_read_some(asio::buffer(in_), [this, self](boost::system::error_code ec,
                                                            size_t n) {
      reading_ = false;
      if (ec) {
        draining_ = true;
        if (!writing_) close();
        return;
      }
      frames_.feed({in_.data(), n});
      bool served = false;
      while (!draining_) {
        auto frame = frames_.next();
        if (!frame) break;
        serve(*frame);
        served = true;
      }
      const Clock::time_point now = Clock::now();
      if (served) active_ = now;
      if (frames_.buffered() == 0) {
        frame_started_ = Clock::time_point::max();
      } else if (served || frame_started_ == Clock::time_point::max()) {
        frame_started_ = now;  // the start of a frame still coming in
      }
      if (draining_) {  // a bad frame: answers already queued still go out, then close
        flush();
        if (!writing_) close();
        return;
      }
      if (frames_.failed()) {
        // A length over the limit: the stream cannot be resynchronised. Answer nothing more.
        w_.counters.bad_frames.fetch_add(1, std::memory_order_relaxed);
        spdlog::warn("tcp {}: frame length over {} bytes, closing", peer(), wire::kMaxFrameBytes);
        draining_ = true;
        if (!writing_) close();
        return;
      }
      if (pending_.size() > max_pending_) {
        paused_ = true;  // the writer resumes reading once the backlog is written
      }
      flush();
      read();
    });
  }

  void serve(std::span<const uint8_t> frame) {
    const auto t0 = std::chrono::steady_clock::now();
    w_.counters.tcp_requests.fetch_add(1, std::memory_order_relaxed);
    const CheckHandler::Outcome o = serve_frame(frame, t0);
    if (o == CheckHandler::Outcome::kForward) return;  // answered when the owners have
    if (o == CheckHandler::Outcome::kDrop) {
      // No id to answer to: the client cannot learn this request failed except by a closed
      // connection, which fails its in-flight requests over at once instead of at its timeout.
      w_.counters.bad_frames.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("tcp {}: a frame that is not a request with an id, closing", peer());
      draining_ = true;
      return;
    }
    if (w_.handler.last_code() != wire::Code::kOk) {
      w_.counters.rejected_requests.fetch_add(1, std::memory_order_relaxed);
    }
    wire::append_frame(w_.out, pending_);
    record_latency(t0);
  }

  void flush() {
    if (writing_ || pending_.empty()) return;
    writing_ = true;
    std::swap(writing_buf_, pending_);
    pending_.clear();
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(writing_buf_),
                      [this, self](boost::system::error_code ec, size_t) {
                        writing_ = false;
                        if (ec) {
                          draining_ = true;
                          if (!reading_) close();
                          return;
                        }
                        flush();
                        if (paused_ && pending_.size() <= max_pending_) {
                          paused_ = false;
                          read();
                        }
                        if (draining_ && !writing_ && !reading_) close();
                      });
  }

  void close() {
    boost::system::error_code ec;
    socket_.close(ec);
  }

  int64_t node_now() const;
  CheckHandler::Outcome serve_frame(std::span<const uint8_t> frame,
                                    std::chrono::steady_clock::time_point t0);

 public:
  void record_latency(std::chrono::steady_clock::time_point t0) {
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    w_.counters.latency[latency_bucket(us)].fetch_add(1, std::memory_order_relaxed);
  }

 private:
  std::string peer() const {
    boost::system::error_code ec;
    const auto ep = socket_.remote_endpoint(ec);
    return ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  Worker& w_;
  tcp::socket socket_;
  size_t max_pending_;
  std::array<uint8_t, 64 * 1024> in_{};
  wire::FrameReader frames_;
  std::vector<uint8_t> pending_;      // answers not yet handed to the socket
  std::vector<uint8_t> writing_buf_;  // the answers being written
  bool reading_ = false;
  bool writing_ = false;
  bool paused_ = false;
  bool draining_ = false;
  Clock::time_point active_ = Clock::now();
  Clock::time_point frame_started_ = Clock::time_point::max();
};

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
  return w_.node.opt.clock();
}

// ---- cluster owner mode: forwarding checks to the owner of their key ---------------------------
//
// A client request whose owner-mode checks belong to other nodes is split by owner
// (CheckHandler::handle_routed); each part goes, marked forwarded, to its owner's check port from
// this worker's forwarding socket, the owner decides it as it decides any request, and the
// answers are merged into one answer to the client in the client's order.
//
// Who decides a key is OwnerRouting's answer (owner_routing.h): the first of its owner and
// replicas in reach, a replica taking over (counted in sluice_forward_failovers_total), or, none
// in reach, this node by the rule's `fallback` (sluice_forward_fallbacks_total). A part whose
// owner, in reach, does not answer within forward_timeout_ms is denied here (counted the same
// way): the owner may have admitted it, and admitting it here too could count it twice; an owner
// that lets OwnerRouting::kSilentAfter parts in a row time out is not waited for (its parts are
// denied at once) for a while, or until it answers again. Everything runs on the worker's thread.
struct Worker::Forwarder : CheckRouter {
  // Where the client waits for its answer.
  struct Client {
    bool tcp = false;
    sockaddr_storage addr{};
    socklen_t addr_len = 0;
    std::weak_ptr<TcpSession> session;
    // Another front (HTTP): called on this worker's thread with the answer.
    std::function<void(std::span<const uint8_t>)> callback;
  };
  struct Pending {
    bool busy = false;
    uint32_t generation = 0;
    Client client;
    uint64_t client_id = 0;
    size_t max_answer = 0;
    int64_t deadline_ms = 0;
    std::chrono::steady_clock::time_point t0;
    size_t outstanding = 0;
    std::vector<wire::Decision> decisions;  // per client check
    std::vector<ForwardPlan::Part> parts;
    std::vector<uint8_t> part_done;
  };
  static constexpr size_t kMaxParts = 256;  // part index in the low 8 bits of a forwarded id

  Forwarder(Worker& w_, ClusterNode& c, const std::string& secret)
      : w(w_),
        cluster(c),
        socket(w_.io),
        timer(w_.io),
        auth(std::make_unique<cluster::PeerCodec>(secret, c.self(), 0)),
        routing(c.self(), [this](uint16_t id) { return endpoints.count(id) != 0; }) {
    w.handler.set_forward_auth([this](std::span<const uint8_t> d) { return auth->verify(d); });
    socket.open(udp::v4());
    socket.bind(udp::endpoint(asio::ip::address_v4::any(), 0));
    socket.non_blocking(true);
    receive();
  }

  // CheckRouter (owner_routing.h)
  Route route(uint64_t routing_key, bool forwarded) override {
    refresh();
    const uint64_t failovers = routing.failovers();
    const Route r = routing.route(view, routing_key, forwarded, w.node.opt.clock());
    if (routing.failovers() != failovers) {
      w.counters.forward_failovers.fetch_add(1, std::memory_order_relaxed);
    }
    return r;
  }
  bool routes_forwarded() override {
    refresh();
    return OwnerRouting::routes_forwarded(view, w.node.opt.clock());
  }

  std::optional<udp::endpoint> endpoint_of(uint16_t id) const {
    const auto it = endpoints.find(id);
    if (it == endpoints.end()) return std::nullopt;
    return it->second;
  }

  // Takes the cluster's newest view, and parses the members' check addresses once per view
  // rather than once per check.
  void refresh() {
    const uint64_t v = cluster.view_version();
    if (v == version) return;
    view = cluster.view();
    version = v;
    endpoints.clear();
    for (const cluster::Member& m : *view.members) {
      if (m.check_port == 0) continue;
      boost::system::error_code ec;
      const auto addr = asio::ip::make_address(m.host, ec);
      if (!ec) endpoints[m.id] = udp::endpoint(addr, m.check_port);
    }
  }

  // Handles one client request; kForward when its answer will come later.
  CheckHandler::Outcome handle(std::span<const uint8_t> request, size_t max_answer, int64_t now,
                               std::vector<uint8_t>& reply, const Client& client,
                               std::chrono::steady_clock::time_point t0) {
    const size_t slot = take_slot();
    Pending& p = pending[slot];
    const uint64_t base = (static_cast<uint64_t>(p.generation) << 32) | (slot << 8);
    const CheckHandler::Outcome o =
        w.handler.handle_routed(request, max_answer, now, reply, this, base, plan);
    if (o != CheckHandler::Outcome::kForward || plan.used > kMaxParts) {
      release(slot);
      if (o == CheckHandler::Outcome::kForward) {  // more owners than ids: decide it all here
        return w.handler.handle(request, max_answer, now, reply) ? CheckHandler::Outcome::kAnswer
                                                                 : CheckHandler::Outcome::kDrop;
      }
      return o;
    }
    w.counters.forwarded_requests.fetch_add(1, std::memory_order_relaxed);
    p.busy = true;
    p.client = client;
    p.client_id = plan.client_id;
    p.max_answer = max_answer;
    p.deadline_ms = now + cluster.forward_timeout_ms();
    p.t0 = t0;
    p.decisions.assign(plan.num_checks, wire::Decision{});
    for (const auto& [i, code] : plan.refused)
      p.decisions[i].code = code;
    if (p.parts.size() < plan.used) p.parts.resize(plan.used);
    p.part_done.assign(plan.used, 0);
    p.outstanding = plan.used;
    for (size_t i = 0; i < plan.used; ++i) {
      std::swap(p.parts[i].checks, plan.parts[i].checks);
      std::swap(p.parts[i].request, plan.parts[i].request);
      p.parts[i].owner = plan.parts[i].owner;
      p.parts[i].redirected = plan.parts[i].redirected;
      p.parts[i].fallback = plan.parts[i].fallback;
      p.parts[i].takeover = plan.parts[i].takeover;
      p.parts[i].fallback_since_ms = plan.parts[i].fallback_since_ms;
      auth->sign(p.parts[i].request);  // the owner honours `forwarded` only under our tag
    }
    for (size_t i = 0; i < plan.used && p.busy; ++i) {
      ForwardPlan::Part& part = p.parts[i];
      if (part.owner == 0) {
        if (part.fallback) w.counters.forward_fallbacks.fetch_add(1, std::memory_order_relaxed);
        decide_here(slot, i, now, planned(part));
        continue;
      }
      if (send_part(part.owner, part)) {
        w.counters.forwarded_parts.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      // The owner cannot be sent to: denied here (see above).
      w.counters.forward_fallbacks.fetch_add(1, std::memory_order_relaxed);
      decide_here(slot, i, now, denied_from(now));
    }
    if (pending[slot].busy) arm_timer();
    return CheckHandler::Outcome::kForward;
  }

  // Sends a part (signed, as planned) to node `to`; false when it has no address or the send
  // failed.
  bool send_part(uint16_t to, const ForwardPlan::Part& part) {
    const auto ep = endpoint_of(to);
    if (!ep) return false;
    boost::system::error_code ec;
    socket.send_to(asio::buffer(part.request), *ep, 0, ec);
    return !ec;
  }

  size_t take_slot() {
    if (free_slots.empty()) {
      free_slots.push_back(pending.size());
      pending.emplace_back();
    }
    const size_t slot = free_slots.back();
    free_slots.pop_back();
    pending[slot].generation = ++generation;
    return slot;
  }
  void release(size_t slot) {
    pending[slot].busy = false;
    free_slots.push_back(slot);
  }

  // In place of an owner that cannot be asked since `since_ms`, by each rule's `fallback` (deny,
  // or this node's share of the limit, 1 / the members expected, growing over one window from
  // then: engine::Fallback), never as if it were the owner; from now: nothing is admitted.
  engine::Fallback denied_from(int64_t since_ms) const {
    return {std::max<uint32_t>(1, view.expected_members), since_ms};
  }
  // How a part planned to be decided here (owner 0) is decided: as the owner, as a fallback, or
  // as the replica taking over (CheckRouter::Route).
  engine::Fallback planned(const ForwardPlan::Part& part) const {
    if (part.fallback) return denied_from(part.fallback_since_ms);
    if (part.takeover) return {0, part.fallback_since_ms, true};
    return {};
  }

  // Decides part i of a pending request on this node (the part itself is marked forwarded),
  // with `f` (engine::Fallback).
  void decide_here(size_t slot, size_t i, int64_t now, engine::Fallback f) {
    Pending& p = pending[slot];
    if (!w.handler.handle(p.parts[i].request, wire::kMaxDatagramBytes, now, scratch, f) ||
        wire::decode_answer(scratch, answer) != wire::Code::kOk) {
      answer.decisions.clear();  // leaves those checks as malformed below
    }
    fill(slot, i);
  }

  // Copies a part's answer (in `answer`) into the request's decisions; finishes when complete.
  void fill(size_t slot, size_t i) {
    Pending& p = pending[slot];
    if (!p.busy || p.part_done[i]) return;
    p.part_done[i] = 1;
    const auto& checks = p.parts[i].checks;
    for (size_t k = 0; k < checks.size(); ++k) {
      wire::Decision& d = p.decisions[checks[k]];
      if (k < answer.decisions.size()) {
        d = std::move(answer.decisions[k]);
      } else {
        d = wire::Decision{};
        d.code = wire::Code::kMalformed;
      }
    }
    if (--p.outstanding == 0) finish(slot);
  }

  void finish(size_t slot) {
    Pending& p = pending[slot];
    limit_views.clear();
    views.clear();
    for (const wire::Decision& d : p.decisions) {
      for (const wire::LimitStatus& l : d.limits) {
        limit_views.push_back({l.name, l.limit, l.window_ms, l.remaining, l.reset_ms,
                               l.retry_after_ms, l.mode, l.exceeded});
      }
    }
    size_t at = 0;
    for (const wire::Decision& d : p.decisions) {
      wire::DecisionView v;
      v.code = d.code;
      v.allowed = d.allowed;
      v.would_deny = d.would_deny;
      v.shadow = d.shadow;
      v.allowlisted = d.allowlisted;
      v.limits = std::span<const wire::LimitView>(limit_views.data() + at, d.limits.size());
      at += d.limits.size();
      views.push_back(v);
    }
    const size_t n =
        wire::encode_answer(p.client_id, wire::Code::kOk, views, p.max_answer, scratch);
    if (p.client.callback) {
      const auto done = std::move(p.client.callback);
      p.client.callback = nullptr;
      done(n <= p.max_answer || p.max_answer == 0 ? std::span<const uint8_t>(scratch)
                                                  : std::span<const uint8_t>());
    } else if (p.max_answer == 0 || n <= p.max_answer) {
      if (p.client.tcp) {
        if (auto s = p.client.session.lock()) {
          s->deliver(scratch);
          s->record_latency(p.t0);
        }
      } else if (w.udp_socket) {
        ::sendto(w.udp_socket->native_handle(), scratch.data(), scratch.size(), MSG_DONTWAIT,
                 reinterpret_cast<const sockaddr*>(&p.client.addr), p.client.addr_len);
        const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - p.t0)
                            .count();
        w.counters.latency[latency_bucket(us)].fetch_add(1, std::memory_order_relaxed);
      }
    } else {
      w.counters.dropped_datagrams.fetch_add(1, std::memory_order_relaxed);
    }
    release(slot);
  }

  void receive() {
    socket.async_wait(udp::socket::wait_read, [this](boost::system::error_code ec) {
      if (ec == asio::error::operation_aborted || w.stopping) return;
      for (int n = 0; n < 64; ++n) {
        boost::system::error_code rec;
        udp::endpoint from;
        const size_t got = socket.receive_from(asio::buffer(in), from, 0, rec);
        if (rec) break;  // would block: drained
        on_answer({in.data(), got});
      }
      receive();
    });
  }

  void on_answer(std::span<const uint8_t> bytes) {
    if (wire::decode_answer(bytes, answer) != wire::Code::kOk) return;  // undecodable: timeout
    const uint64_t id = answer.id;
    const auto slot = static_cast<size_t>((id >> 8) & 0xFFFFFF);
    const size_t part = id & 0xFF;
    if (slot >= pending.size()) return;
    Pending& p = pending[slot];
    if (!p.busy || p.generation != static_cast<uint32_t>(id >> 32) || part >= p.part_done.size()) {
      return;  // late: already decided here after a timeout
    }
    routing.note_answer(p.parts[part].owner);  // it answers again
    if (p.parts[part].redirected) {
      w.handler.credit(p.parts[part].request, answer, p.parts[part].owner, w.node.opt.clock());
    }
    fill(slot, part);
  }

  void arm_timer() {
    if (timer_armed) return;
    timer_armed = true;
    timer.expires_after(
        std::chrono::milliseconds(std::max<int64_t>(1, cluster.forward_timeout_ms() / 4)));
    timer.async_wait([this](boost::system::error_code ec) {
      timer_armed = false;
      if (ec || w.stopping) return;
      const int64_t now = w.node.opt.clock();
      bool any = false;
      for (size_t slot = 0; slot < pending.size(); ++slot) {
        if (!pending[slot].busy) continue;
        if (pending[slot].deadline_ms > now) {
          any = true;
          continue;
        }
        for (size_t i = 0; i < pending[slot].parts.size() && pending[slot].busy; ++i) {
          if (i >= pending[slot].part_done.size() || pending[slot].part_done[i]) continue;
          // The owner, in reach, did not answer: it may have admitted the part, so it is denied
          // here (a share from now is nothing), never admitted twice.
          routing.note_timeout(pending[slot].parts[i].owner, now);
          w.counters.forward_fallbacks.fetch_add(1, std::memory_order_relaxed);
          decide_here(slot, i, now, denied_from(now));
        }
      }
      if (any) arm_timer();
    });
  }

  void stop() {
    const int64_t now = w.node.opt.clock();
    for (size_t slot = 0; slot < pending.size(); ++slot) {
      for (size_t i = 0; i < pending[slot].parts.size() && pending[slot].busy; ++i) {
        if (i < pending[slot].part_done.size() && !pending[slot].part_done[i]) {
          const ForwardPlan::Part& part = pending[slot].parts[i];
          decide_here(slot, i, now, part.owner != 0 ? denied_from(now) : planned(part));
        }
      }
    }
    boost::system::error_code ec;
    timer.cancel();
    socket.close(ec);
  }

  Worker& w;
  ClusterNode& cluster;
  udp::socket socket;
  asio::steady_timer timer;
  std::unique_ptr<cluster::PeerCodec> auth;  // tags forwarded parts, checks received ones
  bool timer_armed = false;
  OwnerRouting routing;  // who decides each owner-mode check
  ClusterNode::View view;
  uint64_t version = 0;
  std::unordered_map<uint16_t, udp::endpoint> endpoints;  // members' check ports, of `view`
  ForwardPlan plan;
  std::vector<Pending> pending;
  std::vector<size_t> free_slots;
  uint32_t generation = 0;
  std::array<uint8_t, kUdpSlot> in{};
  std::vector<uint8_t> scratch;
  wire::Answer answer;
  std::vector<wire::LimitView> limit_views;
  std::vector<wire::DecisionView> views;
};

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
    const int64_t now = w.node.opt.clock();
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
      udp_spin(w, now + std::chrono::microseconds(w.node.opt.udp_busy_poll_us));
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
    if (!ec && w.node.opt.udp_busy_poll_us > 0) {
      udp_spin(w, std::chrono::steady_clock::now() +
                      std::chrono::microseconds(w.node.opt.udp_busy_poll_us));
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
    n.workers.push_back(std::make_unique<Worker>(n, *n.engine));
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
    const int64_t now = w.node.opt.clock();
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
