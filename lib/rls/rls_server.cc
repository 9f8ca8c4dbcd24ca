#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>

#include "rls/grpc_h2.h"
#include "rls/rls.h"
#include "rls/rls_translate.h"
#include "rules/rules.h"

namespace sluice::rls {
namespace {

constexpr std::string_view kServiceName = "envoy.service.ratelimit.v3.RateLimitService";

struct Counters {
  std::atomic<uint64_t> requests{0}, ok{0}, over_limit{0}, descriptors{0}, invalid_argument{0},
      resource_exhausted{0}, unavailable{0}, internal{0};
};

// grpc.health.v1.HealthCheckRequest{service: 1}: the service name, or false when the message is
// not one.
bool health_service(std::string_view in, std::string_view& service) {
  service = {};
  // Bounded by the input: each pass consumes at least one byte.
  while (!in.empty()) {
    const auto tag = static_cast<uint8_t>(in.front());
    in.remove_prefix(1);
    if (tag != 0x0a) return false;  // only field 1 (length-delimited) is expected
    uint64_t len = 0;
    for (int shift = 0;; shift += 7) {
      if (in.empty() || shift > 28) return false;
      const auto b = static_cast<uint8_t>(in.front());
      in.remove_prefix(1);
      len |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) break;
    }
    if (len > in.size()) return false;
    service = in.substr(0, len);
    in.remove_prefix(len);
  }
  return true;
}

// The RLS and health methods over the HTTP/2 transport: decoding, planning, deciding through the
// node (Backend) and encoding the answer. Runs on the transport's threads; each thread keeps its
// own request, plan and buffers, so a call decided inline allocates nothing once they are warm.
class Service final : public h2::CallHandler {
 public:
  Service(const RlsOptions& options, const Backend& backend, Counters& counters)
      : options_(options), backend_(backend), counters_(counters) {}

  void set_serving(bool serving) { serving_.store(serving, std::memory_order_relaxed); }

  bool on_call(h2::Method method, std::string_view message, h2::Reply& reply,
               const h2::Later& later) override {
    if (method == h2::Method::kHealthCheck) {
      health(message, reply);
      return true;
    }
    return should_rate_limit(message, reply, later);
  }

  void on_oversized(h2::Method method, size_t bytes, h2::Reply& reply) override {
    if (method == h2::Method::kShouldRateLimit) {
      counters_.requests.fetch_add(1, std::memory_order_relaxed);
      counters_.resource_exhausted.fetch_add(1, std::memory_order_relaxed);
    }
    refuse(reply, h2::Code::kResourceExhausted,
           "request of " + std::to_string(bytes) + " bytes, at most " +
               std::to_string(options_.max_request_bytes));
  }

 private:
  // A call answered later: its request (the plan's entries point into it) and its plan.
  struct Call {
    RateLimitRequest req;
    Plan plan;
  };
  // Per transport thread, reused.
  struct Scratch {
    RateLimitRequest req;
    Plan plan;
    RateLimitResponse resp;
    std::vector<uint8_t> bytes, answer;
  };

  static void refuse(h2::Reply& reply, h2::Code code, std::string message) {
    reply.code = code;
    reply.error = std::move(message);
  }

  void health(std::string_view message, h2::Reply& reply) {
    std::string_view service;
    if (!health_service(message, service)) {
      refuse(reply, h2::Code::kInvalidArgument, "malformed HealthCheckRequest");
      return;
    }
    if (!service.empty() && service != kServiceName) {
      refuse(reply, h2::Code::kNotFound, "unknown service");
      return;
    }
    // HealthCheckResponse{status: 1}: SERVING 1, NOT_SERVING 2.
    reply.code = h2::Code::kOk;
    reply.message.assign({'\x08', serving_.load(std::memory_order_relaxed) ? '\x01' : '\x02'});
  }

  // Validates and plans `message` into req/plan; false with `reply` set when it is refused.
  bool plan(std::string_view message, RateLimitRequest& req, Plan& plan, h2::Reply& reply) {
    if (!req.ParseFromArray(message.data(), static_cast<int>(message.size()))) {
      counters_.invalid_argument.fetch_add(1, std::memory_order_relaxed);
      refuse(reply, h2::Code::kInvalidArgument,
             "malformed RateLimitRequest (not protobuf of "
             "envoy.service.ratelimit.v3.RateLimitRequest)");
      return false;
    }
    const std::shared_ptr<const rules::Policy> policy = backend_.policy();
    const PlanError err = plan_request(req, policy.get(), options_, plan);
    if (err.refusal != Refusal::kNone) {
      const bool big = err.refusal == Refusal::kResourceExhausted;
      (big ? counters_.resource_exhausted : counters_.invalid_argument)
          .fetch_add(1, std::memory_order_relaxed);
      refuse(reply, big ? h2::Code::kResourceExhausted : h2::Code::kInvalidArgument, err.message);
      return false;
    }
    return true;
  }

  bool should_rate_limit(std::string_view message, h2::Reply& reply, const h2::Later& later) {
    counters_.requests.fetch_add(1, std::memory_order_relaxed);
    thread_local Scratch s;
    if (!plan(message, s.req, s.plan, reply)) return true;
    if (s.plan.checks.empty()) {
      finish(s.plan, nullptr, s.resp, reply);
      return true;
    }
    std::span<const wire::DecisionView> decided;
    if (backend_.decide_here && backend_.decide_here(s.plan.checks, decided)) {
      decided_here(s.plan, decided, s.resp, reply);
      return true;
    }
    wire::encode_request(next_id_.fetch_add(1, std::memory_order_relaxed), s.plan.checks, 0,
                         s.bytes);
    if (backend_.check_here && backend_.check_here(s.bytes, s.answer)) {
      answered(s.plan, s.answer, s.resp, reply);
      return true;
    }
    // Decided on a worker (owner routing may forward it): the call keeps its own request and
    // plan until the answer comes back. TODO(perf): planned twice on this path.
    auto call = std::make_shared<Call>();
    h2::Reply unused;
    plan(message, call->req, call->plan, unused);
    backend_.check(s.bytes, [this, call, later](std::span<const uint8_t> a) {
      h2::Reply r;
      RateLimitResponse resp;
      answered(call->plan, a, resp, r);
      later.finish(std::move(r));
    });
    return false;
  }

  // The node's answer (empty: it is stopping) to the plan's checks.
  void answered(const Plan& plan, std::span<const uint8_t> a, RateLimitResponse& resp,
                h2::Reply& reply) {
    if (a.empty()) {
      counters_.unavailable.fetch_add(1, std::memory_order_relaxed);
      refuse(reply, h2::Code::kUnavailable, "the node is stopping");
      return;
    }
    thread_local wire::Answer answer;
    if (wire::decode_answer(a, answer) != wire::Code::kOk) {
      counters_.internal.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("rls: the node's answer could not be decoded");
      refuse(reply, h2::Code::kInternal, "undecodable answer");
      return;
    }
    finish(plan, &answer, resp, reply);
  }

  void decided_here(const Plan& plan, std::span<const wire::DecisionView> decided,
                    RateLimitResponse& resp, h2::Reply& reply) {
    respond(plan, fill_response(plan, decided, options_.rate_limit_headers, resp), resp, reply);
  }

  void finish(const Plan& plan, const wire::Answer* answer, RateLimitResponse& resp,
              h2::Reply& reply) {
    respond(plan, fill_response(plan, answer, options_.rate_limit_headers, resp), resp, reply);
  }

  // The filled response (or why it could not be filled) as the call's reply.
  void respond(const Plan& plan, const Status& err, RateLimitResponse& resp, h2::Reply& reply) {
    if (!err.ok()) {
      counters_.internal.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("rls: {}", err.message());
      refuse(reply, h2::Code::kInternal, err.message());
      return;
    }
    reply.code = h2::Code::kOk;
    resp.SerializeToString(&reply.message);
    counters_.descriptors.fetch_add(plan.kind.size(), std::memory_order_relaxed);
    (resp.overall_code() == RateLimitResponse::OVER_LIMIT ? counters_.over_limit : counters_.ok)
        .fetch_add(1, std::memory_order_relaxed);
  }

  const RlsOptions& options_;
  const Backend& backend_;
  Counters& counters_;
  std::atomic<bool> serving_{false};
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace

struct RlsServer::Impl {
  RlsOptions options;
  Backend backend;
  Counters counters;
  std::unique_ptr<Service> service;
  std::unique_ptr<h2::Server> server;
};

RlsServer::RlsServer(RlsOptions options, Backend backend) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->backend = std::move(backend);
}

RlsServer::~RlsServer() {
  shutdown(0);
}

void RlsServer::start() {
  Impl& m = *impl_;
  // libprotobuf logs an ERROR line for every string field that is not UTF-8 while parsing: a
  // client could fill the log with them. Such a request is answered INVALID_ARGUMENT and counted;
  // protobuf's own lines go to the debug level.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char* file, int line, const std::string& message) {
        spdlog::debug("protobuf {}:{}: {}", file, line, message);
      });
  m.service = std::make_unique<Service>(m.options, m.backend, m.counters);
  h2::ServerOptions so;
  so.listen = m.options.listen;
  so.threads = m.options.threads;
  so.max_message_bytes = m.options.max_request_bytes;
  so.handshake_timeout_ms = m.options.client_timeout_ms;
  so.max_connections = m.options.max_connections;
  m.server = std::make_unique<h2::Server>(so, *m.service);
  m.server->start();
}

uint16_t RlsServer::port() const {
  return impl_->server ? impl_->server->port() : 0;
}

void RlsServer::set_serving(bool serving) {
  if (impl_->service) impl_->service->set_serving(serving);
}

void RlsServer::shutdown(int64_t grace_ms) {
  Impl& m = *impl_;
  if (!m.server) return;
  set_serving(false);
  m.server->shutdown(grace_ms);
}

RlsCounters RlsServer::counters() const {
  const Counters& c = impl_->counters;
  RlsCounters r;
  r.requests = c.requests.load(std::memory_order_relaxed);
  r.ok = c.ok.load(std::memory_order_relaxed);
  r.over_limit = c.over_limit.load(std::memory_order_relaxed);
  r.descriptors = c.descriptors.load(std::memory_order_relaxed);
  r.invalid_argument = c.invalid_argument.load(std::memory_order_relaxed);
  r.resource_exhausted = c.resource_exhausted.load(std::memory_order_relaxed);
  r.unavailable = c.unavailable.load(std::memory_order_relaxed);
  r.internal = c.internal.load(std::memory_order_relaxed);
  if (impl_->server) {
    const h2::ServerCounters& t = impl_->server->counters();
    r.connections = t.connections.load(std::memory_order_relaxed);
    r.connections_open = t.open.load(std::memory_order_relaxed);
    r.connections_shed = t.shed.load(std::memory_order_relaxed);
    r.connections_refused = t.refused_over_cap.load(std::memory_order_relaxed);
    r.connections_closed_handshake = t.closed_handshake.load(std::memory_order_relaxed);
    r.protocol_errors = t.protocol_errors.load(std::memory_order_relaxed);
  }
  return r;
}

}  // namespace sluice::rls
