// The operator endpoints of the admin port (admin_ops.h): overrides, plans, inspect, top,
// snapshot. Plain functions from request to JSON; admin_http.cc does the HTTP.
#include "node/admin_ops.h"

#include <algorithm>
#include <charconv>
#include <functional>

#include "engine/engine.h"
#include "node/node.h"
#include "node/node_cluster.h"
#include "rules/rules.h"
#include "window/concurrency.h"
#include "window/sliding_window.h"

namespace sluice::node {
namespace {

using Json = nlohmann::json;

constexpr size_t kDefaultTop = 20;
constexpr size_t kMaxTop = 512;

OpsReply reply(unsigned status, Json body) {
  return OpsReply{status, std::move(body)};
}
OpsReply error(unsigned status, const std::string& message) {
  return reply(status, Json{{"error", message}});
}

std::optional<std::string> query_value(std::string_view query, std::string_view name) {
  Entries params;
  if (!parse_query(query, params)) return std::nullopt;
  for (auto& [k, v] : params) {
    if (k == name) return v;
  }
  return std::nullopt;
}

Json entries_json(const Entries& entries) {
  Json j = Json::object();
  for (const auto& [k, v] : entries)
    j[k] = v;
  return j;
}

Json limit_json(const rules::Limit& l) {
  if (l.algorithm == rules::Algorithm::kGcra) {
    return Json{
        {"name", l.name},
        {"algorithm", "gcra"},
        {"rate", std::to_string(l.rate_requests) + "/" + rules::format_duration(l.rate_period_ms)},
        {"burst", l.requests},
        {"limit", l.requests},
        {"window", rules::format_duration(rules::reported_window_ms(l))}};
  }
  if (l.algorithm == rules::Algorithm::kConcurrency) {
    return Json{{"name", l.name},
                {"algorithm", "concurrency"},
                {"max_in_flight", l.requests},
                {"lease_ttl", rules::format_duration(l.spec.window_ms)},
                {"limit", l.requests},
                {"window", rules::format_duration(l.spec.window_ms)},
                {"bucket", rules::format_duration(l.spec.bucket_ms)}};
  }
  return Json{{"name", l.name},
              {"limit", l.requests},
              {"window", rules::format_duration(l.spec.window_ms)},
              // null: none given, the rule's (an override's limits only)
              {"bucket", l.spec.bucket_ms == 0 ? Json(nullptr)
                                               : Json(rules::format_duration(l.spec.bucket_ms))}};
}

// A ring of `view` laid out by bucket number (position b mod n), as window::RingView reads it.
void ring_of(const engine::CounterView& view, std::vector<uint32_t>& own,
             std::vector<uint32_t>& others) {
  const auto n = static_cast<int64_t>(view.own.size());
  own.assign(view.own.size(), 0);
  others.assign(view.own.size(), 0);
  for (int64_t b = view.head - n + 1, idx = 0; b <= view.head; ++b, ++idx) {
    const auto pos = static_cast<size_t>(((b % n) + n) % n);
    own[pos] = view.own[static_cast<size_t>(idx)];
    others[pos] = view.others[static_cast<size_t>(idx)];
  }
}

// A concurrency limit's state (window/concurrency.h): the hits held in leases now, and per
// bucket the hits granted and released, this node's and the others'.
Json lease_limit_json(Node& node, const rules::AppliedLimit& al, int64_t now,
                      const std::optional<engine::CounterView>& granted, Json lj) {
  const window::WindowSpec& spec = al.limit->spec;
  const auto released = node.engine().inspect(al.counter ^ engine::kLeaseReleaseBit, spec);
  std::vector<uint32_t> g_own, g_others, r_own, r_others;
  int64_t head = window::bucket_of(now, spec.bucket_ms);
  if (granted) {
    ring_of(*granted, g_own, g_others);
    head = std::max(head, granted->head);
  } else {
    g_own.assign(spec.ring_size(), 0);
    g_others.assign(spec.ring_size(), 0);
  }
  if (released) {
    ring_of(*released, r_own, r_others);
  } else {
    r_own.assign(spec.ring_size(), 0);
    r_others.assign(spec.ring_size(), 0);
  }
  const window::RingView gv{g_own, g_others, granted ? granted->head : head};
  const window::RingView rv{r_own, r_others, released ? released->head : head};
  const window::Moment m =
      window::moment_of(spec, window::effective_now(now, head, spec.bucket_ms));
  const window::LimitState ls = window::lease_state(gv, rv, spec, m, 0, al.requests);
  Json buckets = Json::array();
  for (int64_t b = m.bucket - spec.buckets(); granted && b <= m.bucket; ++b) {
    const window::RingView g_own_view{g_own, {}, gv.head};
    const window::RingView r_own_view{r_own, {}, rv.head};
    buckets.push_back(Json{{"start_ms", b * spec.bucket_ms},
                           {"own", g_own_view.count(b)},
                           {"others", gv.count(b) - g_own_view.count(b)},
                           {"released_own", r_own_view.count(b)},
                           {"released_others", rv.count(b) - r_own_view.count(b)}});
  }
  const uint64_t held = window::leases_held(gv, rv, spec, m);
  lj["held"] = held;
  lj["estimate"] = static_cast<double>(held);
  lj["remaining"] = ls.remaining;
  lj["reset_ms"] = ls.reset_ms;
  lj["buckets"] = std::move(buckets);
  lj["nodes"] = Json::array();
  return lj;
}

Json override_json(const rules::Override& o, int64_t now_ms) {
  Json limits = Json::array();
  for (const rules::Limit& l : o.limits)
    limits.push_back(limit_json(l));
  Json j{{"domain", o.domain},
         {"descriptors", entries_json(o.entries)},
         {"limits", std::move(limits)},
         {"plan", o.plan},
         {"mode", o.mode ? Json(std::string(rules::to_string(*o.mode))) : Json(nullptr)},
         {"expires_at_ms", o.expires_at_ms == 0 ? Json(nullptr) : Json(o.expires_at_ms)},
         {"ttl_left_s", o.expires_at_ms == 0
                            ? Json(nullptr)
                            : Json(std::max<int64_t>(0, o.expires_at_ms - now_ms) / 1000)}};
  return j;
}

// override_json plus the record's cluster version: when it was written and by which node
// (docs/architecture.md, "Overrides across the cluster").
Json versioned_override_json(const Node& node, const rules::Override& o, int64_t now_ms) {
  Json j = override_json(o, now_ms);
  const auto v = node.override_version(o.domain, o.entries);
  j["version_ms"] = v ? v->ms : 0;
  j["origin_node"] = v ? v->node : 0;
  return j;
}

OpsReply from_result(const OpResult& r, Json ok_body) {
  switch (r.kind) {
    case OpResult::Kind::kOk:
      return reply(200, std::move(ok_body));
    case OpResult::Kind::kInvalid:
      return error(400, r.message);
    case OpResult::Kind::kNotFound:
      return error(404, r.message);
    case OpResult::Kind::kStorage:
      return error(503, "not stored, so not applied: " + r.message);
  }
  return error(500, "unexpected result");
}

OpsReply set_override(Node& node, const Json& j, bool plan_only) {
  rules::Override o;
  if (Status err = parse_override_body(j, plan_only, node.now_ms(), o); !err.ok()) {
    return error(400, err.message());
  }
  const Entries entries = o.entries;
  const std::string domain = o.domain;
  const OpResult r = node.set_override(std::move(o));
  if (!r.ok()) return from_result(r, {});
  const auto stored = node.get_override(domain, entries);
  return reply(200, Json{{"override", stored ? versioned_override_json(node, *stored, node.now_ms())
                                             : Json()}});
}

// A request named by an operator body ({"domain", "descriptors"}), resolved against the rules
// in force, as inspect and ring show it.
struct Target {
  std::string domain;
  Entries entries;
  std::shared_ptr<const rules::Policy> policy;  // keeps res's rule and limit pointers alive
  rules::Resolution res;
  rules::ResolvedRequest rr;
};

// Fills `t`; an error reply when the body or the request is invalid.
std::optional<OpsReply> resolve_target(Node& node, const Json& j, int64_t now, Target& t) {
  if (Status err = check_fields(j, {"domain", "descriptors"}); !err.ok()) {
    return error(400, err.message());
  }
  if (Status err = parse_target(j, t.domain, t.entries); !err.ok())
    return error(400, err.message());
  std::vector<rules::Descriptor> ds;
  for (const auto& [k, v] : t.entries)
    ds.push_back({k, v});
  t.policy = node.engine().policy();
  t.rr = t.policy->resolve({t.domain, ds, 0}, now, t.res);
  if (t.rr.error != rules::CheckError::kNone) {
    return error(400, "cannot resolve: " + std::string(rules::to_string(t.rr.error)));
  }
  return std::nullopt;
}

OpsReply inspect(Node& node, const Json& j) {
  const int64_t now = node.now_ms();
  Target t;
  if (auto bad = resolve_target(node, j, now, t)) return *bad;
  const std::string& domain = t.domain;
  const Entries& entries = t.entries;
  const rules::Resolution& res = t.res;
  const rules::ResolvedRequest& rr = t.rr;
  Json rules_json = Json::array();
  for (uint32_t r = 0; r < rr.num_rules; ++r) {
    const rules::AppliedRule& ar = res.rules[rr.first_rule + r];
    // The override that applies is the one keyed by this rule's key entries.
    Entries key;
    for (const std::string& name : ar.rule->key) {
      for (const auto& [k, v] : entries) {
        if (k == name) key.emplace_back(k, v);
      }
    }
    const auto ov = ar.overridden ? node.get_override(domain, key) : std::nullopt;
    Json limits = Json::array();
    for (uint32_t i = 0; i < ar.num_limits; ++i) {
      const rules::AppliedLimit& al = res.limits[ar.first_limit + i];
      const rules::Limit& lim = *al.limit;
      const window::WindowSpec& spec = lim.spec;
      Json lj = limit_json(lim);
      char hex[17];
      const auto [end, ec] = std::to_chars(hex, hex + sizeof hex, al.counter, 16);
      lj["counter"] = std::string(hex, end);
      const auto view = node.engine().inspect(al.counter, spec);
      if (lim.algorithm == rules::Algorithm::kGcra) {
        // Its state is one arrival time (window/gcra.h), not buckets.
        const uint64_t tat = view ? view->tat_ns : 0;
        const window::LimitState gs = window::gcra_state(tat, lim.gcra, now, 0);
        lj["tat_ms"] = tat / 1'000'000;
        lj["estimate"] = static_cast<double>(al.requests - std::min(al.requests, gs.remaining));
        lj["remaining"] = gs.remaining;
        lj["reset_ms"] = gs.reset_ms;
        lj["buckets"] = Json::array();
        lj["nodes"] = Json::array();
        limits.push_back(std::move(lj));
        continue;
      }
      if (lim.algorithm == rules::Algorithm::kConcurrency) {
        limits.push_back(lease_limit_json(node, al, now, view, std::move(lj)));
        continue;
      }
      Json buckets = Json::array();
      double estimate = 0;
      window::LimitState ls{al.requests, 0, 0};
      if (view) {
        const auto n = static_cast<int64_t>(view->own.size());
        std::vector<uint32_t> own(view->own.size()), others(view->own.size());
        for (int64_t b = view->head - n + 1, idx = 0; b <= view->head; ++b, ++idx) {
          const auto pos = static_cast<size_t>(((b % n) + n) % n);
          own[pos] = view->own[static_cast<size_t>(idx)];
          others[pos] = view->others[static_cast<size_t>(idx)];
          buckets.push_back(
              Json{{"start_ms", b * spec.bucket_ms}, {"own", own[pos]}, {"others", others[pos]}});
        }
        const window::RingView rv{own, others, view->head};
        const int64_t at = window::effective_now(now, view->head, spec.bucket_ms);
        estimate = window::estimate(rv, spec, ar.rule->estimator, at);
        ls = window::limit_state(rv, spec, ar.rule->estimator, at, 0, al.requests);
      }
      Json nodes = Json::array();
      if (view) {
        for (const auto& [id, counts] : view->nodes)
          nodes.push_back(Json{{"node", id}, {"buckets", counts}});
      }
      lj["nodes"] = std::move(nodes);
      lj["estimate"] = estimate;
      lj["remaining"] = ls.remaining;
      lj["reset_ms"] = ls.reset_ms;
      lj["buckets"] = std::move(buckets);
      limits.push_back(std::move(lj));
    }
    rules_json.push_back(Json{{"rule", ar.rule->name},
                              {"key", entries_json(key)},
                              {"mode", std::string(rules::to_string(ar.mode))},
                              {"estimator", std::string(window::to_string(ar.rule->estimator))},
                              {"count_denied", ar.rule->count_denied},
                              {"override", ov ? override_json(*ov, now) : Json(nullptr)},
                              {"limits", std::move(limits)}});
  }
  return reply(200, Json{{"domain", domain},
                         {"descriptors", entries_json(entries)},
                         {"now_ms", now},
                         {"allowlisted", rr.allowlisted},
                         {"rules", std::move(rules_json)}});
}

OpsReply top(Node& node, std::string_view query) {
  size_t n = kDefaultTop;
  if (auto v = query_value(query, "n")) {
    size_t parsed = 0;
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), parsed);
    if (ec != std::errc() || end != v->data() + v->size() || parsed == 0 || parsed > kMaxTop) {
      return error(400, "n must be an integer from 1 to " + std::to_string(kMaxTop));
    }
    n = parsed;
  }
  const int64_t now = node.now_ms();
  Json keys = Json::array();
  for (const engine::HotKey& k : node.engine().hot_keys(now, n)) {
    const bool over = k.used >= k.limit || k.exceeded > 0;
    const char* state = k.mode == rules::Mode::kDryRun ? (over ? "would-deny" : "near")
                        : over                         ? "over"
                                                       : "near";
    keys.push_back(
        Json{{"rule", k.rule},
             {"key", k.key},
             {"mode", std::string(rules::to_string(k.mode))},
             {"state", state},
             {"limit", k.limit},
             {"window", rules::format_duration(k.window_ms)},
             {"used", k.used},
             {"percent",
              k.limit ? 100.0 * static_cast<double>(k.used) / static_cast<double>(k.limit) : 0.0},
             {"exceeded", k.exceeded},
             {"since_ms", k.first_ms},
             {"last_ms", k.last_ms}});
  }
  return reply(200, Json{{"now_ms", now}, {"keys", std::move(keys)}});
}

OpsReply snapshot(Node& node, std::string_view query) {
  const auto full = query_value(query, "full");
  const auto r = node.snapshot_now(full && (*full == "1" || *full == "true"));
  if (!r) return error(503, "persistence is off: the node has no data directory");
  Json body{{"ok", r->ok},           {"full", r->full},
            {"written", r->written}, {"deleted", r->erased},
            {"bytes", r->bytes},     {"duration_ms", static_cast<double>(r->duration_us) / 1000.0}};
  if (!r->ok) body["error"] = r->error;
  return reply(r->ok ? 200 : 500, std::move(body));
}

OpsReply ring_for(Node& node, const Json& j) {
  Target t;
  if (auto bad = resolve_target(node, j, node.now_ms(), t)) return *bad;
  const rules::Resolution& res = t.res;
  const rules::ResolvedRequest& rr = t.rr;
  Json out = Json::array();
  for (uint32_t r = 0; r < rr.num_rules; ++r) {
    const rules::AppliedRule& ar = res.rules[rr.first_rule + r];
    Json limits = Json::array();
    for (uint32_t i = 0; i < ar.num_limits; ++i) {
      const rules::AppliedLimit& al = res.limits[ar.first_limit + i];
      Json owners = Json::array();
      for (const auto& [id, name] : node.owners_of(al.counter))
        owners.push_back(Json{{"id", id}, {"name", name}});
      limits.push_back(Json{{"name", al.limit->name}, {"owners", std::move(owners)}});
    }
    out.push_back(Json{{"rule", ar.rule->name},
                       {"consistency", std::string(rules::to_string(ar.rule->consistency))},
                       {"limits", std::move(limits)}});
  }
  return reply(200, Json{{"domain", t.domain}, {"rules", std::move(out)}});
}

}  // namespace

Json cluster_json(const ClusterStatus& c) {
  if (!c.enabled) return Json{{"enabled", false}};
  Json members = Json::array();
  for (const MemberStatus& m : c.members) {
    members.push_back(
        Json{{"id", m.member.id},
             {"name", m.member.name},
             {"host", m.member.host},
             {"peer_port", m.member.peer_port},
             {"check_port", m.member.check_port},
             {"admin_port", m.member.admin_port},
             {"state", std::string(cluster::to_string(m.member.state))},
             {"incarnation", m.member.incarnation},
             {"share", m.share},
             {"self", m.member.id == c.self},
             {"last_heard_ms", m.last_heard_ms < 0 ? Json(nullptr) : Json(m.last_heard_ms)},
             {"sync_lag_ms", m.last_sync_ms < 0 ? Json(nullptr) : Json(m.last_sync_ms)},
             {"clock_offset_ms", m.clock_offset_ms ? Json(*m.clock_offset_ms) : Json(nullptr)}});
  }
  Json dropped = Json::object();
  for (const auto& [reason, n] : c.dropped)
    dropped[reason] = n;
  const auto& ms = c.membership;
  return Json{{"enabled", true},
              {"self", c.self},
              {"name", c.name},
              {"join_state", c.join_state},
              {"ready", c.not_ready.empty()},
              {"not_ready", c.not_ready.empty() ? Json(nullptr) : Json(c.not_ready)},
              {"replicas", c.replicas},
              {"members_reachable", c.reachable},
              {"members_expected", c.expected},
              {"members", std::move(members)},
              {"dropped", std::move(dropped)},
              {"datagrams_in", c.datagrams_in},
              {"datagrams_out", c.datagrams_out},
              {"bytes_in", c.bytes_in},
              {"bytes_out", c.bytes_out},
              {"send_errors", c.send_errors},
              {"sync",
               {{"passes", c.sync_passes},
                {"totals_out", c.sync_totals_out},
                {"batches_out", c.sync_batches_out},
                {"list_skipped", c.sync_list_skipped},
                {"totals_in", c.sync_totals_in},
                {"handoffs", c.handoffs},
                {"cpu_us",
                 {{"changed", c.sync_cpu_us[0]},
                  {"resend", c.sync_cpu_us[1]},
                  {"handoff", c.sync_cpu_us[2]}}},
                {"kind_passes",
                 {{"changed", c.sync_kind_passes[0]},
                  {"resend", c.sync_kind_passes[1]},
                  {"handoff", c.sync_kind_passes[2]}}},
                {"cpu_us_max_changed", c.sync_cpu_us_max_changed},
                {"slices_deferred", c.sync_slices_deferred},
                {"cpu_us_buckets_changed", c.sync_cpu_us_buckets}}},
              {"overrides",
               {{"records", c.overrides.records},
                {"digest", c.overrides.hash},
                {"records_sent", c.overrides.records_sent},
                {"records_received", c.overrides.records_received},
                {"applied", c.overrides.applied},
                {"known", c.overrides.known},
                {"expired", c.overrides.expired},
                {"dropped", c.overrides.dropped},
                {"pushes_sent", c.overrides.pushes_sent},
                {"digests_sent", c.overrides.digests_sent},
                {"digests_received", c.overrides.digests_received},
                {"full_sent", c.overrides.full_sent}}},
              {"membership",
               {{"probes_sent", ms.probes_sent},
                {"probes_failed", ms.probes_failed},
                {"suspicions_raised", ms.suspicions_raised},
                {"refutations", ms.refutations},
                {"deaths_declared", ms.deaths_declared},
                {"suspect_pings", ms.suspect_pings},
                {"joins_answered", ms.joins_answered},
                {"pulls_in_sync", ms.pulls_in_sync},
                {"pull_entries_sent", ms.pull_entries_sent},
                {"local_health", ms.local_health},
                {"identity_conflicts", ms.ignored_of(cluster::IgnoredReason::kIdentityConflict)}}}};
}

OpsReply list_overrides(Node& node, std::string_view query) {
  const auto domain = query_value(query, "domain");
  const int64_t now = node.now_ms();
  Json list = Json::array();
  for (const rules::Override& o : node.list_overrides()) {
    if (!domain || o.domain == *domain) list.push_back(versioned_override_json(node, o, now));
  }
  return reply(200, Json{{"overrides", std::move(list)}});
}

OpsReply top_keys(Node& node, std::string_view query) {
  return top(node, query);
}

OpsReply cluster_members(Node& node) {
  return reply(200, cluster_json(node.cluster_status()));
}

void to_reply(const OpsReply& o, front::admin::Reply& r) {
  r.status = o.status;
  r.content_type = "application/json";
  r.body = o.body.dump();
  r.body += '\n';
}

namespace {

// An operator endpoint's body: a JSON object, else a 400.
OpsReply with_body(std::string_view body, const std::function<OpsReply(const Json&)>& fn) {
  Json j;
  if (Status err = parse_json_object(body, j); !err.ok()) return error(400, err.message());
  return fn(j);
}

OpsReply get_or_delete(Node& node, const Json& j, bool get) {
  if (Status err = check_fields(j, {"domain", "descriptors"}); !err.ok()) {
    return error(400, err.message());
  }
  std::string domain;
  Entries entries;
  if (Status err = parse_target(j, domain, entries); !err.ok()) return error(400, err.message());
  if (get) {
    const auto o = node.get_override(domain, entries);
    if (!o) return error(404, "no override for these descriptors");
    return reply(200, Json{{"override", versioned_override_json(node, *o, node.now_ms())}});
  }
  return from_result(node.delete_override(domain, entries), Json{{"deleted", true}});
}

OpsReply ring_shares(Node& node) {
  const ClusterStatus c = node.cluster_status();
  Json shares = Json::array();
  for (const MemberStatus& m : c.members) {
    if (m.share > 0)
      shares.push_back(Json{{"id", m.member.id}, {"name", m.member.name}, {"share", m.share}});
  }
  return reply(
      200, Json{{"enabled", c.enabled}, {"replicas", c.replicas}, {"shares", std::move(shares)}});
}

}  // namespace

void add_ops_routes(std::vector<front::admin::Route>& routes, Node& node) {
  using front::admin::Access;
  using Op = std::function<OpsReply(const front::admin::Request&)>;
  const auto row = [&](std::string_view method, std::string_view path, Access access, Op op) {
    routes.push_back(front::admin::Route{
        method, path, access, front::admin::Runs::kAdminThread,
        [op = std::move(op)](const front::admin::Request& req, front::admin::Reply& r,
                             front::admin::Later&) { to_reply(op(req), r); }});
  };
  const auto body_op = [&node](std::function<OpsReply(Node&, const Json&)> fn) -> Op {
    return [&node, fn = std::move(fn)](const front::admin::Request& req) {
      return with_body(req.body, [&](const Json& j) { return fn(node, j); });
    };
  };
  row("GET", "/v1/overrides", Access::kRead,
      [&node](const auto& req) { return list_overrides(node, req.query); });
  row("POST", "/v1/overrides", Access::kWrite,
      body_op([](Node& n, const Json& j) { return set_override(n, j, false); }));
  row("POST", "/v1/overrides/get", Access::kWrite,
      body_op([](Node& n, const Json& j) { return get_or_delete(n, j, true); }));
  row("POST", "/v1/overrides/delete", Access::kWrite,
      body_op([](Node& n, const Json& j) { return get_or_delete(n, j, false); }));
  row("POST", "/v1/plans", Access::kWrite,
      body_op([](Node& n, const Json& j) { return set_override(n, j, true); }));
  // Reads that take a body to name a key.
  row("POST", "/v1/inspect", Access::kRead, body_op(inspect));
  row("GET", "/v1/top", Access::kRead, [&node](const auto& req) { return top(node, req.query); });
  row("GET", "/v1/cluster", Access::kRead, [&node](const auto&) { return cluster_members(node); });
  row("GET", "/v1/ring", Access::kRead, [&node](const auto&) { return ring_shares(node); });
  row("POST", "/v1/ring", Access::kRead, body_op(ring_for));
  row("POST", "/v1/drain", Access::kWrite, [&node](const auto&) {
    if (!node.drain()) return error(409, "this node is not in a cluster");
    return reply(200, Json{{"draining", true}});
  });
  row("POST", "/v1/snapshot", Access::kWrite,
      [&node](const auto& req) { return snapshot(node, req.query); });
}

}  // namespace sluice::node
