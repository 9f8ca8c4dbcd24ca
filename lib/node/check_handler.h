// Private to lib/node: the routed check path's transport-independent core. CheckHandler decodes
// a request of the check protocol (lib/wire), decides it with the engine and encodes the answer;
// in cluster owner mode it splits a request by owner (a CheckRouter says who decides each check)
// into a ForwardPlan that the worker's forwarder (forwarder.h) sends and merges. No Asio here.
// Used by routed_check.cc (a check-front worker's check path), node.cc (Node::check_here) and
// tests/unit/node/check_handler_test.cc.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "wire/protocol.h"

namespace sluice::node {

// Cluster owner mode: which node decides a check (CheckHandler::handle_routed).
class CheckRouter {
 public:
  virtual ~CheckRouter() = default;
  struct Route {
    uint16_t node = 0;      // 0: decided here, else the node that decides it
    bool redirect = false;  // sent on as redirected: that node decides it whatever its ring says
    // Decided here (node 0) in place of an owner that cannot be asked, by the rule's fallback,
    // with the share that grows from `fallback_since_ms` (engine::StandIn).
    bool fallback = false;
    int64_t fallback_since_ms = 0;
    // Decided here (node 0) by this node as a replica of the key, in place of its owner, out of
    // reach since `fallback_since_ms`: with every count known here, after one window from then
    // (engine::StandIn::takeover).
    bool takeover = false;
    // A takeover for a restart fence of this long (engine::StandIn::takeover_cap_ms); 0: none.
    int64_t takeover_cap_ms = 0;
  };
  // Where a check with this routing key is decided. `forwarded`: it came from another node,
  // which sent it here as the owner (or its replica); it is decided here, as a takeover when this
  // node is a replica whose owner is out of reach, unless this node has just joined and the key
  // stays with its previous owner for now (then it goes on there, redirected).
  virtual Route route(uint64_t routing_key, bool forwarded) = 0;
  // True while route() may route forwarded checks other than "decided here": this node is
  // joining the cluster, or members are out of reach (takeovers).
  virtual bool routes_forwarded() = 0;
  // True while route() may decide a redirected check as a takeover (the owner that redirected it
  // is a new life of its node: owner_routing.h); else a redirected check is decided here as asked.
  virtual bool fences_redirects() { return false; }
};

// A request split by owner (handle_routed returned kForward). Each part is a request of its own,
// marked forwarded (and redirected when any of its checks is), with id `first_id + index`; the
// part with owner 0 is decided here. Reused: parts[0..used) are valid.
struct ForwardPlan {
  struct Part {
    uint16_t owner = 0;
    bool redirected = false;
    bool fallback = false;          // owner 0: Route::fallback of every check in the part
    bool takeover = false;          // owner 0: Route::takeover of every check in the part
    int64_t takeover_cap_ms = 0;    // owner 0: Route::takeover_cap_ms of every check in the part
    int64_t fallback_since_ms = 0;  // the latest of its checks' Route::fallback_since_ms
    std::vector<uint32_t> checks;   // indices into the client's request
    std::vector<uint8_t> request;
    bool asks_slices = false;  // leased quotas: some of its checks ask for a slice
    int64_t sent_ms = 0;       // when it was sent (slices granted live from then)
  };
  uint64_t client_id = 0;
  size_t num_checks = 0;
  std::vector<Part> parts;
  size_t used = 0;
  // Checks the decoder refused (too many entries, a negative cost): in no part, answered here
  // with their code.
  std::vector<std::pair<uint32_t, wire::Code>> refused;
  // Leased quotas (consistency: lease): checks decided here from slices, in no part, with their
  // answers; and slices to ask their owners for on their own (prefetches), whatever the outcome.
  std::vector<std::pair<uint32_t, wire::Decision>> decided;
  struct Prefetch {
    uint32_t check = 0;  // index into the client's request
    uint16_t owner = 0;
    uint32_t want = 0;
  };
  std::vector<Prefetch> prefetch;
};

// Handles one request message end to end, transport-independent: decode, decide, encode. One per
// worker thread (it owns reusable buffers). Exposed for tests and the HTTP check endpoint.
class CheckHandler {
 public:
  explicit CheckHandler(engine::Engine& engine);
  ~CheckHandler();

  enum class Outcome { kAnswer, kDrop, kForward };
  // handle(), except that with a router, a request that holds checks whose owner-mode key
  // another node decides (CheckRouter::route; a forwarded request only while this node joins,
  // never a redirected one) is split by owner into `plan` (kForward): the caller sends each part
  // to its owner and merges the answers. Part ids are first_id + i.
  Outcome handle_routed(std::span<const uint8_t> request, size_t max_answer_bytes, int64_t now_ms,
                        std::vector<uint8_t>& out, CheckRouter* router, uint64_t first_id,
                        ForwardPlan& plan);
  // Writes the answer to `out` and returns true, or returns false when the message cannot be
  // answered: not even an id could be read, or even the smallest answer would be larger than
  // max_answer_bytes. The caller drops it and counts the drop. max_answer_bytes > 0 caps the
  // answer (UDP: the request's size; TCP: the frame limit).
  // `fallback`: decided in place of an owner that cannot be asked (engine::Engine::check).
  bool handle(std::span<const uint8_t> request, size_t max_answer_bytes, int64_t now_ms,
              std::vector<uint8_t>& out, engine::StandIn fallback = {});
  // Decides checks a front built itself (no encoding either way), as handle() does with no
  // router: each check first passes wire::check_code (a refused one gets its code). Empty with
  // last_code() kTooManyChecks past wire::kMaxChecks. The views stay valid until the next call
  // on this handler.
  std::span<const wire::DecisionView> decide(std::span<const wire::Check> checks, int64_t now_ms);
  wire::Code last_code() const { return last_code_; }
  // `part` (a signed part of a plan, as sent) was redirected to `node`, which answered `answer`:
  // what it admitted is credited to it in this node's counters (engine::Engine::credit).
  void credit(std::span<const uint8_t> part, const wire::Answer& answer, uint16_t node,
              int64_t now_ms);
  // Leased quotas: `part` (signed, as sent to `owner` at `sent_ms`) was answered `answer`:
  // installs the slices granted (engine::Engine::install_slice), or notes the owner's denial;
  // slices to give back are appended to `returns`.
  void settle_slices(std::span<const uint8_t> part, const wire::Answer& answer, uint16_t owner,
                     int64_t sent_ms, int64_t now_ms, std::vector<engine::SliceReturn>& returns);
  // The prefetch `pf` of the request handle_routed last saw, as a forwarded request with id `id`
  // (unsigned): its check with no hits, asking for the slice.
  void encode_prefetch(const ForwardPlan::Prefetch& pf, uint64_t id, std::vector<uint8_t>& out);
  // Slices given back to their owner, as a forwarded request of no checks (unsigned).
  void encode_returns(std::span<const engine::SliceReturn> returns, std::vector<uint8_t>& out);
  // Slices this thread's checks finished with (engine::Engine::take_slice_returns).
  static void take_slice_returns(std::vector<engine::SliceReturn>& returns) {
    engine::Engine::take_slice_returns(returns);
  }

  // In a cluster: recognises a request that ends with the cluster's tag over the rest (an
  // owner-mode part forwarded by another node; see forwarder.h). Only such a request's `forwarded`
  // flag is honoured; a client's claim to be forwarded is ignored (the request is routed like any
  // other) and counted.
  void set_forward_auth(std::function<bool(std::span<const uint8_t>)> verify) {
    verify_forward_ = std::move(verify);
  }
  uint64_t untrusted_forwards() const {
    return untrusted_forwards_.load(std::memory_order_relaxed);
  }

 private:
  struct Scratch;
  // The engine requests of `checks` (those whose Scratch::codes is kOk), into the scratch.
  void to_requests(std::span<const wire::Check> checks);
  // Decides the scratch's requests (less those decided from slices) into Scratch::decisions.
  void decide_requests(size_t num_checks, int64_t now_ms);
  bool split(CheckRouter* router, int64_t now_ms, uint64_t first_id, ForwardPlan& plan,
             bool forwarded);
  // Leased quotas: decides engine request `j` (check `i`) from the slices `owner` granted, when
  // they cover it; records what to ask for either way.
  bool decide_from_slices(size_t i, size_t j, uint16_t owner, int64_t now_ms, ForwardPlan& plan);
  engine::Engine& engine_;
  std::unique_ptr<Scratch> s_;
  wire::Code last_code_ = wire::Code::kOk;
  engine::StandIn fallback_;  // of the handle() call under way
  std::function<bool(std::span<const uint8_t>)> verify_forward_;
  std::atomic<uint64_t> untrusted_forwards_{0};  // written by the worker, read by /metrics
};

}  // namespace sluice::node
