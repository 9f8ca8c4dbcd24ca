#include <absl/synchronization/mutex.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "rls/rls.h"
#include "rls/rls_translate.h"
#include "rules/rules.h"

namespace sluice::rls {
namespace {

constexpr const char* kServiceName = "envoy.service.ratelimit.v3.RateLimitService";

struct Counters {
  std::atomic<uint64_t> requests{0}, ok{0}, over_limit{0}, descriptors{0}, invalid_argument{0},
      resource_exhausted{0}, unavailable{0}, internal{0};
};

// ShouldRateLimit as a raw method: the service sees the request's bytes, so a request over
// max_request_bytes is refused unread and malformed protobuf is answered INVALID_ARGUMENT (and
// both are counted) rather than by gRPC's generic deserialization error.
using RawService =
    envoy::service::ratelimit::v3::RateLimitService::WithRawCallbackMethod_ShouldRateLimit<
        envoy::service::ratelimit::v3::RateLimitService::Service>;

class Service final : public RawService {
 public:
  Service(const RlsOptions& options, const Backend& backend, Counters& counters)
      : options_(options), backend_(backend), counters_(counters) {}

  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    counters_.requests.fetch_add(1, std::memory_order_relaxed);
    const size_t size = request->Length();
    if (size > options_.max_request_bytes) {
      counters_.resource_exhausted.fetch_add(1, std::memory_order_relaxed);
      reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                   "request of " + std::to_string(size) + " bytes, at most " +
                                       std::to_string(options_.max_request_bytes)));
      return reactor;
    }
    // The call's state: the request (the plan's entries point into it) and its plan.
    auto call = std::make_shared<Call>();
    grpc::Slice flat;
    if (!request->DumpToSingleSlice(&flat).ok() ||
        !call->req.ParseFromArray(flat.begin(), static_cast<int>(flat.size()))) {
      counters_.invalid_argument.fetch_add(1, std::memory_order_relaxed);
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "malformed RateLimitRequest (not protobuf of "
                                   "envoy.service.ratelimit.v3.RateLimitRequest)"));
      return reactor;
    }
    const std::shared_ptr<const rules::Policy> policy = backend_.policy();
    const PlanError err = plan_request(call->req, policy.get(), options_, call->plan);
    if (err.refusal != Refusal::kNone) {
      const bool big = err.refusal == Refusal::kResourceExhausted;
      (big ? counters_.resource_exhausted : counters_.invalid_argument)
          .fetch_add(1, std::memory_order_relaxed);
      reactor->Finish(grpc::Status(
          big ? grpc::StatusCode::RESOURCE_EXHAUSTED : grpc::StatusCode::INVALID_ARGUMENT,
          err.message));
      return reactor;
    }
    if (call->plan.checks.empty()) {
      finish(reactor, *call, nullptr, response);
      return reactor;
    }
    // Per gRPC thread, reused: the request as the check protocol has it, and an inline answer.
    thread_local std::vector<uint8_t> bytes;
    thread_local std::vector<uint8_t> answer;
    wire::encode_request(next_id_.fetch_add(1, std::memory_order_relaxed), call->plan.checks, 0,
                         bytes);
    if (backend_.check_here && backend_.check_here(bytes, answer)) {
      answered(reactor, *call, answer, response);
      return reactor;
    }
    backend_.check(bytes, [this, reactor, call, response](std::span<const uint8_t> a) {
      answered(reactor, *call, a, response);
    });
    return reactor;
  }

 private:
  struct Call {
    RateLimitRequest req;
    Plan plan;
  };

  // The node's answer (empty: it is stopping) to the call's checks.
  void answered(grpc::ServerUnaryReactor* reactor, const Call& call, std::span<const uint8_t> a,
                grpc::ByteBuffer* response) {
    if (a.empty()) {
      counters_.unavailable.fetch_add(1, std::memory_order_relaxed);
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the node is stopping"));
      return;
    }
    wire::Answer answer;
    if (wire::decode_answer(a, answer) != wire::Code::kOk) {
      counters_.internal.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("rls: the node's answer could not be decoded");
      reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "undecodable answer"));
      return;
    }
    finish(reactor, call, &answer, response);
  }

  void finish(grpc::ServerUnaryReactor* reactor, const Call& call, const wire::Answer* answer,
              grpc::ByteBuffer* response) {
    RateLimitResponse resp;
    const std::string err = fill_response(call.plan, answer, options_.rate_limit_headers, resp);
    if (!err.empty()) {
      counters_.internal.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("rls: {}", err);
      reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, err));
      return;
    }
    std::string out;
    resp.SerializeToString(&out);
    grpc::Slice slice(out);
    *response = grpc::ByteBuffer(&slice, 1);
    counters_.descriptors.fetch_add(call.plan.kind.size(), std::memory_order_relaxed);
    (resp.overall_code() == RateLimitResponse::OVER_LIMIT ? counters_.over_limit : counters_.ok)
        .fetch_add(1, std::memory_order_relaxed);
    reactor->Finish(grpc::Status::OK);
  }

  const RlsOptions& options_;
  const Backend& backend_;
  Counters& counters_;
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace

struct RlsServer::Impl {
  RlsOptions options;
  Backend backend;
  Counters counters;
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  bool shut = false;
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
  // Debian's Abseil is built without NDEBUG, so every absl::Mutex gRPC takes also runs the
  // lock-order (deadlock) graph: ~6 % of sluiced's CPU under RLS load (perf, docs/benchmarks.md,
  // "Envoy RLS over gRPC"). Only gRPC uses Abseil in sluiced; the detector is a debugging aid.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  m.service = std::make_unique<Service>(m.options, m.backend, m.counters);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder b;
  b.AddListeningPort(m.options.listen, grpc::InsecureServerCredentials(), &m.port);
  b.RegisterService(m.service.get());
  // gRPC refuses anything past this before the service sees it; the service's own, smaller
  // max_request_bytes answers (and counts) what lies between.
  b.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                       static_cast<int>(std::min<int64_t>(m.options.client_timeout_ms, INT32_MAX)));
  b.SetMaxReceiveMessageSize(
      static_cast<int>(std::max<size_t>(m.options.max_request_bytes, 4u << 20)));
  m.server = b.BuildAndStart();
  if (!m.server || m.port == 0) {
    m.server.reset();
    throw std::runtime_error("grpc " + m.options.listen + ": cannot listen there");
  }
  set_serving(false);
}

uint16_t RlsServer::port() const {
  return static_cast<uint16_t>(impl_->port);
}

void RlsServer::set_serving(bool serving) {
  if (!impl_->server) return;
  if (auto* h = impl_->server->GetHealthCheckService()) {
    h->SetServingStatus("", serving);
    h->SetServingStatus(kServiceName, serving);
  }
}

void RlsServer::shutdown(int64_t grace_ms) {
  Impl& m = *impl_;
  if (!m.server || m.shut) return;
  m.shut = true;
  set_serving(false);
  m.server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  m.server->Wait();
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
  return r;
}

}  // namespace sluice::rls
