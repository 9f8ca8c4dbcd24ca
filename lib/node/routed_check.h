// Private to lib/node: the routed check path of one check-front worker (front/check), what the
// front asks to decide each request. A node on its own decides every check here (CheckHandler);
// a cluster node routes owner-mode checks to their owners (CheckRouter, owner_routing.h) through
// its Forwarder (forwarder.h), which sends parts from the worker's loop and answers the client
// through the front once the owners have. Gossip and lease modes, overrides, plans, dry-run,
// shadow and the allowlist are the engine's and CheckHandler's, whichever front a request came in.
// No Asio here: routed_check.cc is the path's Asio translation unit.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "front/check/check_front.h"
#include "node/check_handler.h"

namespace sluice::node {

class ClusterNode;
struct Forwarder;
struct NodeCounters;

// Owner mode's counters, one set per worker: written by its thread, read by Node::counters
// (relaxed: they are statistics).
struct alignas(64) ForwardCounters {
  std::atomic<uint64_t> forwarded_requests{0};  // client requests split to owners
  std::atomic<uint64_t> forwarded_parts{0};     // parts sent to another node
  std::atomic<uint64_t> forward_fallbacks{0};   // parts decided here: owner silent or unreachable
  std::atomic<uint64_t> forward_failovers{0};   // checks a replica decided: owner out of reach
  std::atomic<uint64_t> slice_prefetches{0};    // leased quotas: slices asked for on their own
};

class RoutedCheck final : public front::check::CheckPath {
 public:
  // `cluster` null: every check is decided here (a node on its own, or one without a UDP port to
  // forward from). `clock` and `cluster` must outlive the path; the path runs on `loop`'s thread.
  RoutedCheck(front::check::WorkerLoop& loop, engine::Engine& engine,
              const std::function<int64_t()>& clock, ClusterNode* cluster,
              const std::string& secret);
  ~RoutedCheck() override;

  // front::check::CheckPath
  Outcome decide(std::span<const uint8_t> request, size_t max_answer_bytes, int64_t now_ms,
                 std::vector<uint8_t>& out, const front::check::Reply& reply) override;
  void stop() override;

  // Adds this worker's owner-mode counters and untrusted forwards to `c`. Any thread.
  void add_counters(NodeCounters& c) const;

 private:
  CheckHandler handler_;
  ForwardCounters counters_;
  std::unique_ptr<Forwarder> fwd_;  // null without owner routing
};

}  // namespace sluice::node
