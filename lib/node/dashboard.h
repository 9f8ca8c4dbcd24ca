// The live dashboard of the admin port (private to lib/node; docs/http.md, "Dashboard", is the
// user's reference): GET /ui (the page), /ui/<asset> (its script and style, compiled into the
// binary from lib/node/ui/, so nothing is fetched from elsewhere), and its JSON:
//
//   GET /v1/ui/rates      per rule: allowed / denied / shadow-denied / would-deny per second over
//                         the last 15 minutes (one point per 5 s sample), and totals in that span
//   GET /v1/ui/top        keys near or over their limits (the body of GET /v1/top)
//   GET /v1/ui/overrides  overrides in force (the body of GET /v1/overrides)
//   GET /v1/ui/cluster    members with state, ring share and sync lag (the body of /v1/cluster)
//   GET /v1/ui/cluster/top  the whole cluster: each rule's decisions summed over every member
//                         that answered, a row per member, each member's state and whether it
//                         answered (the body of /v1/cluster/top; served by cluster_view.h, which
//                         gathers it from the members' admin ports without blocking this thread)
//
// The history is kept here, not in the browser, so the page shows 15 minutes as soon as it is
// opened: every 5 s (a timer on the admin io_context) the engine's cumulative per-rule counts are
// sampled into a ring of 181 samples (180 intervals). A request to /v1/ui/rates also takes a
// sample when the node's clock has entered a 5 s slot with none yet, so a test that moves the
// node's clock (NodeOptions::clock) sees samples without waiting.
//
// Threads: everything, the timer included, runs on the admin io_context's one thread (its rows run
// there: Runs::kAdminThread).
// Lifetime: construct and destroy on that thread (or while it is not running); stop() before the
// io_context is left to run out (a pending timer keeps it running). The Node outlives it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "front/admin/admin_front.h"

namespace boost::asio {
class io_context;
}

namespace sluice::node {

class Node;

class Dashboard {
 public:
  static constexpr int64_t kSampleIntervalMs = 5'000;
  static constexpr size_t kSamples = 181;  // 15 minutes of 5 s intervals

  Dashboard(boost::asio::io_context& io, Node& node);
  ~Dashboard();
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // Takes the first sample and starts the 5 s timer. stop() cancels it; idempotent.
  void start();
  void stop();

  // Appends its rows (GET only): /ui, /ui/* and /v1/ui/*. The Dashboard outlives the routes.
  void add_routes(std::vector<front::admin::Route>& routes);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;  // shared with the timer's pending handler (as a weak_ptr)
};

}  // namespace sluice::node
