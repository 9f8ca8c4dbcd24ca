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

// The rules file (or the embedded example rules when neither file is set) and the envoy rules,
// merged; a domain declared in both is an error naming both files.
rules::ParseResult parse_rules_files(const NodeOptions& opt) {
  if (opt.envoy_rules.empty()) {
    return opt.rules_file.empty() ? rules::parse_rules(embedded_rules(), "<embedded rules>")
                                  : rules::load_rules_file(opt.rules_file);
  }
  rules::ParseResult envoy =
      rules::load_envoy_rules(opt.envoy_rules, {.count_denied = opt.envoy_count_denied});
  if (opt.rules_file.empty() || !envoy.rules) return envoy;
  rules::ParseResult native = rules::load_rules_file(opt.rules_file);
  if (!native.rules) return native;
  native.errors = rules::merge_rule_sets(*native.rules, std::move(*envoy.rules), opt.rules_file,
                                         opt.envoy_rules);
  if (!native.errors.empty()) native.rules.reset();
  return native;
}

rules::ParseResult parse_configured_rules(const NodeOptions& opt) {
  rules::ParseResult r = parse_rules_files(opt);
  // The RESP door's cell checks need their domain; one the rules do not name is added without
  // rules (a cell check decides by its own limit).
  if (r.rules && !opt.resp_listen.empty() && !opt.resp_domain.empty()) {
    bool named = false;
    for (const rules::Domain& d : r.rules->domains)
      named = named || d.name == opt.resp_domain;
    if (!named) r.rules->domains.emplace_back().name = opt.resp_domain;
  }
  return r;
}

std::string rules_source(const NodeOptions& opt) {
  std::string s = opt.rules_file.empty() && opt.envoy_rules.empty() ? "<embedded>" : opt.rules_file;
  if (!opt.envoy_rules.empty()) s += (s.empty() ? "" : " and ") + opt.envoy_rules + " (envoy)";
  return s;
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

uint64_t store_write_buffer_bytes(uint64_t memory_cap_bytes) {
  // Never more than half the cap (Store::open raises a share below kMinWriteBufferBytes, which
  // only a cap under 512 KiB, set in code rather than in the config, gets).
  return std::min(std::clamp<uint64_t>(memory_cap_bytes / 8, store::kMinWriteBufferBytes,
                                       store::kDefaultWriteBufferBytes),
                  memory_cap_bytes / 2);
}

uint64_t store_working_bytes(uint64_t memory_cap_bytes) {
  return std::min(memory_cap_bytes / 8, store::kWorkingBytes);
}

NodeState::NodeState(NodeOptions o) : opt(std::move(o)) {
  if (!opt.clock) opt.clock = system_now_ms;
  if (opt.threads == 0) opt.threads = 1;
  started_ms = opt.clock();
}

Status NodeState::load() {
  rules::ParseResult parsed = parse_configured_rules(opt);
  if (!parsed.rules) return Status::InvalidArgument(join_errors(parsed.errors));
  rules = std::move(*parsed.rules);

  // memory_cap_mb covers the counters and, with a data directory, their snapshots: an eighth of
  // the cap (at most 64 MiB) goes to RocksDB's write buffers, a hard bound (store.h), another
  // eighth (at most 2 MiB) is set aside for the rest of what a snapshot pass and RocksDB use while
  // they write (store.h, "Memory"), and the tables get the rest.
  uint64_t table_cap = opt.memory_cap_bytes;
  if (!opt.data_dir.empty()) {
    const uint64_t write_buffers = store_write_buffer_bytes(opt.memory_cap_bytes);
    table_cap -= std::min(table_cap, write_buffers + store_working_bytes(opt.memory_cap_bytes));
    // A failure of the store stops the start, as a bad rule does.
    StatusOr<std::unique_ptr<store::Store>> opened =
        store::Store::open(opt.data_dir, opt.init_data, write_buffers);
    if (!opened.ok()) return opened.status();
    store = std::move(*opened);
    StatusOr<std::vector<cluster::OverrideRecord>> records = store->load_override_records();
    if (!records.ok()) return records.status();
    std::vector<std::string> forgotten;
    for (cluster::OverrideRecord& rec : *records) {
      const rules::Override& ov = rec.value;
      const std::string who = describe(ov.domain, ov.entries);
      if (override_records.horizon_ms(rec) <= started_ms) {
        forgotten.push_back(cluster::record_id(rec));
        spdlog::info("override {} {} while the node was down: forgotten", who,
                     rec.deleted ? "tombstone expired" : "expired");
        continue;
      }
      override_records.merge(rec, started_ms);
      if (rec.deleted) continue;
      if (ov.expires_at_ms != 0 && ov.expires_at_ms <= started_ms) {
        spdlog::info("override {} expired while the node was down (its record stays until {})", who,
                     override_records.horizon_ms(rec));
        continue;
      }
      if (std::string why = check_applies_locked(ov); !why.empty()) {
        spdlog::warn("override {} has no effect under the current rules (kept): {}", who, why);
      }
      if (Status s = overrides.set(ov); !s.ok()) {
        spdlog::warn("stored override {} is invalid and ignored: {}", who, s.message());
      }
    }
    if (Status s = store->erase_override_records(forgotten); !s.ok()) return s;
  } else {
    spdlog::warn("no data directory: counters and overrides live in memory only");
  }

  engine::EngineOptions eo;
  eo.memory_cap_bytes = table_cap;
  if (opt.cluster.enabled) eo.node_id = opt.cluster.node_id;
  eo.single_node = !opt.cluster.enabled;  // slots without others' counts: 64 bytes, not 104
  // Compiled at now: for one window, window limits on the default bucket carry from counters on
  // the older default (window::legacy_default_bucket_ms) that the restore below brings back.
  engine = std::make_unique<engine::Engine>(
      rules::Policy::compile(rules, overrides, opt.hash_seed, {}, nullptr, opt.clock()), eo);
  if (store) {
    StatusOr<store::RestoreResult> r = store->restore(*engine, opt.clock());
    if (!r.ok()) return r.status();
    restored = *r;
    spdlog::info(
        "data directory {}: restored {} counters in {} ms ({} expired, {} unreadable, {} without "
        "room), {} overrides",
        opt.data_dir, restored.restored, restored.duration_us / 1000, restored.expired,
        restored.malformed, restored.no_room, overrides.size());
  }
  return {};
}

NodeState::~NodeState() {
  stop_snapshots();
}

void NodeState::apply_locked() {
  // Compiled from the policy in force, so a key whose limits change keeps the counts already in
  // its window (rules.h, "Overrides keep the counts").
  engine->set_policy(rules::Policy::compile(rules, overrides, opt.hash_seed, {},
                                            engine->policy().get(), opt.clock()));
}

Status NodeState::reload() {
  rules::ParseResult parsed = parse_configured_rules(opt);
  if (!parsed.rules) {
    reload_failures.fetch_add(1);
    return Status::InvalidArgument(join_errors(parsed.errors));
  }
  {
    std::lock_guard g(rules_mu);
    rules = std::move(*parsed.rules);
    apply_locked();
  }
  reloads.fetch_add(1);
  spdlog::info("rules reloaded from {}", rules_source(opt));
  return {};
}

void NodeState::start_snapshots() {
  if (store && !snapshotter) {
    snapshotter =
        std::make_unique<store::Snapshotter>(*store, *engine, opt.snapshot_interval_ms, opt.clock);
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
  if (dom == nullptr)
    return "the rules have no domain `" + o.domain + "` (domains: " + domains + ")";
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
    return "domain `" + o.domain + "` has no plan `" + o.plan +
           "` (plans: " + (plans.empty() ? "none" : plans) + ")";
  }
  return {};
}

// A local write: stamped with a version above the one it replaces, checked as the peers will
// check it, durable, applied, then handed to the cluster.
OpResult NodeState::write_record_locked(cluster::OverrideRecord rec) {
  using K = OpResult::Kind;
  const int64_t now = opt.clock();
  const rules::Override& o = rec.value;
  rec.version = override_records.next_version(cluster::record_id(rec), override_writer(), now);
  if (std::string why = cluster::check_record(rec, now); !why.empty()) {
    return {K::kInvalid, why.substr(why.find(':') + 2)};
  }
  // Durable first: an override is acknowledged only once it is on disk.
  if (store) {
    if (Status s = store->put_override_records({&rec, 1}); !s.ok()) {
      spdlog::error("override {} not {}: {}", describe(o.domain, o.entries),
                    rec.deleted ? "deleted" : "set", s.message());
      return {K::kStorage, s.message()};
    }
  }
  if (rec.deleted) {
    overrides.del(o.domain, o.entries);
  } else if (Status s = overrides.set(o); !s.ok()) {  // check_record passed: a bug
    spdlog::error("override {} passed its check but not the table's: {}",
                  describe(o.domain, o.entries), s.message());
  }
  apply_locked();
  spdlog::info("override {}: {} (version {}/{})", rec.deleted ? "deleted" : "set",
               describe(o.domain, o.entries), rec.version.ms, rec.version.node);
  override_records.merge(rec, now);
  if (on_local_override) on_local_override(rec);
  return {};
}

OpResult NodeState::set_override(rules::Override o) {
  using K = OpResult::Kind;
  std::lock_guard g(rules_mu);
  rules::Overrides next = overrides;
  if (Status s = next.set(o); !s.ok()) return {K::kInvalid, s.message()};
  if (std::string why = check_applies_locked(o); !why.empty()) return {K::kInvalid, why};
  cluster::OverrideRecord rec;
  rec.value = *next.get(o.domain, o.entries);  // entries sorted
  return write_record_locked(std::move(rec));
}

OpResult NodeState::delete_override(const std::string& domain,
                                    std::span<const std::pair<std::string, std::string>> entries) {
  using K = OpResult::Kind;
  std::lock_guard g(rules_mu);
  if (overrides.get(domain, entries) == nullptr) {
    return {K::kNotFound, "no override for " + describe(domain, entries)};
  }
  cluster::OverrideRecord rec;
  rec.value.domain = domain;
  rec.value.entries.assign(entries.begin(), entries.end());
  rec.deleted = true;
  return write_record_locked(std::move(rec));
}

size_t NodeState::prune_overrides() {
  std::lock_guard g(rules_mu);
  const int64_t now = opt.clock();
  size_t n = 0;
  for (const rules::Override& o : overrides.list()) {
    if (o.expires_at_ms == 0 || o.expires_at_ms > now) continue;
    // Its record stays (on disk too) until its horizon, so that a node that missed the expiry
    // cannot bring it back; every node prunes it at the same time.
    overrides.del(o.domain, o.entries);
    spdlog::info("override expired: {}", describe(o.domain, o.entries));
    ++n;
  }
  if (n > 0) apply_locked();
  cluster::OverrideTable next = override_records;
  const std::vector<std::string> gone = next.forget_expired(now);
  if (!gone.empty()) {
    const Status erased = store ? store->erase_override_records(gone) : Status();
    if (erased.ok()) {
      override_records = std::move(next);
      spdlog::info(
          "{} override records past their horizon forgotten (tombstones and expired "
          "overrides older than {} ms)",
          gone.size(), override_records.tombstone_ttl_ms());
    } else {
      spdlog::warn("{} expired override records stay on disk for now: {}", gone.size(),
                   erased.message());
    }
  }
  return n;
}

NodeState::OverrideMerge NodeState::merge_overrides(
    std::span<const cluster::OverrideRecord> records, uint16_t from) {
  OverrideMerge m;
  std::lock_guard g(rules_mu);
  const int64_t now = opt.clock();
  std::map<std::string, cluster::OverrideRecord> winners;  // by id: the newest of this batch
  for (const cluster::OverrideRecord& r : records) {
    if (std::string why = cluster::check_record(r, now); !why.empty()) {
      ++m.dropped[std::string(cluster::reason_label(why))];
      spdlog::warn("override {} from node {} dropped: {}",
                   describe(r.value.domain, r.value.entries), from, why);
      continue;
    }
    switch (override_records.offer(r, now)) {
      case cluster::OverrideTable::Offer::kKnown:
        ++m.known;
        continue;
      case cluster::OverrideTable::Offer::kExpired:
        ++m.expired;
        continue;
      case cluster::OverrideTable::Offer::kNewer:
        break;
    }
    auto [it, fresh] = winners.try_emplace(cluster::record_id(r), r);
    if (!fresh && cluster::newer(r, it->second)) it->second = r;
  }
  if (winners.empty()) return m;
  for (auto& [id, r] : winners)
    m.applied.push_back(std::move(r));
  // Durable before applied, as a local write.
  if (store) {
    if (Status s = store->put_override_records(m.applied); !s.ok()) {
      spdlog::error("{} overrides from node {} not stored, so not applied: {}", m.applied.size(),
                    from, s.message());
      m.dropped["storage"] += m.applied.size();
      m.applied.clear();
      return m;
    }
  }
  for (const cluster::OverrideRecord& r : m.applied) {
    override_records.merge(r, now);
    const rules::Override& o = r.value;
    const std::string who = describe(o.domain, o.entries);
    if (r.deleted || (o.expires_at_ms != 0 && o.expires_at_ms <= now)) {
      overrides.del(o.domain, o.entries);
      spdlog::info("override {} from node {}: {} (version {}/{})",
                   r.deleted ? "deleted" : "expired", from, who, r.version.ms, r.version.node);
      continue;
    }
    if (std::string why = check_applies_locked(o); !why.empty()) {
      spdlog::warn("override {} from node {} has no effect under this node's rules (kept): {}", who,
                   from, why);
    }
    if (Status s = overrides.set(o); !s.ok()) {  // merged records passed check_record: a bug
      spdlog::error("override {} from node {} passed its check but not the table's: {}", who, from,
                    s.message());
      continue;
    }
    spdlog::info("override set from node {}: {} (version {}/{})", from, who, r.version.ms,
                 r.version.node);
  }
  apply_locked();
  return m;
}

cluster::OverrideDigest NodeState::override_digest() {
  std::lock_guard g(rules_mu);
  return override_records.digest(opt.clock());
}

std::vector<cluster::OverrideRecord> NodeState::override_records_now() {
  std::lock_guard g(rules_mu);
  return override_records.records(opt.clock());
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

std::optional<cluster::OverrideVersion> Node::override_version(
    const std::string& domain, std::span<const std::pair<std::string, std::string>> entries) const {
  std::lock_guard g(state_->rules_mu);
  const cluster::OverrideRecord* r =
      state_->override_records.find(rules::override_id(domain, entries));
  if (r == nullptr) return std::nullopt;
  return r->version;
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
  if (s.store) {
    p.disk = s.store->disk_usage();
    p.memory = s.store->memory_usage();
  }
  std::lock_guard g(s.rules_mu);
  p.overrides = s.overrides.size();
  return p;
}

}  // namespace sluice::node
