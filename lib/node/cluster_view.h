// Private to lib/node: the cluster on one screen (docs/http.md, "Cluster view", is the users'
// reference). One node's admin port answers for the whole cluster:
//
//   GET /v1/cluster/top[?timeout_ms=1000]     read; `sluicectl top --cluster` prints it
//   GET /v1/ui/cluster/top[?timeout_ms=1000]  the same body, under the dashboard's paths (/ui)
//
// The answer: every member membership knows (this node's view: alive, suspect, dead, left; a
// drained member is "left"), whether it answered and why not, and per rule the decisions summed
// over the members that answered, with each member's share. The counts are each member's
// cumulative counts since it started (its /v1/status "rules"), so a member that restarted counts
// from 0 again; `members_answered` of `members_total` says whom the sums cover.
//
// How a member is asked: GET /v1/status on its admin port, at the host it advertises for its peer
// port (cluster::Member::host) and the admin port it advertises in membership (Member::admin_port,
// gossiped since members first carried it). So a member's admin listener must be reachable at its
// peer address (listen on 0.0.0.0 or on that address; a member whose admin port listens on
// loopback only shows as not answering, "connection refused"). The caller's Authorization header
// is passed on, so with admin_token_reads the members must share the token. Every member is asked
// at once, each within `timeout_ms` (1..10000, default 1000) for connect, request and answer
// together; this node's own counts are read directly. Members membership calls dead or left are
// asked too: an answer is better evidence than a verdict, and the wait is the same timeout.
//
// Threads: the handler runs on the admin io_context's thread (Runs::kAdminThread) and returns at
// once: the requests run there asynchronously and the answer is handed back (front::admin::Later)
// when the last member has answered or timed out. Nothing here runs on a worker, so the check path
// never waits for it. Lifetime: as Dashboard's (construct, stop() and destroy on the admin thread);
// stop() cancels the requests in flight (their callers get what was gathered). The Node outlives
// it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "front/admin/admin_front.h"

namespace boost::asio {
class io_context;
}

namespace sluice::node {

class Node;

// One rule's decisions on one member: cumulative since the member started.
struct RuleCounts {
  std::string rule;  // "<domain>/<rule>"
  uint64_t allowed = 0, denied = 0, shadow_denied = 0, would_deny = 0;
};

// What one member told (or did not tell) the gathering node.
struct MemberAnswer {
  uint16_t id = 0;      // 0 for a node outside a cluster
  std::string name;     // "" for a node outside a cluster
  std::string address;  // its admin port, "host:port" ("" when it advertises none)
  std::string state;    // as membership knows it: alive, suspect, dead, left ("alive" alone)
  bool self = false;
  // Whether it answered; else `error` says why ("timed out after 1000 ms", "connect: Connection
  // refused", "HTTP 401: ...").
  bool answered = false;
  std::string error;
  double latency_ms = 0;
  // From its answer (GET /v1/status).
  std::vector<RuleCounts> rules;
  int64_t uptime_s = 0;
  uint64_t checks = 0;
  std::optional<bool> ready;  // nullopt: a node that predates readiness
  std::string not_ready;      // why not ready ("stopping" while it drains)
};

// Reads a member's GET /v1/status body into `out` (rules, uptime, checks, readiness): "" or why
// it cannot (the body is another node's, so nothing in it is trusted to be well formed).
std::string read_member_status(std::string_view body, MemberAnswer& out);

// The body of GET /v1/cluster/top from the members' answers (in the order given: this node first,
// then by id). Pure: the aggregation, apart from the gathering.
nlohmann::json cluster_top_json(const std::vector<MemberAnswer>& members, bool cluster,
                                int64_t now_ms, int64_t timeout_ms);

class ClusterView {
 public:
  static constexpr int64_t kDefaultTimeoutMs = 1'000;
  static constexpr int64_t kMaxTimeoutMs = 10'000;

  ClusterView(boost::asio::io_context& admin, Node& node);
  ~ClusterView();
  ClusterView(const ClusterView&) = delete;
  ClusterView& operator=(const ClusterView&) = delete;

  // Appends GET /v1/cluster/top and /v1/ui/cluster/top. The ClusterView outlives the routes.
  void add_routes(std::vector<front::admin::Route>& routes);
  // Cancels the requests in flight; a request after it asks no member. Idempotent.
  void stop();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;  // shared with the gatherings in flight
};

}  // namespace sluice::node
