// The node's admin HTTP port (admin_http.h): the route table, /healthz, /metrics and /v1/status.
#include "node/admin_http.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

#include "engine/engine.h"
#include "front/admin/admin_front.h"
#include "front/admin/metrics_text.h"
#include "node/admin_auth.h"
#include "node/admin_checks.h"
#include "node/admin_input.h"
#include "node/admin_ops.h"
#include "node/cluster_view.h"
#include "node/dashboard.h"
#include "node/node.h"
#include "node/node_cluster.h"
#include "node/node_metrics.h"

namespace sluice::node {

namespace {

using Json = nlohmann::json;
using front::admin::Access;
using front::admin::Later;
using front::admin::Reply;
using front::admin::Request;
using front::admin::Route;
using front::admin::Runs;

// Resident memory of this process (Linux /proc), 0 when unknown.
uint64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

Json persistence_json(const PersistenceStatus& p, int64_t now) {
  const auto& last = p.snapshots.last;
  return Json{
      {"enabled", p.enabled},
      {"dir", p.dir},
      {"snapshot_interval_ms", p.snapshot_interval_ms},
      {"snapshots", p.snapshots.passes},
      {"snapshot_failures", p.snapshots.failures},
      {"last_snapshot",
       {{"age_ms", p.snapshots.last_ms == 0 ? Json(nullptr) : Json(now - p.snapshots.last_ms)},
        {"ok", last.ok},
        {"written", last.written},
        {"deleted", last.erased},
        {"bytes", last.bytes},
        {"duration_ms", static_cast<double>(last.duration_us) / 1000.0}}},
      {"disk_bytes", p.disk.total()},
      {"disk", {{"counters_bytes", p.disk.counters}, {"overrides_bytes", p.disk.overrides}}},
      {"overrides", p.overrides},
      {"restored",
       {{"counters", p.restored.restored},
        {"expired", p.restored.expired},
        {"malformed", p.restored.malformed},
        {"no_room", p.restored.no_room},
        {"duration_ms", static_cast<double>(p.restored.duration_us) / 1000.0}}}};
}

std::string render_status(Node& node, uint64_t http_checks) {
  const engine::EngineStats es = node.engine().stats();
  const NodeCounters nc = node.counters();
  const int64_t now = node.now_ms();
  const int64_t started = node.started_ms();
  Json rules = Json::array();
  for (const engine::RuleStats& r : es.rules) {
    rules.push_back(Json{{"name", r.name},
                         {"allowed", r.allowed},
                         {"denied", r.denied},
                         {"shadow_denied", r.shadow_denied},
                         {"would_deny", r.would_deny}});
  }
  Json j = {
      {"node",
       {{"uptime_s", now > started ? (now - started) / 1000 : 0},
        {"started_ms", started},
        {"threads", node.options().threads},
        {"udp_port", node.udp_port()},
        {"tcp_port", node.tcp_port()},
        {"admin_port", node.admin_port()}}},
      {"engine",
       {{"live_counters", es.live_counters},
        {"table_bytes", es.table_bytes},
        {"remote_bytes", es.remote_bytes},
        {"memory_cap_bytes", es.memory_cap_bytes},
        {"evicted_expired", es.evicted_expired},
        {"evicted_live", es.evicted_live},
        {"allowlisted", es.allowlisted},
        {"no_room", es.no_room},
        {"checks", es.checks},
        {"leases_held", es.leases_held},
        {"leases_granted", es.leases_granted},
        {"leases_released", es.leases_released},
        {"lease_bytes", es.lease_bytes},
        {"slice_checks_local", es.slice_checks_local},
        {"slice_checks_to_owner", es.slice_checks_to_owner},
        {"slices_granted", es.slices_granted},
        {"slices_returned", es.slices_returned},
        {"slices_expired", es.slices_expired},
        {"slice_bytes", es.slice_bytes}}},
      {"requests",
       {{"udp", nc.udp_requests},
        {"tcp", nc.tcp_requests},
        {"http", http_checks},
        {"tcp_connections", nc.tcp_connections},
        {"dropped_datagrams", nc.dropped_datagrams},
        {"bad_frames", nc.closed_connections_bad_frame},
        {"rejected", nc.rejected_requests},
        {"forwarded", nc.forwarded_requests},
        {"forwarded_parts", nc.forwarded_parts},
        {"forward_fallbacks", nc.forward_fallbacks},
        {"forward_failovers", nc.forward_failovers},
        {"reloads", nc.reloads},
        {"reload_failures", nc.reload_failures}}},
      {"rules", std::move(rules)},
      {"process", {{"rss_bytes", resident_bytes()}}},
      {"persistence", persistence_json(node.persistence(), now)},
      {"cluster", cluster_json(node.cluster_status())},
  };
  return j.dump() + "\n";
}

// Liveness (/healthz): the admin port answers once the data directory is restored. Readiness
// (/readyz, or /healthz?ready as before): also joined to the cluster, and not stopping.
void healthz(Node& node, const Request& req, Reply& r, bool readiness) {
  constexpr std::string_view kText = "text/plain; charset=utf-8";
  Entries params;
  if (!parse_query(req.query, params)) {
    return r.text(400, kText, "malformed percent-escape in the query string\n");
  }
  readiness = readiness || std::any_of(params.begin(), params.end(),
                                       [](const auto& kv) { return kv.first == "ready"; });
  if (!readiness) return r.text(200, kText, "ok\n");
  if (std::string why = node.not_ready(); !why.empty()) {
    return r.text(503, kText, "not ready: " + why + "\n");
  }
  r.text(200, kText, "ready\n");
}

}  // namespace

struct AdminHttp::Parts {
  Parts(boost::asio::io_context& admin, Node& node_, AdminAuth& auth_)
      : node(node_), auth(auth_), dashboard(admin, node_), cluster_view(admin, node_) {}

  Node& node;
  AdminAuth& auth;
  HttpCheckCounters checks;
  Dashboard dashboard;
  ClusterView cluster_view;
  std::unique_ptr<front::admin::AdminFront> front;

  // Each part appends its own families (node_metrics.h), in the order /metrics has always had.
  std::string metrics() {
    const engine::EngineStats es = node.engine().stats();
    const NodeCounters nc = node.counters();
    front::admin::MetricsText m;
    append_engine_metrics(m, es, nc.slice_prefetches);
    append_check_metrics(m, nc, checks.decided.load());
    append_rls_metrics(m, nc.rls);
    append_resp_metrics(m, nc.resp);
    append_tcp_metrics(m, nc);
    front->append_metrics(m);
    append_auth_metrics(m, auth);
    append_latency_metrics(m, nc);
    append_persistence_metrics(m, node.persistence());
    append_cluster_metrics(m, node.cluster_status());
    append_build_metrics(m);
    return m.take();
  }

  std::vector<Route> routes() {
    std::vector<Route> rows;
    // The checks first: the table is searched in order, and they are most of the traffic.
    add_check_routes(rows, node, checks);
    const auto admin_row = [&](std::string_view path, Access access,
                               std::function<void(const Request&, Reply&)> fn) {
      rows.push_back(
          Route{"GET", path, access, Runs::kAdminThread,
                [fn = std::move(fn)](const Request& req, Reply& r, Later&) { fn(req, r); }});
    };
    admin_row("/healthz", Access::kOpen,
              [this](const Request& req, Reply& r) { healthz(node, req, r, false); });
    admin_row("/readyz", Access::kOpen,
              [this](const Request& req, Reply& r) { healthz(node, req, r, true); });
    admin_row("/metrics", Access::kRead, [this](const Request&, Reply& r) {
      r.status = 200;
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = metrics();
    });
    admin_row("/v1/status", Access::kRead, [this](const Request&, Reply& r) {
      r.status = 200;
      r.content_type = "application/json";
      r.body = render_status(node, checks.decided.load());
    });
    add_ops_routes(rows, node);
    cluster_view.add_routes(rows);
    dashboard.add_routes(rows);
    return rows;
  }
};

AdminHttp::AdminHttp(boost::asio::io_context& admin, std::vector<boost::asio::io_context*> workers,
                     const std::string& listen, Node& node, AdminAuth& auth)
    : parts_(std::make_unique<Parts>(admin, node, auth)) {
  front::admin::Options o;
  o.listen = listen;
  o.max_connections = node.options().max_connections;
  o.client_timeout_ms = node.options().client_timeout_ms;
  front::admin::Backend backend;
  backend.authorize = [&auth](Access access, std::optional<std::string_view> authorization,
                              size_t count) { return auth.check(access, authorization, count); };
  backend.access_of = [](std::string_view method, std::string_view path) {
    return AdminAuth::access_of(method, path);
  };
  parts_->front = std::make_unique<front::admin::AdminFront>(
      admin, std::move(workers), std::move(o), std::move(backend), parts_->routes());
  auth.set_loopback_listener(parts_->front->loopback());
  parts_->dashboard.start();
}

AdminHttp::~AdminHttp() {
  stop();
}

uint16_t AdminHttp::port() const {
  return parts_->front->port();
}

void AdminHttp::stop() {
  parts_->dashboard.stop();
  parts_->cluster_view.stop();
  parts_->front->stop();
}

}  // namespace sluice::node
