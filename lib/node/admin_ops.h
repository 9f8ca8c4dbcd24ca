// Private to lib/node: the operator endpoints of the admin port, as plain functions from a
// request to a JSON answer (admin_http.cc does the HTTP). docs/http.md lists them.
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
// They run on the admin thread and may block on the disk (an override is synced before 200).
#pragma once

#include <nlohmann/json.hpp>

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
  std::string allow;  // for 405: the methods the path takes
};

// nullopt when `path` is not an operator endpoint.
std::optional<OpsReply> handle_ops(Node& node, std::string_view method, std::string_view path,
                                   std::string_view query, std::string_view body);

// The cluster section of /v1/status and /v1/cluster.
nlohmann::json cluster_json(const ClusterStatus& status);

}  // namespace sluice::node
