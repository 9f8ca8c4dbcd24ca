// Private to lib/node: what /metrics says of each part, appended by a function of its own to the
// admin front's MetricsText (front/admin/metrics_text.h). The node's /metrics calls them in the
// order below; the admin front appends its own sluice_http_* families between the TCP check
// front's and the admin token's. Names, labels and HELP texts are an interface (dashboards and
// tests scrape them; docs/operations.md lists them).
#pragma once

#include <cstdint>

#include "front/admin/metrics_text.h"

namespace sluice::engine {
struct EngineStats;
}
namespace sluice::rls {
struct RlsCounters;
}

namespace sluice::node {

struct NodeCounters;
struct RespStats;
struct PersistenceStatus;
struct ClusterStatus;
class AdminAuth;

using front::admin::MetricsText;

// The engine: decisions per rule, memory, evictions, leases and leased quotas (slice_prefetches:
// the node's count of slices asked for early, shown with the other leased-quota families).
void append_engine_metrics(MetricsText& m, const engine::EngineStats& es,
                           uint64_t slice_prefetches);
// The check path: requests by transport (http_checks: the admin port's checks), drops,
// rejections, owner-mode forwarding, reloads.
void append_check_metrics(MetricsText& m, const NodeCounters& nc, uint64_t http_checks);
// The gRPC front.
void append_rls_metrics(MetricsText& m, const rls::RlsCounters& r);
// The RESP door (nothing when it is disabled).
void append_resp_metrics(MetricsText& m, const RespStats& r);
// The TCP check front's connections.
void append_tcp_metrics(MetricsText& m, const NodeCounters& nc);
// The admin token's refusals.
void append_auth_metrics(MetricsText& m, const AdminAuth& auth);
// The UDP/TCP check latency histogram.
void append_latency_metrics(MetricsText& m, const NodeCounters& nc);
// The data directory (families only when the node has one) and the overrides in force.
void append_persistence_metrics(MetricsText& m, const PersistenceStatus& p);
// Membership, sync and overrides across the cluster (nothing for a node on its own).
void append_cluster_metrics(MetricsText& m, const ClusterStatus& c);
// sluice_build_info{version="0.3.0"} 1: which release this node runs (base/release.h).
void append_build_metrics(MetricsText& m);

}  // namespace sluice::node
