// A synchronous client of sluiced's gRPC front (Envoy's RateLimitService v3) for tests: typed
// calls through the generated stub, raw bytes through a generic stub (hostile input), and the
// grpc.health.v1 Check call, encoded by hand (its two messages are one optional field each).
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

namespace sluice::testing {

namespace rlspb = envoy::service::ratelimit::v3;

class RlsClient {
 public:
  explicit RlsClient(uint16_t port)
      : channel_(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                     grpc::InsecureChannelCredentials())),
        stub_(rlspb::RateLimitService::NewStub(channel_)),
        generic_(channel_) {}

  grpc::Status call(const rlspb::RateLimitRequest& req, rlspb::RateLimitResponse& resp,
                    int timeout_ms = 5'000) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    return stub_->ShouldRateLimit(&ctx, req, &resp);
  }

  // Sends `bytes` as the request of `method`; the answer's bytes go to `out`.
  grpc::Status raw(const std::string& method, const std::string& bytes, std::string* out = nullptr,
                   int timeout_ms = 5'000) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    generic_.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(s);
      done = true;
      cv.notify_one();
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    if (status.ok() && out != nullptr) {
      std::vector<grpc::Slice> slices;
      (void)response.Dump(&slices);
      out->clear();
      for (const grpc::Slice& s : slices)
        out->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    return status;
  }

  // grpc.health.v1.Health/Check for `service`: the ServingStatus number (1 SERVING,
  // 2 NOT_SERVING, 3 SERVICE_UNKNOWN), or -1 when the call failed.
  int health(const std::string& service) {
    std::string req;
    if (!service.empty()) {  // field 1, length-delimited
      req.push_back(0x0a);
      req.push_back(static_cast<char>(service.size()));  // services here are < 128 bytes
      req += service;
    }
    std::string resp;
    if (!raw("/grpc.health.v1.Health/Check", req, &resp).ok()) return -1;
    if (resp.empty()) return 0;  // UNKNOWN, the default
    return resp.size() == 2 && resp[0] == 0x08 ? resp[1] : -1;
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<rlspb::RateLimitService::Stub> stub_;
  grpc::GenericStub generic_;
};

// A request for `domain` with one descriptor per list of (key, value) entries.
inline rlspb::RateLimitRequest rls_request(
    const std::string& domain,
    const std::vector<std::vector<std::pair<std::string, std::string>>>& descriptors,
    uint32_t hits_addend = 0) {
  rlspb::RateLimitRequest r;
  r.set_domain(domain);
  r.set_hits_addend(hits_addend);
  for (const auto& d : descriptors) {
    auto* pd = r.add_descriptors();
    for (const auto& [k, v] : d) {
      auto* e = pd->add_entries();
      e->set_key(k);
      e->set_value(v);
    }
  }
  return r;
}

}  // namespace sluice::testing
