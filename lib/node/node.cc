// The node's wiring: it builds its parts (the check front, the admin port, the gRPC front, the
// cluster runtime), runs the control thread (accepts, signals, timers) and stops them in order.
// A check-front worker decides its requests through a RoutedCheck (routed_check.h), which
// forwards owner-mode checks to their owners (forwarder.h).
#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include "node/node.h"

#include <spdlog/spdlog.h>

#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <future>
#include <optional>
#include <stdexcept>
#include <thread>

#include "base/host_port.h"
#include "front/check/check_front.h"
#include "front/resp/resp_front.h"
#include "node/admin_auth.h"
#include "node/admin_http.h"
#include "node/check_handler.h"
#include "node/node_cluster.h"
#include "node/node_state.h"
#include "node/resp_backend.h"
#include "node/routed_check.h"
#include "node/rules_watch.h"

namespace sluice::node {

namespace asio = boost::asio;

namespace {

// The check front's share of the node's options; `o` (the node's) outlives the front, and its
// clock is called, not copied, so every part of the node reads the one clock.
front::check::CheckFrontOptions check_front_options(const NodeOptions& o) {
  front::check::CheckFrontOptions f;
  f.udp_listen = o.udp_listen;
  f.tcp_listen = o.tcp_listen;
  f.threads = o.threads;
  f.max_tcp_pending_bytes = o.max_tcp_pending_bytes;
  f.max_connections = o.max_connections;
  f.client_timeout_ms = o.client_timeout_ms;
  f.udp_busy_poll_us = o.udp_busy_poll_us;
  f.clock = [&o] { return o.clock(); };
  return f;
}

}  // namespace

struct Node::Impl : NodeState {
  explicit Impl(NodeOptions o) : NodeState(std::move(o)) {}

  // Node::open: the settings and listen addresses first (cheap, nothing opened), then the rules,
  // the data directory and the engine (NodeState::load).
  Status open() {
    if (Status s = front::check::validate(check_front_options(opt)); !s.ok()) return s;
    for (const auto& [what, listen] :
         {std::pair{"admin HTTP", &opt.admin_listen}, std::pair{"RESP", &opt.resp_listen}}) {
      if (Status s = check_ip_listen(what, *listen); !s.ok()) return s;
    }
    if (opt.cluster.enabled) {
      if (Status s = validate_cluster_options(opt.cluster); !s.ok()) return s;
    }
    // load_node_config read the token; options built in code may name only the file.
    if (!opt.admin_token_file.empty() && opt.admin_token.empty()) {
      StatusOr<std::string> token = read_admin_token_file(opt.admin_token_file);
      if (!token.ok()) return {token.code(), "admin_token_file: " + token.message()};
      opt.admin_token = std::move(*token);
    }
    if (opt.admin_token_reads && opt.admin_token.empty()) {
      return Status::InvalidArgument(
          "admin_token_reads needs admin_token_file (the token to ask for)");
    }
    if (!opt.resp_password_file.empty() && opt.resp_password.empty()) {
      StatusOr<std::string> password = read_admin_token_file(opt.resp_password_file);
      if (!password.ok()) return {password.code(), "resp_password_file: " + password.message()};
      opt.resp_password = std::move(*password);
    }
    if (Status s = check_resp_password(); !s.ok()) return s;
    if (Status s = load(); !s.ok()) return s;
    admin_auth = std::make_unique<AdminAuth>(opt.admin_token, opt.admin_token_reads);
    checks = std::make_unique<front::check::CheckFront>(check_front_options(opt), control);
    return {};
  }

  // A TCP front's "host:port" with an IP literal (the front binds it in run()); "" is off.
  static Status check_ip_listen(const char* what, const std::string& listen) {
    if (listen.empty()) return {};
    StatusOr<HostPort> hp = split_host_port(listen);
    boost::system::error_code ec;
    if (hp.ok()) asio::ip::make_address(hp->host, ec);
    if (hp.ok() && !ec) return {};
    return Status::InvalidArgument(std::string(what) + " listen address \"" + listen +
                                   "\": " + (hp.ok() ? "not an IP address" : hp.message()));
  }

  // The Redis door off loopback needs a password: CL.THROTTLE's DEL resets any key, and nothing
  // else stands between the network and it. (A malformed address is the door's to report.)
  Status check_resp_password() const {
    if (opt.resp_listen.empty() || !opt.resp_password.empty()) return {};
    StatusOr<HostPort> hp = split_host_port(opt.resp_listen);
    if (!hp.ok()) return {};
    boost::system::error_code ec;
    const asio::ip::address addr = asio::ip::make_address(hp->host, ec);
    if (ec || addr.is_loopback()) return {};
    return Status::InvalidArgument(
        "RESP address \"" + opt.resp_listen +
        "\" is not loopback and no resp_password_file is set: any client that reaches it could "
        "throttle and reset every CL.THROTTLE key; set resp_password_file, or listen on "
        "127.0.0.1");
  }

  // SIGHUP: the admin token file is read again; a file that became unreadable or empty keeps the
  // token in force (and says so).
  void reload_admin_token() {
    if (opt.admin_token_file.empty()) return;
    StatusOr<std::string> token = read_admin_token_file(opt.admin_token_file);
    if (!token.ok()) {
      spdlog::error("SIGHUP: admin token not reloaded, the old token stays: {}", token.message());
      return;
    }
    admin_auth->set_token(*token);
    spdlog::info("admin token reloaded from {}", opt.admin_token_file);
  }

  // SIGHUP: the RESP password file is read again, for connections opened from then on; a file
  // that became unreadable or empty keeps the password in force (and says so).
  void reload_resp_password() {
    if (opt.resp_password_file.empty() || !resp) return;
    StatusOr<std::string> password = read_admin_token_file(opt.resp_password_file);
    if (!password.ok()) {
      spdlog::error("SIGHUP: RESP password not reloaded, the old password stays: {}",
                    password.message());
      return;
    }
    resp->set_password(std::move(*password));
    spdlog::info("RESP password reloaded from {}", opt.resp_password_file);
  }

  std::unique_ptr<AdminAuth> admin_auth;    // used by the admin thread; set_token from control
  std::unique_ptr<RulesWatch> rules_watch;  // control thread

  // Every I/O object on `control` or `admin_io` is declared below them, so it is destroyed
  // before them: an object that outlives its io_context reads the freed service in its destructor
  // (the rules watch's timer once did, at every clean stop: tests/unit/node/node_lifetime_test.cc).
  asio::io_context control{1};
  // The admin port has its own thread: operator actions may wait on the disk (overrides are
  // synced, `snapshot` waits for a pass) without holding up accepts, timers or signals.
  asio::io_context admin_io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> admin_work;
  std::thread admin_thread;
  std::unique_ptr<rls::RlsServer> rls;  // the gRPC front; its own threads
  std::optional<asio::signal_set> signals;
  std::optional<asio::steady_timer> sweep_timer;
  std::optional<asio::steady_timer> rules_watch_timer;  // control thread
  std::optional<asio::steady_timer> ready_timer;        // control thread: waits for the join
  std::unique_ptr<front::check::CheckFront> checks;     // UDP and TCP; its workers' threads
  std::vector<RoutedCheck*> paths;       // the check front's workers' paths (it owns them)
  std::atomic<bool> paths_built{false};  // paths may be read (Node::counters)
  // Its connections live on the check front's workers' io_contexts: declared after it, so
  // destroyed before it.
  std::unique_ptr<AdminHttp> admin;
  std::unique_ptr<front::resp::RespFront> resp;  // the same; its acceptor on admin_io
  // SIGHUP reloads, SIGTERM and SIGINT stop; control thread.
  std::function<void(boost::system::error_code, int)> on_signal;
  std::atomic<uint16_t> udp_port{0}, tcp_port{0}, admin_port{0}, grpc_port{0}, resp_port{0};
  std::atomic<bool> stopped{false};
  // Tells check_here's per-thread handlers of this node from those of a node that is gone.
  const uint64_t instance = next_instance.fetch_add(1) + 1;
  static inline std::atomic<uint64_t> next_instance{0};
  std::unique_ptr<ClusterNode> cluster;  // null for a single node; control thread
};

namespace {

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
  return fmt::format("serving: udp {} tcp {} admin {} grpc {} resp {}, {} threads, rules {}{}{}",
                     n.udp_port.load(), n.tcp_port.load(), n.admin_port.load(), n.grpc_port.load(),
                     n.resp_port.load(), n.opt.threads,
                     n.opt.rules_file.empty()
                         ? (n.opt.envoy_rules.empty() ? "<embedded>" : "<none>")
                         : n.opt.rules_file,
                     n.opt.envoy_rules.empty() ? "" : ", envoy rules ", n.opt.envoy_rules);
}

// The service manager's READY (NodeEvent::kReady) says what /readyz says: a node on its own is
// ready once it serves; a cluster member once its first join has an outcome (joined, or no seed
// answered within the join rounds: logged by the cluster either way), so a rolling restart
// under systemd waits for each node to be back in its cluster. Polled on the control thread.
void announce_ready(Node::Impl& n) {
  if (!n.opt.on_event) return;
  if (!n.cluster) return n.opt.on_event(NodeEvent::kReady, serving_status(n));
  if (n.stopped.load()) return;
  if (n.cluster->status().not_ready.empty()) {
    return n.opt.on_event(NodeEvent::kReady, serving_status(n) + ", in its cluster");
  }
  n.ready_timer->expires_after(std::chrono::milliseconds(50));
  n.ready_timer->async_wait([&n](boost::system::error_code ec) {
    if (!ec) announce_ready(n);
  });
}

// Reloads the rules when their files' content changes (rules_watch.h), as SIGHUP does; a failed
// reload is logged once per change (the next look sees the same content) and counted.
void schedule_rules_watch(Node& node, Node::Impl& n) {
  n.rules_watch_timer->expires_after(std::chrono::milliseconds(n.opt.rules_watch_interval_ms));
  n.rules_watch_timer->async_wait([&node, &n](boost::system::error_code ec) {
    if (ec || n.stopped.load()) return;
    if (n.rules_watch->changed()) {
      spdlog::info("rules changed on disk: reloading");
      if (const Status err = node.reload(); !err.ok()) {
        spdlog::error("rules changed on disk but were not reloaded, the old rules stay:\n{}",
                      err.message());
      }
    }
    schedule_rules_watch(node, n);
  });
}

// ---- Node::run, step by step ---------------------------------------------------------------
//
// run() binds every listener (the check front, the admin port, the gRPC front), joins the
// cluster, then starts the threads and the control loop; stop() undoes it in the reverse order.

// The check front's UDP sockets and TCP listener; their ports are known from here on (the
// cluster advertises the UDP one).
void open_check_front(Node::Impl& n) {
  n.checks->bind();
  n.udp_port = n.checks->udp_port();
  n.tcp_port = n.checks->tcp_port();
}

void open_admin_port(Node& node, Node::Impl& n) {
  if (n.opt.admin_listen.empty()) return;
  // Its connections are served on the check front's workers (its checks decided there).
  n.admin = std::make_unique<AdminHttp>(n.admin_io, n.checks->worker_contexts(), n.opt.admin_listen,
                                        node, *n.admin_auth);
  n.admin_port = n.admin->port();
  if (!n.admin_auth->has_token() && !n.admin_auth->loopback_listener()) {
    spdlog::warn(
        "admin port {} is not on loopback and no admin_token_file is set: operator writes "
        "(overrides, plans, drain, snapshot) are refused; reads stay open",
        n.opt.admin_listen);
  }
}

// The Redis protocol door: connections on the check front's workers (a backend each), the
// acceptor on the admin thread (off loopback only with a password: Impl::check_resp_password).
void open_resp_front(Node& node, Node::Impl& n) {
  if (n.opt.resp_listen.empty()) return;
  std::vector<asio::io_context*> ios = n.checks->worker_contexts();
  std::vector<std::shared_ptr<front::resp::Backend>> backends;
  for (asio::io_context* io : ios)
    backends.push_back(make_resp_backend(node, *io, n.opt.resp_domain));
  front::resp::FrontOptions fo;
  fo.listen = n.opt.resp_listen;
  fo.max_connections = n.opt.max_connections;
  fo.client_timeout_ms = n.opt.client_timeout_ms;
  fo.session.password = n.opt.resp_password;
  auto front = std::make_unique<front::resp::RespFront>(n.admin_io, std::move(ios),
                                                        std::move(backends), std::move(fo));
  n.resp = std::move(front);
  n.resp_port = n.resp->port();
}

void open_grpc_front(Node& node, Node::Impl& n) {
  if (n.opt.grpc_listen.empty()) return;
  rls::RlsOptions ro;
  ro.listen = n.opt.grpc_listen;
  ro.rate_limit_headers = n.opt.grpc_rate_limit_headers;
  ro.client_timeout_ms = n.opt.client_timeout_ms;
  ro.threads = n.opt.threads;
  ro.max_connections = n.opt.max_connections;
  rls::Backend backend;
  backend.check = [&node](std::vector<uint8_t> request,
                          std::function<void(std::span<const uint8_t>)> done) {
    node.check_async(std::move(request), std::move(done));
  };
  backend.check_here = [&node](std::span<const uint8_t> request, std::vector<uint8_t>& out) {
    return node.check_here(request, out);
  };
  backend.decide_here = [&node](std::span<const wire::Check> checks,
                                std::span<const wire::DecisionView>& decisions) {
    return node.decide_here(checks, decisions);
  };
  backend.policy = [&n] { return n.engine->policy(); };
  n.rls = std::make_unique<rls::RlsServer>(std::move(ro), std::move(backend));
  n.rls->start();
  n.grpc_port = n.rls->port();
}

void join_cluster(Node::Impl& n) {
  if (!n.opt.cluster.enabled) return;
  n.cluster = std::make_unique<ClusterNode>(n.control, n);
  n.cluster->start(n.udp_port.load(), n.admin_port.load());
}

// SIGHUP reloads the rules and the admin token; SIGTERM and SIGINT stop.
void watch_signals(Node& node, Node::Impl& n) {
  n.signals.emplace(n.control, SIGHUP, SIGTERM, SIGINT);
  n.on_signal = [&node, &n](boost::system::error_code ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP) {
      if (n.opt.on_event) n.opt.on_event(NodeEvent::kReloading, "reloading the rules");
      const Status err = node.reload();
      if (!err.ok()) {
        spdlog::error("SIGHUP: rules not reloaded, the old rules stay:\n{}", err.message());
      }
      n.reload_admin_token();
      n.reload_resp_password();
      if (n.opt.on_event) {
        if (err.ok()) {
          n.opt.on_event(NodeEvent::kReloaded, serving_status(n));
        } else {
          n.opt.on_event(NodeEvent::kReloadFailed,
                         "rules not reloaded (see the log); the old rules stay in force");
        }
      }
      n.signals->async_wait(n.on_signal);
    } else {
      spdlog::info("signal {}: stopping; answering what is in flight", sig);
      node.stop();
    }
  };
  n.signals->async_wait(n.on_signal);
}

// The sweeper, and the rules files' watch when there are files to watch.
void start_timers(Node& node, Node::Impl& n) {
  n.sweep_timer.emplace(n.control);
  schedule_sweep(n);
  if (n.opt.rules_watch_interval_ms > 0 &&
      !(n.opt.rules_file.empty() && n.opt.envoy_rules.empty())) {
    n.rules_watch =
        std::make_unique<RulesWatch>(std::vector<std::string>{n.opt.rules_file, n.opt.envoy_rules});
    n.rules_watch_timer.emplace(n.control);
    schedule_rules_watch(node, n);
  }
}

// Each check-front worker decides through a RoutedCheck of its own; in a cluster with a UDP
// check port, owner mode forwards from it to the owners' check ports.
void start_check_front(Node::Impl& n) {
  ClusterNode* routing = n.cluster && n.udp_port.load() != 0 ? n.cluster.get() : nullptr;
  n.checks->start([&n, routing](front::check::WorkerLoop& loop) {
    auto path =
        std::make_unique<RoutedCheck>(loop, *n.engine, n.opt.clock, routing, n.opt.cluster.secret);
    n.paths.push_back(path.get());
    return path;
  });
  n.paths_built = true;
}

void start_admin_thread(Node::Impl& n) {
  n.admin_work.emplace(n.admin_io.get_executor());
  n.admin_thread = std::thread([&n] { n.admin_io.run(); });
}

// After the control loop returns (stop()): every thread has finished what it had in flight.
void join_threads(Node::Impl& n) {
  n.checks->join();
  if (n.admin_thread.joinable()) n.admin_thread.join();
}

}  // namespace

StatusOr<std::unique_ptr<Node>> Node::open(NodeOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  if (Status s = impl->open(); !s.ok()) return s;
  return std::unique_ptr<Node>(new Node(std::move(impl)));
}

Node::Node(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  state_ = impl_.get();
}

Node::~Node() {
  stop();
  join_threads(*impl_);
}

void Node::run(bool handle_signals) {
  Impl& n = *impl_;
  open_check_front(n);
  open_admin_port(*this, n);
  open_grpc_front(*this, n);
  open_resp_front(*this, n);
  join_cluster(n);
  if (handle_signals) watch_signals(*this, n);
  start_timers(*this, n);
  start_check_front(n);
  start_admin_thread(n);
  n.start_snapshots();
  spdlog::info("sluiced {}", serving_status(n));
  ready_ = true;
  if (n.rls) n.rls->set_serving(true);
  n.ready_timer.emplace(n.control);
  asio::post(n.control, [&n] { announce_ready(n); });
  n.control.run();  // until stop()
  join_threads(n);
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
    asio::post(n.admin_io, [&n] {
      if (n.admin) n.admin->stop();
      if (n.resp) n.resp->stop();
      n.admin_work.reset();  // the admin thread ends once open answers are written
    });
    if (n.signals) n.signals->cancel(ec);
    if (n.sweep_timer) n.sweep_timer->cancel();
    if (n.rules_watch_timer) n.rules_watch_timer->cancel();
    if (n.ready_timer) n.ready_timer->cancel();
    // Each worker decides here what the owners have not answered yet, then ends once its
    // last answers are written.
    n.checks->stop();
  });
}

Status Node::reload() {
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

namespace {

// The calling thread's CheckHandler for check_here and decide_here: made anew when the thread
// first serves another node.
CheckHandler& local_handler(uint64_t instance, engine::Engine& engine) {
  struct Local {
    uint64_t node = 0;
    std::unique_ptr<CheckHandler> handler;
  };
  thread_local Local local;
  if (local.node != instance) {
    local.handler = std::make_unique<CheckHandler>(engine);
    local.node = instance;
  }
  return *local.handler;
}

}  // namespace

bool Node::check_here(std::span<const uint8_t> request, std::vector<uint8_t>& out) {
  Impl& n = *impl_;
  if (n.opt.cluster.enabled || n.stopped.load()) return false;
  return local_handler(n.instance, *n.engine)
      .handle(request, wire::kMaxFrameBytes, n.opt.clock(), out);
}

bool Node::decide_here(std::span<const wire::Check> checks,
                       std::span<const wire::DecisionView>& decisions) {
  Impl& n = *impl_;
  if (n.opt.cluster.enabled || n.stopped.load()) return false;
  CheckHandler& h = local_handler(n.instance, *n.engine);
  decisions = h.decide(checks, n.opt.clock());
  return h.last_code() == wire::Code::kOk;
}

void Node::check_async(std::vector<uint8_t> request,
                       std::function<void(std::span<const uint8_t>)> done) {
  Impl& n = *impl_;
  if (n.stopped.load()) {
    done({});
    return;
  }
  n.checks->check_async(std::move(request), std::move(done));
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
uint16_t Node::resp_port() const {
  return impl_->resp_port.load();
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
  const Impl& n = *impl_;
  NodeCounters c;
  const front::check::CheckFrontCounters f = n.checks->counters();
  c.udp_requests = f.udp_requests;
  c.tcp_requests = f.tcp_requests;
  c.tcp_connections = f.tcp_connections;
  c.tcp_open = f.tcp_open;
  c.tcp_closed_shed = f.tcp_closed_shed;
  c.tcp_closed_frame = f.tcp_closed_frame;
  c.dropped_datagrams = f.dropped_datagrams;
  c.closed_connections_bad_frame = f.bad_frames;
  c.rejected_requests = f.rejected_requests;
  c.latency_us_buckets = f.latency_us_buckets;
  if (n.paths_built.load()) {
    for (const RoutedCheck* p : n.paths)
      p->add_counters(c);
  }
  c.reloads = impl_->reloads.load();
  c.reload_failures = impl_->reload_failures.load();
  if (impl_->rls) c.rls = impl_->rls->counters();
  if (impl_->resp) {
    const front::resp::FrontStats s = impl_->resp->stats();
    const front::resp::RespCounters& rc = impl_->resp->counters();
    c.resp.enabled = true;
    c.resp.accepted = s.accepted;
    c.resp.open = s.open;
    for (size_t i = 0; i < front::resp::kCloseReasons; ++i) {
      c.resp.closed.emplace_back(
          front::resp::close_reason_name(static_cast<front::resp::CloseReason>(i)), s.closed[i]);
    }
    for (size_t i = 1; i < front::resp::kProtocolErrorKinds; ++i) {  // 0: none
      c.resp.protocol_errors.emplace_back(
          front::resp::reason_name(static_cast<front::resp::ProtocolError>(i)),
          rc.protocol_errors[i].load(std::memory_order_relaxed));
    }
    c.resp.commands = rc.commands.load(std::memory_order_relaxed);
    c.resp.unknown_commands = rc.unknown_commands.load(std::memory_order_relaxed);
    c.resp.auth_failures = rc.auth_failures.load(std::memory_order_relaxed);
  }
  return c;
}

}  // namespace sluice::node
