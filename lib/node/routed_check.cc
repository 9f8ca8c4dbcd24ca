// RoutedCheck: a check-front worker's requests, decided here or forwarded to their owners.
#include "node/routed_check.h"

#include "node/forwarder.h"
#include "node/node.h"

namespace sluice::node {

RoutedCheck::RoutedCheck(front::check::WorkerLoop& loop, engine::Engine& engine,
                         const std::function<int64_t()>& clock, ClusterNode* cluster,
                         const std::string& secret)
    : handler_(engine) {
  if (cluster != nullptr) {
    fwd_ = std::make_unique<Forwarder>(loop, handler_, counters_, clock, *cluster, secret);
  }
}

RoutedCheck::~RoutedCheck() = default;

RoutedCheck::Outcome RoutedCheck::decide(std::span<const uint8_t> request, size_t max_answer_bytes,
                                         int64_t now_ms, std::vector<uint8_t>& out,
                                         const front::check::Reply& reply) {
  if (fwd_) {
    switch (fwd_->handle(request, max_answer_bytes, now_ms, out, reply)) {
      case CheckHandler::Outcome::kForward:
        return Outcome::kLater;
      case CheckHandler::Outcome::kDrop:
        return Outcome::kDrop;
      case CheckHandler::Outcome::kAnswer:
        break;
    }
  } else if (!handler_.handle(request, max_answer_bytes, now_ms, out)) {
    return Outcome::kDrop;
  }
  return handler_.last_code() == wire::Code::kOk ? Outcome::kAnswer : Outcome::kRejected;
}

void RoutedCheck::stop() {
  if (fwd_) fwd_->stop();
}

void RoutedCheck::add_counters(NodeCounters& c) const {
  const ForwardCounters& k = counters_;
  c.forwarded_requests += k.forwarded_requests.load(std::memory_order_relaxed);
  c.forwarded_parts += k.forwarded_parts.load(std::memory_order_relaxed);
  c.forward_fallbacks += k.forward_fallbacks.load(std::memory_order_relaxed);
  c.forward_failovers += k.forward_failovers.load(std::memory_order_relaxed);
  c.slice_prefetches += k.slice_prefetches.load(std::memory_order_relaxed);
  c.untrusted_forwards += handler_.untrusted_forwards();
}

}  // namespace sluice::node
