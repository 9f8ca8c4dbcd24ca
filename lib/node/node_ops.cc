// A node's state without its network front: rules, overrides, persistence, and the operator
// actions on them (no Asio here; node.cc has the sockets).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "node/node.h"
#include "node/node_state.h"

namespace sluice::node {
namespace {

int64_t system_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

rules::ParseResult parse_configured_rules(const NodeOptions& opt) {
  return opt.rules_file.empty() ? rules::parse_rules(embedded_rules(), "<embedded rules>")
                                : rules::load_rules_file(opt.rules_file);
}

std::string join_errors(const std::vector<rules::ParseError>& errors) {
  std::string out;
  for (const auto& e : errors)
    out += e.to_string() + "\n";
  if (!out.empty()) out.pop_back();
  return out;
}

// "api user=42 ip=10.0.0.1", for logs.
std::string describe(std::string_view domain,
                     std::span<const std::pair<std::string, std::string>> entries) {
  std::string s(domain);
  for (const auto& [k, v] : entries)
    s += " " + k + "=" + v;
  return s;
}

std::vector<std::string> sorted_names(std::span<const std::pair<std::string, std::string>> e) {
  std::vector<std::string> names;
  for (const auto& kv : e)
    names.push_back(kv.first);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

NodeState::NodeState(NodeOptions o) : opt(std::move(o)) {
  if (!opt.clock) opt.clock = system_now_ms;
  if (opt.threads == 0) opt.threads = 1;
  started_ms = opt.clock();
  rules::ParseResult parsed = parse_configured_rules(opt);
  if (!parsed.rules) throw std::runtime_error(join_errors(parsed.errors));
  rules = std::move(*parsed.rules);

  if (!opt.data_dir.empty()) {
    store = store::Store::open(opt.data_dir, opt.init_data);  // StoreError: a runtime_error
    for (rules::Override& ov : store->load_overrides()) {
      const std::string who = describe(ov.domain, ov.entries);
      if (ov.expires_at_ms != 0 && ov.expires_at_ms <= started_ms) {
        store->delete_override(ov.domain, ov.entries);
        spdlog::info("override {} expired while the node was down: deleted", who);
        continue;
      }
      if (std::string why = check_applies_locked(ov); !why.empty()) {
        spdlog::warn("override {} has no effect under the current rules (kept): {}", who, why);
      }
      if (std::string err = overrides.set(std::move(ov)); !err.empty()) {
        spdlog::warn("stored override {} is invalid and ignored: {}", who, err);
      }
    }
  } else {
    spdlog::warn("no data directory: counters and overrides live in memory only");
  }

  engine::EngineOptions eo;
  eo.memory_cap_bytes = opt.memory_cap_bytes;
  if (opt.cluster.enabled) eo.node_id = opt.cluster.node_id;
  engine = std::make_unique<engine::Engine>(
      rules::Policy::compile(rules, overrides, opt.hash_seed), eo);
  if (store) {
    restored = store->restore(*engine, opt.clock());
    spdlog::info(
        "data directory {}: restored {} counters in {} ms ({} expired, {} unreadable, {} without "
        "room), {} overrides",
        opt.data_dir, restored.restored, restored.duration_us / 1000, restored.expired,
        restored.malformed, restored.no_room, overrides.size());
  }
}

NodeState::~NodeState() {
  stop_snapshots();
}

void NodeState::apply_locked() {
  engine->set_policy(rules::Policy::compile(rules, overrides, opt.hash_seed));
}

std::string NodeState::reload() {
  rules::ParseResult parsed = parse_configured_rules(opt);
  if (!parsed.rules) {
    reload_failures.fetch_add(1);
    return join_errors(parsed.errors);
  }
  {
    std::lock_guard g(rules_mu);
    rules = std::move(*parsed.rules);
    apply_locked();
  }
  reloads.fetch_add(1);
  spdlog::info("rules reloaded from {}", opt.rules_file.empty() ? "<embedded>" : opt.rules_file);
  return {};
}

void NodeState::start_snapshots() {
  if (store && !snapshotter) {
    snapshotter = std::make_unique<store::Snapshotter>(*store, *engine, opt.snapshot_interval_ms,
                                                       opt.clock);
  }
}

void NodeState::stop_snapshots() {
  if (!snapshotter || snapshots_stopped) return;
  snapshots_stopped = true;
  const store::SnapshotResult r = snapshotter->stop();
  if (r.ok) {
    spdlog::info("final snapshot to {}: {} counters written, {} deleted, {} bytes", opt.data_dir,
                 r.written, r.erased, r.bytes);
  } else {
    spdlog::error("final snapshot to {} failed: {}", opt.data_dir, r.error);
  }
}

std::string NodeState::check_applies_locked(const rules::Override& o) const {
  const rules::Domain* dom = nullptr;
  std::string domains;
  for (const rules::Domain& d : rules.domains) {
    if (d.name == o.domain) dom = &d;
    domains += (domains.empty() ? "" : ", ") + d.name;
  }
  if (dom == nullptr) return "the rules have no domain `" + o.domain + "` (domains: " + domains + ")";
  const std::vector<std::string> names = sorted_names(o.entries);
  bool keyed = false;
  std::string keys;
  for (const rules::Rule& r : dom->rules) {
    std::vector<std::string> k = r.key;
    std::sort(k.begin(), k.end());
    if (k == names) keyed = true;
    keys += (keys.empty() ? "" : "; ") + r.name + " by";
    for (const std::string& n : r.key)
      keys += " " + n;
  }
  if (!keyed) {
    return "no rule of domain `" + o.domain +
           "` is keyed by exactly these entries, so the override would change nothing (rules: " +
           keys + ")";
  }
  if (!o.plan.empty()) {
    std::string plans;
    for (const rules::Plan& p : dom->plans) {
      if (p.name == o.plan) return {};
      plans += (plans.empty() ? "" : ", ") + p.name;
    }
    return "domain `" + o.domain + "` has no plan `" + o.plan + "` (plans: " +
           (plans.empty() ? "none" : plans) + ")";
  }
  return {};
}

OpResult NodeState::set_override(rules::Override o) {
  using K = OpResult::Kind;
  std::lock_guard g(rules_mu);
  rules::Overrides next = overrides;
  if (std::string err = next.set(o); !err.empty()) return {K::kInvalid, err};
  if (std::string why = check_applies_locked(o); !why.empty()) return {K::kInvalid, why};
  // Durable first: an override is acknowledged only once it is on disk.
  if (store) {
    try {
      store->put_override(*next.get(o.domain, o.entries));
    } catch (const store::StoreError& e) {
      spdlog::error("override {} not set: {}", describe(o.domain, o.entries), e.what());
      return {K::kStorage, e.what()};
    }
  }
  overrides = std::move(next);
  apply_locked();
  spdlog::info("override set: {}", describe(o.domain, o.entries));
  return {};
}

OpResult NodeState::delete_override(const std::string& domain,
                                    std::span<const std::pair<std::string, std::string>> entries) {
  using K = OpResult::Kind;
  std::lock_guard g(rules_mu);
  if (overrides.get(domain, entries) == nullptr) {
    return {K::kNotFound, "no override for " + describe(domain, entries)};
  }
  if (store) {
    try {
      store->delete_override(domain, entries);
    } catch (const store::StoreError& e) {
      return {K::kStorage, e.what()};
    }
  }
  overrides.del(domain, entries);
  apply_locked();
  spdlog::info("override deleted: {}", describe(domain, entries));
  return {};
}

size_t NodeState::prune_overrides() {
  std::lock_guard g(rules_mu);
  const int64_t now = opt.clock();
  size_t n = 0;
  for (const rules::Override& o : overrides.list()) {
    if (o.expires_at_ms == 0 || o.expires_at_ms > now) continue;
    if (store) {
      try {
        store->delete_override(o.domain, o.entries);
      } catch (const store::StoreError& e) {
        spdlog::warn("expired override {} stays on disk for now: {}", describe(o.domain, o.entries),
                     e.what());
        continue;
      }
    }
    overrides.del(o.domain, o.entries);
    spdlog::info("override expired: {}", describe(o.domain, o.entries));
    ++n;
  }
  if (n > 0) apply_locked();
  return n;
}

// ---- Node's operator API -----------------------------------------------------------------------

OpResult Node::set_override(rules::Override o) {
  return state_->set_override(std::move(o));
}

OpResult Node::delete_override(const std::string& domain,
                               std::span<const std::pair<std::string, std::string>> entries) {
  return state_->delete_override(domain, entries);
}

std::optional<rules::Override> Node::get_override(
    const std::string& domain, std::span<const std::pair<std::string, std::string>> entries) const {
  std::lock_guard g(state_->rules_mu);
  const rules::Override* o = state_->overrides.get(domain, entries);
  if (o == nullptr) return std::nullopt;
  return *o;
}

std::vector<rules::Override> Node::list_overrides() const {
  std::lock_guard g(state_->rules_mu);
  return state_->overrides.list();
}

size_t Node::prune_overrides() {
  return state_->prune_overrides();
}

std::optional<store::SnapshotResult> Node::snapshot_now(bool full) {
  if (!state_->snapshotter) return std::nullopt;
  return state_->snapshotter->snapshot_now(full);
}

PersistenceStatus Node::persistence() const {
  PersistenceStatus p;
  const NodeState& s = *state_;
  p.enabled = s.store != nullptr;
  p.dir = s.opt.data_dir;
  p.snapshot_interval_ms = s.opt.snapshot_interval_ms;
  p.restored = s.restored;
  if (s.snapshotter) p.snapshots = s.snapshotter->status();
  if (s.store) p.disk_bytes = s.store->disk_bytes();
  std::lock_guard g(s.rules_mu);
  p.overrides = s.overrides.size();
  return p;
}

}  // namespace sluice::node
