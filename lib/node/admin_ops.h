// Private to lib/node: the operator endpoints of the admin port, as rows of the admin front's route
// table (front/admin/admin_front.h), each a function from a request to a JSON answer. docs/http.md
// lists them.
//
//   GET  /v1/overrides[?domain=D]   every override in force
//   POST /v1/overrides              set one: {"domain","descriptors":{..},"limits":["500/1m"],
//                                   "mode","ttl":"24h","plan"}
//   POST /v1/overrides/get          {"domain","descriptors"} -> the override, or 404
//   POST /v1/overrides/delete       {"domain","descriptors"}
//   POST /v1/plans                  {"domain","descriptors","plan"[,"ttl"]}: a plan assignment
//   POST /v1/inspect                {"domain","descriptors"}: rules, overrides, buckets, estimates
//   GET  /v1/top[?n=20]             keys nearest to or over their limits, and dry-run would-denies
//   POST /v1/snapshot[?full=1]      a snapshot pass now
//   GET  /v1/cluster                members with state, incarnation, ring share, sync lag
//   GET  /v1/ring                   each member's share of the keys
//   POST /v1/ring                   {"domain","descriptors"}: the owners of each limit's counter
//   POST /v1/drain                  leave the cluster (handing counters over), then stop
//
// They run on the admin thread (Runs::kAdminThread) and may block on the disk (an override is
// synced before 200). GET rows, /v1/inspect and POST /v1/ring are reads (Access::kRead); the
// other POSTs are operator writes (Access::kWrite).
#pragma once

#include <nlohmann/json.hpp>

#include "front/admin/admin_front.h"
#include "node/admin_input.h"

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::node {

class Node;
struct ClusterStatus;

struct OpsReply {
  unsigned status = 200;
  nlohmann::json body;
};

// Appends the rows above. `node` outlives the routes.
void add_ops_routes(std::vector<front::admin::Route>& routes, Node& node);

// The bodies of GET /v1/overrides, /v1/top and /v1/cluster (the dashboard shows them too).
OpsReply list_overrides(Node& node, std::string_view query);
OpsReply top_keys(Node& node, std::string_view query);
OpsReply cluster_members(Node& node);
// `o` as the front's answer: its status and JSON body.
void to_reply(const OpsReply& o, front::admin::Reply& r);

// The cluster section of /v1/status and /v1/cluster.
nlohmann::json cluster_json(const ClusterStatus& status);

}  // namespace sluice::node
