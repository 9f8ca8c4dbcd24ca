// Policy: compile a RuleSet and the overrides into lookup tables, and resolve requests against
// them. resolve() is the hot path (millions of calls per second across threads): it reads only
// immutable data, allocates nothing once the caller's Resolution is warm, and hashes each
// applying rule's key values exactly once.
#include <algorithm>
#include <cstring>

// Inline xxHash: the key hash runs once per applying rule per request.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "rules/policy_impl.h"
#include "rules/rules.h"
#include "window/cell.h"

namespace sluice::rules {
namespace {

// Allowlists up to this size are scanned; longer ones are looked up through a sorted hash index.
constexpr size_t kScannedAllowlist = 8;

void put_u64_le(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// A key is hashed as its values, each prefixed by its length as a LEB128 varint, so ("ab","c") and
// ("a","bc") differ. Short keys (the usual case) are laid out in a stack buffer and hashed in one
// shot; a key that does not fit goes through XXH3's streaming state instead, which gives the same
// hash for the same bytes, so the result never depends on the buffer size. The streaming state
// (576 bytes, 64-byte aligned) lives only in the out-of-line slow path, keeping resolve's frame
// small.
size_t put_varint(unsigned char* p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = static_cast<unsigned char>(v | 0x80);
    v >>= 7;
  }
  p[n++] = static_cast<unsigned char>(v);
  return n;
}

class KeyBuffer {
 public:
  // Appends one length-prefixed value; false when it does not fit (then use StreamingKeyHasher).
  bool add(std::string_view v) {
    const size_t room = sizeof(buf_) - len_;  // len_ never exceeds the buffer
    if (room < kMaxVarint || v.size() > room - kMaxVarint) return false;
    len_ += put_varint(buf_ + len_, v.size());
    if (!v.empty()) std::memcpy(buf_ + len_, v.data(), v.size());  // data() may be null if empty
    len_ += v.size();
    return true;
  }
  uint64_t digest(uint64_t seed) const { return XXH3_64bits_withSeed(buf_, len_, seed); }

 private:
  static constexpr size_t kMaxVarint = 10;
  size_t len_ = 0;
  unsigned char buf_[512];
};

class StreamingKeyHasher {
 public:
  explicit StreamingKeyHasher(uint64_t seed) { XXH3_64bits_reset_withSeed(&state_, seed); }
  void add(std::string_view v) {
    unsigned char prefix[10];
    XXH3_64bits_update(&state_, prefix, put_varint(prefix, v.size()));
    if (!v.empty()) XXH3_64bits_update(&state_, v.data(), v.size());
  }
  uint64_t digest() { return XXH3_64bits_digest(&state_); }

 private:
  // Zeroed: reset_withSeed reuses a secret derived earlier when the state's seed already matches,
  // so an uninitialised state could skip deriving it (xxhash.h, XXH3_INITSTATE).
  XXH3_state_t state_{};
};

const std::string_view* find_value(std::span<const Descriptor> desc, std::string_view key) {
  for (const Descriptor& d : desc) {
    if (d.key == key) return &d.value;
  }
  return nullptr;
}

// The slow path of resolve for keys longer than KeyBuffer; every key entry is known present.
[[gnu::noinline]] uint64_t hash_long_key(uint64_t seed, const std::vector<std::string>& keys,
                                         std::span<const Descriptor> desc) {
  StreamingKeyHasher h(seed);
  for (const std::string& k : keys)
    h.add(*find_value(desc, k));
  return h.digest();
}

uint64_t hash_values(uint64_t seed, std::span<const std::string_view> values) {
  KeyBuffer buf;
  for (std::string_view v : values) {
    if (!buf.add(v)) {
      StreamingKeyHasher h(seed);
      for (std::string_view w : values)
        h.add(w);
      return h.digest();
    }
  }
  return buf.digest(seed);
}

// The key entry names are part of the seed: a rule that keeps its name but is keyed by other
// entries (client_id -> user) must not inherit the old counts.
uint64_t rule_seed(uint64_t hash_seed, std::string_view domain, const Rule& rule) {
  std::string s;
  s.append(domain).push_back('\0');
  s.append(rule.name);
  for (const std::string& k : rule.key)
    s.append(1, '\0').append(k);
  return XXH3_64bits_withSeed(s.data(), s.size(), hash_seed);
}

inline uint64_t mix_counter(uint64_t key_hash, const window::WindowSpec& spec) {
  unsigned char buf[24];
  put_u64_le(buf, key_hash);
  put_u64_le(buf + 8, static_cast<uint64_t>(spec.window_ms));
  put_u64_le(buf + 16, static_cast<uint64_t>(spec.bucket_ms));
  const uint64_t h = XXH3_64bits(buf, sizeof(buf));
  // The high half is the key's (routing_key): every window of one key has the same owner in a
  // cluster, so one node decides all of a rule's limits for that key together.
  const uint64_t c = (key_hash & 0xFFFF'FFFF'0000'0000ull) | (h & 0xFFFF'FFFFull);
  return c == 0 ? 1 : c;  // the engine uses 0 as "empty slot"
}

// A limit's counter: a GCRA limit's also mixes its interval and burst, so it never shares a
// counter with a window limit of the same length, nor with a GCRA limit of another rate (a
// changed rate starts a new arrival time rather than reading the old one at the wrong scale).
// A concurrency limit's mixes its lease time and buckets (not max_in_flight: a changed maximum
// keeps the leases held), and never shares a counter with a window limit either.
// A cell limit's mixes only its spec and a tag of its own (its T and L come with each check and
// may change: the arrival time carries over).
inline uint64_t limit_counter(uint64_t key_hash, const Limit& l) {
  if (l.algorithm == Algorithm::kWindow) return mix_counter(key_hash, l.spec);
  if (l.algorithm == Algorithm::kCell) {
    unsigned char buf[32];
    put_u64_le(buf, key_hash);
    put_u64_le(buf + 8, static_cast<uint64_t>(l.spec.window_ms));
    put_u64_le(buf + 16, static_cast<uint64_t>(l.spec.bucket_ms));
    put_u64_le(buf + 24, 0x63656c6cull);  // "cell"
    const uint64_t h = XXH3_64bits(buf, sizeof(buf));
    const uint64_t c = (key_hash & 0xFFFF'FFFF'0000'0000ull) | (h & 0xFFFF'FFFFull);
    return c == 0 ? 1 : c;
  }
  const bool gcra = l.algorithm == Algorithm::kGcra;
  unsigned char buf[40];
  put_u64_le(buf, key_hash);
  put_u64_le(buf + 8, static_cast<uint64_t>(l.spec.window_ms));
  put_u64_le(buf + 16, gcra ? static_cast<uint64_t>(l.gcra.interval_ns)
                            : static_cast<uint64_t>(l.spec.bucket_ms));
  put_u64_le(buf + 24, gcra ? l.gcra.burst : 0);
  put_u64_le(buf + 32, gcra ? 0x67637261ull : 0x636f6e63ull);  // "gcra", "conc"
  const uint64_t h = XXH3_64bits(buf, sizeof(buf));
  const uint64_t c = (key_hash & 0xFFFF'FFFF'0000'0000ull) | (h & 0xFFFF'FFFFull);
  return c == 0 ? 1 : c;
}

uint64_t allow_hash(std::string_view key, std::string_view value) {
  return XXH3_64bits_withSeed(value.data(), value.size(), XXH3_64bits(key.data(), key.size()));
}

bool matches(const std::vector<Condition>& match, std::span<const Descriptor> desc) {
  for (const Condition& c : match) {
    const std::string_view* v = find_value(desc, c.key);
    if (v == nullptr) return false;
    if (c.value != "*" && *v != c.value) return false;
  }
  return true;
}

bool allowlisted(const CompiledDomain& cd, std::span<const Descriptor> desc) {
  const std::vector<AllowEntry>& allow = cd.domain->allowlist;
  if (allow.empty()) return false;
  if (cd.allow_index.empty()) {
    for (const Descriptor& d : desc) {
      for (const AllowEntry& a : allow) {
        if (d.key == a.key && d.value == a.value) return true;
      }
    }
    return false;
  }
  for (const Descriptor& d : desc) {
    const uint64_t h = allow_hash(d.key, d.value);
    auto it = std::lower_bound(cd.allow_index.begin(), cd.allow_index.end(),
                               std::pair<uint64_t, uint32_t>{h, 0});
    for (; it != cd.allow_index.end() && it->first == h; ++it) {
      const AllowEntry& a = allow[it->second];
      if (d.key == a.key && d.value == a.value) return true;
    }
  }
  return false;
}

std::string default_limit_name(std::string_view owner, const Limit& l) {
  return std::string(owner) + ":" + std::to_string(l.requests) + "/" +
         format_duration(l.spec.window_ms);
}

// Past limit sets kept per key (Policy::compile's `previous`): a key whose override changes more
// often than this within the longest window keeps the newest ones; an older set's hits then carry
// only through a newer set's counters (seeded when the key was checked under that set).
constexpr size_t kMaxPast = 8;

// The limits a rule applies to a request when no override gives limits: its own, or the plan the
// request names (else the rule's default plan).
LimitSpan base_limits(const CompiledDomain& cd, const CompiledRule& cr,
                      std::span<const Descriptor> desc) {
  if (cr.uses_plans) {
    if (const std::string_view* plan = find_value(desc, cr.rule->plan_from)) {
      for (const CompiledPlan& cp : cd.plans) {
        if (cp.name == *plan) return cp.limits;
      }
    }
  }
  return cr.limits;
}

// The spec of an override limit that names no granularity (bucket_ms 0): the bucket of the rule's
// limit with the same window, so it counts in the same counter; else the finest of the rule's
// buckets that divides the window into at most kMaxBuckets; else the window's default.
window::WindowSpec inherited_spec(int64_t window_ms, std::span<const LimitRef> rule_limits) {
  // A GCRA limit's spec is no window's: an override's window limit never counts in it.
  // Nor does it inherit a concurrency limit's (lease times, not request windows).
  for (const LimitRef& lr : rule_limits) {
    if (lr.limit->algorithm == Algorithm::kWindow && lr.limit->spec.window_ms == window_ms) {
      return lr.limit->spec;
    }
  }
  int64_t bucket = 0;
  for (const LimitRef& lr : rule_limits) {
    if (lr.limit->algorithm != Algorithm::kWindow) continue;
    const int64_t b = lr.limit->spec.bucket_ms;
    if (window_ms % b == 0 && window_ms / b <= window::kMaxBuckets && (bucket == 0 || b < bucket)) {
      bucket = b;
    }
  }
  return window::make_spec(window_ms, bucket);
}

// Appends the counters of the limit sets `e`'s key was under before (an expired override's own,
// and its past sets still within their windows), one group per set, and returns how many. The
// set in force (`current`) is skipped: its counters are the ones being used.
[[gnu::noinline]] uint32_t add_carry(const Policy::Impl& p, const CompiledDomain& cd,
                                     const CompiledRule& cr, const CompiledOverride& e, uint64_t kh,
                                     int64_t now_ms, LimitSpan current,
                                     std::span<const Descriptor> desc, Resolution& out) {
  const auto rule = static_cast<uint32_t>(out.rules.size());  // the rule being appended
  uint32_t n = 0;
  uint32_t group = 0;
  auto add = [&](LimitSpan s) {
    if (s.first == current.first && s.count == current.count) return;
    for (uint32_t i = 0; i < s.count; ++i) {
      const LimitRef& lr = p.limit_refs[s.first + i];
      // A GCRA counter holds an arrival time, not counts, and a concurrency counter leases:
      // nothing can be seeded from either.
      if (lr.limit->algorithm != Algorithm::kWindow) continue;
      out.carry.push_back(CarrySource{mix_counter(kh, lr.limit->spec), lr.spec_index, rule, group});
      ++n;
    }
    ++group;
  };
  if (e.active && e.has_limits && e.expires_at_ms != 0 && now_ms >= e.expires_at_ms) add(e.limits);
  for (uint32_t k = 0; k < e.num_past; ++k) {
    const PastLimits& pl = p.past[e.first_past + k];
    if (pl.until_ms > now_ms) add(pl.base ? base_limits(cd, cr, desc) : pl.limits);
  }
  return n;
}

// For one window after compile: the counters of the older default buckets of the limits in force
// (LimitRef::legacy), one group, from which the engine seeds the key's counters (an upgrade that
// changed the default keeps the counts of the window in progress). Returns how many.
[[gnu::noinline]] uint32_t add_legacy_carry(const Policy::Impl& p, LimitSpan span, uint64_t kh,
                                            uint32_t rule, Resolution& out) {
  constexpr uint32_t kLegacyGroup = 0x4c454741;  // apart from add_carry's groups (0, 1, ...)
  uint32_t n = 0;
  for (uint32_t i = 0; i < span.count; ++i) {
    const LimitRef& lr = p.limit_refs[span.first + i];
    if (lr.legacy < 0) continue;
    const auto legacy = static_cast<uint32_t>(lr.legacy);
    out.carry.push_back(CarrySource{mix_counter(kh, p.specs[legacy]), legacy, rule, kLegacyGroup});
    ++n;
  }
  return n;
}

// Appends rule `cr` for the key whose hash is `kh`: its limits (or its override's), the
// counters it carries from, and counts it in `res`.
void apply_rule(const Policy::Impl& p, const CompiledDomain& cd, const CompiledRule& cr,
                uint64_t kh, int64_t now_ms, std::span<const Descriptor> desc, Resolution& out,
                ResolvedRequest& res) {
  const Rule& rule = *cr.rule;
  const CompiledOverride* entry = nullptr;  // the key's override, or what it was under before
  const CompiledOverride* ov = nullptr;     // the override in force
  if (cr.has_overrides) {
    const auto oit = p.overrides.find(kh);
    if (oit != p.overrides.end() && oit->second.stats_index == cr.stats_index) {
      entry = &oit->second;
      if (entry->active && (entry->expires_at_ms == 0 || now_ms < entry->expires_at_ms)) {
        ov = entry;
      }
    }
  }
  LimitSpan span = cr.limits;
  if (ov != nullptr && ov->has_limits) {
    span = ov->limits;
  } else if (cr.uses_plans) {
    span = base_limits(cd, cr, desc);
  }
  if (entry != nullptr) res.num_carry += add_carry(p, cd, cr, *entry, kh, now_ms, span, desc, out);
  if (cr.legacy && now_ms < p.legacy_until_ms) [[unlikely]] {
    res.num_carry += add_legacy_carry(p, span, kh, static_cast<uint32_t>(out.rules.size()), out);
  }

  out.rules.push_back(
      AppliedRule{&rule, cr.stats_index, ov != nullptr && ov->has_mode ? ov->mode : rule.mode,
                  ov != nullptr, static_cast<uint32_t>(out.limits.size()), span.count});
  for (uint32_t i = 0; i < span.count; ++i) {
    const LimitRef& lr = p.limit_refs[span.first + i];
    out.limits.push_back(
        AppliedLimit{lr.limit, limit_counter(kh, *lr.limit), lr.spec_index, lr.limit->requests});
  }
  ++res.num_rules;
}

// The slow path for envoy keys and limit-override keys longer than KeyBuffer: the entries'
// values (and keys, with_keys) in request order.
[[gnu::noinline]] uint64_t hash_entries(uint64_t seed, std::span<const Descriptor> desc,
                                        bool with_keys) {
  StreamingKeyHasher h(seed);
  for (const Descriptor& d : desc) {
    if (with_keys) h.add(d.key);
    h.add(d.value);
  }
  return h.digest();
}

// A cell check (CheckRequest::cell): its own limit replaces every rule of the domain, counted
// under the domain and all its entries, keys and values, in one counter whatever T and L are.
[[gnu::noinline]] void resolve_cell(const Policy::Impl& p, const CompiledDomain& cd,
                                    const CheckRequest& req, Resolution& out,
                                    ResolvedRequest& res) {
  window::CellParams params;
  if (window::cell_params(req.cell->interval_ns, req.cell->limit, params) !=
      window::CellError::kNone) {
    res.error = CheckError::kBadLimitOverride;
    return;
  }
  int64_t inc = 0;
  if (__builtin_mul_overflow(params.interval_ns, req.cell->quantity, &inc)) {
    res.error = CheckError::kBadLimitOverride;
    return;
  }
  const CompiledRule& cr = cd.cell;
  KeyBuffer key;
  bool fits = true;
  for (const Descriptor& d : req.descriptors)
    fits = fits && key.add(d.key) && key.add(d.value);
  const uint64_t kh = fits ? key.digest(cr.seed) : hash_entries(cr.seed, req.descriptors, true);
  out.rules.push_back(AppliedRule{cr.rule, cr.stats_index, Mode::kEnforce, false,
                                  static_cast<uint32_t>(out.limits.size()), 1});
  out.limits.push_back(AppliedLimit{p.cell_limit.limit, limit_counter(kh, *p.cell_limit.limit),
                                    p.cell_limit.spec_index, static_cast<uint64_t>(params.limit)});
  res.num_rules = 1;
}

// Policy::compile with a previous policy: what each key whose limits change was under before.
class CarryHistory {
 public:
  CarryHistory(Policy::Impl& p, const Policy::Impl& prev, int64_t now_ms)
      : p_(p), prev_(prev), now_(now_ms) {
    for (const window::WindowSpec& spec : p_.specs)
      horizon_ = std::max(horizon_, spec.window_ms + spec.bucket_ms);
    for (CompiledDomain& cd : p_.domains) {
      for (CompiledRule& cr : cd.rules)
        by_name_.emplace(p_.stats_names[cr.stats_index], std::pair{&cd, &cr});
    }
  }

  // `spec_index` registers a spec in the new policy.
  template <class SpecIndex>
  void build(SpecIndex&& spec_index) {
    // Keys with an override now and none before: they were under the rule's limits.
    for (auto& [kh, e] : p_.overrides) {
      if (prev_.overrides.count(kh) != 0 || !in_force_with_limits(e)) continue;
      if (rule_of(e.stats_index, p_).second == nullptr) continue;
      past_.clear();
      past_.push_back({true, {}, now_ + horizon_});
      e.first_past = static_cast<uint32_t>(p_.past.size());
      e.num_past = static_cast<uint32_t>(past_.size());
      p_.past.insert(p_.past.end(), past_.begin(), past_.end());
    }
    // Keys the previous policy had an entry for (an override, or a past).
    for (const auto& [kh, pe] : prev_.overrides) {
      CompiledRule* cr = rule_of(pe.stats_index, prev_).second;
      if (cr == nullptr) continue;  // the rule is gone
      auto nit = p_.overrides.find(kh);
      CompiledOverride* ne = nit == p_.overrides.end() ? nullptr : &nit->second;
      if (ne != nullptr && ne->stats_index != cr->stats_index) continue;  // key_hash collision
      past_.clear();
      const bool prev_limits = in_force_with_limits(pe);
      const bool new_limits = ne != nullptr && in_force_with_limits(*ne);
      const bool same = prev_limits == new_limits &&
                        (!prev_limits || same_specs(prev_, pe.limits, p_, ne->limits));
      if (!same) {
        const int64_t until = now_ + std::max(horizon_, horizon(prev_, pe.limits));
        if (prev_limits) {
          past_.push_back({false, copy(pe.limits, spec_index), until});
        } else {
          past_.push_back({true, {}, until});
        }
      }
      if (pe.active && pe.has_limits && !prev_limits) {  // expired: out of force since then
        const int64_t until = pe.expires_at_ms + std::max(horizon_, horizon(prev_, pe.limits));
        if (until > now_) past_.push_back({false, copy(pe.limits, spec_index), until});
      }
      for (uint32_t k = 0; k < pe.num_past && past_.size() < kMaxPast; ++k) {
        const PastLimits& pl = prev_.past[pe.first_past + k];
        if (pl.until_ms <= now_) continue;
        past_.push_back(pl.base ? pl : PastLimits{false, copy(pl.limits, spec_index), pl.until_ms});
      }
      if (past_.size() > kMaxPast) past_.resize(kMaxPast);
      if (past_.empty()) continue;
      if (ne == nullptr) {
        CompiledOverride co;
        co.stats_index = cr->stats_index;
        co.active = false;
        ne = &p_.overrides.emplace(kh, co).first->second;
        cr->has_overrides = true;
      }
      ne->first_past = static_cast<uint32_t>(p_.past.size());
      ne->num_past = static_cast<uint32_t>(past_.size());
      p_.past.insert(p_.past.end(), past_.begin(), past_.end());
    }
  }

 private:
  bool in_force_with_limits(const CompiledOverride& e) const {
    return e.active && e.has_limits && (e.expires_at_ms == 0 || now_ < e.expires_at_ms);
  }
  // The rule (of the new policy) that stats slot `index` of `of` names.
  std::pair<CompiledDomain*, CompiledRule*> rule_of(uint32_t index, const Policy::Impl& of) {
    if (index >= of.stats_names.size()) return {nullptr, nullptr};
    auto it = by_name_.find(of.stats_names[index]);
    return it == by_name_.end() ? std::pair<CompiledDomain*, CompiledRule*>{nullptr, nullptr}
                                : it->second;
  }
  // How long after a set stops being used its counters can hold hits in its own windows.
  static int64_t horizon(const Policy::Impl& of, LimitSpan s) {
    int64_t h = 0;
    for (uint32_t i = 0; i < s.count; ++i) {
      const window::WindowSpec& spec = of.limit_refs[s.first + i].limit->spec;
      h = std::max(h, spec.window_ms + spec.bucket_ms);
    }
    return h;
  }
  static bool same_specs(const Policy::Impl& a, LimitSpan sa, const Policy::Impl& b, LimitSpan sb) {
    if (sa.count != sb.count) return false;
    for (uint32_t i = 0; i < sa.count; ++i) {
      const window::WindowSpec& spec = a.limit_refs[sa.first + i].limit->spec;
      bool found = false;
      for (uint32_t j = 0; j < sb.count; ++j)
        found |= b.limit_refs[sb.first + j].limit->spec == spec;
      if (!found) return false;
    }
    return true;
  }
  // The previous policy's limits `s`, copied into the new one.
  template <class SpecIndex>
  LimitSpan copy(LimitSpan s, SpecIndex& spec_index) {
    LimitSpan out{static_cast<uint32_t>(p_.limit_refs.size()), s.count};
    for (uint32_t i = 0; i < s.count; ++i) {
      const Limit& stored = p_.override_limits.emplace_back(*prev_.limit_refs[s.first + i].limit);
      p_.limit_refs.push_back({&stored, spec_index(stored.spec)});
    }
    return out;
  }

  Policy::Impl& p_;
  const Policy::Impl& prev_;
  int64_t now_;
  // How long a past set is kept: its counters' hits matter while any limit that may follow can
  // still see them, so the longest window (and bucket) of any limit of this policy.
  int64_t horizon_ = 0;
  std::unordered_map<std::string_view, std::pair<CompiledDomain*, CompiledRule*>> by_name_;
  std::vector<PastLimits> past_;
};

// Policy::compile's steps, on the policy being built: its domains' rules and plans, the rules of
// limit overrides and cell checks, then the overrides in force.
class PolicyBuilder {
 public:
  PolicyBuilder(Policy::Impl& p, int64_t now_ms) : p_(p), now_(now_ms) {}

  // A spec's index in the policy, registered on first use.
  uint32_t spec_index(const window::WindowSpec& spec) {
    auto it = std::find(p_.specs.begin(), p_.specs.end(), spec);
    if (it == p_.specs.end()) it = p_.specs.insert(it, spec);
    return static_cast<uint32_t>(it - p_.specs.begin());
  }

  // Every declared domain: its plans, its rules (a stats slot each, in order), its allowlist
  // index and Envoy tree.
  void domains(uint64_t hash_seed) {
    p_.domains.reserve(p_.rules.domains.size());
    for (const Domain& d : p_.rules.domains) {
      CompiledDomain cd;
      cd.domain = &d;
      for (const Plan& plan : d.plans)
        cd.plans.push_back({plan.name, add_limits(plan.limits)});
      for (const Rule& r : d.rules) {
        cd.rules.push_back(rule(cd, r, rule_seed(hash_seed, d.name, r)));
        p_.stats_names.push_back(d.name + "/" + r.name);
      }
      if (d.allowlist.size() > kScannedAllowlist) {
        for (size_t i = 0; i < d.allowlist.size(); ++i) {
          cd.allow_index.emplace_back(allow_hash(d.allowlist[i].key, d.allowlist[i].value),
                                      static_cast<uint32_t>(i));
        }
        std::sort(cd.allow_index.begin(), cd.allow_index.end());
      }
      if (d.envoy) compile_envoy_tree(d, cd.envoy);
      // A RuleSet from parse_rules has unique domain names; otherwise the first one wins.
      p_.domain_index.emplace(d.name, static_cast<uint32_t>(p_.domains.size()));
      p_.domains.push_back(std::move(cd));
    }
  }

  // Limit overrides: a rule per domain, after every declared rule's stats slot, and one limit per
  // unit (their specs registered last, so the declared limits keep their spec indexes). Cell
  // checks: the same again, after them (their counters' seed differs from the override's).
  void synthetic_rules(uint64_t hash_seed) {
    // An override counts as the domain's rules do (Envoy's upstream counts every hit).
    for (CompiledDomain& cd : p_.domains)
      synthetic_rule(cd, cd.limit_override, "limit-override", cd.domain->envoy, hash_seed);
    for (CompiledDomain& cd : p_.domains)
      synthetic_rule(cd, cd.cell, "cell", false, hash_seed);
    if (p_.domains.empty()) return;
    for (const EnvoyUnit& u : kEnvoyUnits) {
      Limit& l = p_.override_limits.emplace_back();
      l.spec = window::make_spec(u.ms);
      p_.unit_limits.push_back({&l, spec_index(l.spec)});
    }
    Limit& cell = p_.override_limits.emplace_back();
    cell.name = "cell";
    cell.algorithm = Algorithm::kCell;
    cell.spec = cell_window_spec();
    p_.cell_limit = {&cell, spec_index(cell.spec)};
  }

  // Each override in force, on every rule of its domain keyed by exactly its entries (in any
  // order).
  void overrides(const Overrides& overrides) {
    std::vector<std::string_view> values;
    for (const Override& o : overrides.list()) {
      auto dit = p_.domain_index.find(o.domain);
      if (dit == p_.domain_index.end()) continue;
      CompiledDomain& cd = p_.domains[dit->second];
      for (CompiledRule& cr : cd.rules) {
        const Rule& r = *cr.rule;
        if (r.key.size() != o.entries.size()) continue;
        values.clear();
        for (const std::string& k : r.key) {
          auto e = std::find_if(o.entries.begin(), o.entries.end(),
                                [&](const auto& kv) { return kv.first == k; });
          if (e == o.entries.end()) break;
          values.push_back(e->second);
        }
        if (values.size() != r.key.size()) continue;
        if (p_.overrides.emplace(hash_values(cr.seed, values), compiled(o, cd, cr)).second)
          cr.has_overrides = true;
      }
    }
  }

 private:
  void synthetic_rule(const CompiledDomain& cd, CompiledRule& cr, const char* name,
                      bool count_denied, uint64_t hash_seed) {
    Rule& r = p_.override_rules.emplace_back();
    r.name = name;
    r.count_denied = count_denied;
    cr.rule = &r;
    cr.seed = rule_seed(hash_seed, cd.domain->name, r);
    cr.stats_index = next_stats_++;
    p_.stats_names.push_back(cd.domain->name + "/" + r.name);
  }

  CompiledRule rule(const CompiledDomain& cd, const Rule& r, uint64_t seed) {
    CompiledRule cr;
    cr.rule = &r;
    cr.seed = seed;
    cr.stats_index = next_stats_++;
    cr.uses_plans = !r.plan_from.empty();
    if (cr.uses_plans) {
      for (const CompiledPlan& cp : cd.plans) {
        if (cp.name == r.default_plan) cr.limits = cp.limits;
        cr.legacy = cr.legacy || has_legacy(cp.limits);
      }
    } else {
      cr.limits = add_limits(r.limits);
      cr.legacy = has_legacy(cr.limits);
    }
    return cr;
  }

  // Override `o` on rule `cr`: its mode, and its own limits or its plan's.
  CompiledOverride compiled(const Override& o, const CompiledDomain& cd, const CompiledRule& cr) {
    CompiledOverride co;
    co.stats_index = cr.stats_index;
    co.expires_at_ms = o.expires_at_ms;
    if (o.mode) {
      co.has_mode = true;
      co.mode = *o.mode;
    }
    if (!o.limits.empty()) {
      co.has_limits = true;
      co.limits = {static_cast<uint32_t>(p_.limit_refs.size()),
                   static_cast<uint32_t>(o.limits.size())};
      const std::span<const LimitRef> rule_limits(p_.limit_refs.data() + cr.limits.first,
                                                  cr.limits.count);
      std::vector<window::WindowSpec> specs;  // limit_refs grows below: resolve them first
      for (const Limit& l : o.limits) {
        specs.push_back(l.spec.bucket_ms == 0 ? inherited_spec(l.spec.window_ms, rule_limits)
                                              : l.spec);
      }
      for (size_t i = 0; i < o.limits.size(); ++i) {
        Limit& stored = p_.override_limits.emplace_back(o.limits[i]);
        stored.spec = specs[i];
        if (stored.name.empty()) stored.name = default_limit_name(cr.rule->name, stored);
        p_.limit_refs.push_back({&stored, spec_index(stored.spec)});
      }
    } else if (!o.plan.empty()) {
      for (const CompiledPlan& cp : cd.plans) {
        if (cp.name == o.plan) {
          co.has_limits = true;
          co.limits = cp.limits;
        }
      }
    }
    return co;
  }

  LimitSpan add_limits(const std::vector<Limit>& limits) {
    LimitSpan span{static_cast<uint32_t>(p_.limit_refs.size()),
                   static_cast<uint32_t>(limits.size())};
    for (const Limit& l : limits) {
      LimitRef ref{&l, spec_index(l.spec)};
      // A default bucket that is not the older default: the older default's counter (written
      // by an older version before a restart, or by older members) seeds this one.
      const window::WindowSpec legacy =
          window::make_spec(l.spec.window_ms, window::legacy_default_bucket_ms(l.spec.window_ms));
      if (l.algorithm == Algorithm::kWindow && l.default_bucket && legacy != l.spec) {
        ref.legacy = static_cast<int32_t>(spec_index(legacy));
        // Hits counted before `now` leave every true window by now + window; a bucket more
        // covers where the seed places them (at most the target's newest bucket).
        p_.legacy_until_ms =
            std::max(p_.legacy_until_ms, now_ + l.spec.window_ms + l.spec.bucket_ms);
      }
      p_.limit_refs.push_back(ref);
    }
    return span;
  }

  bool has_legacy(LimitSpan span) const {
    for (uint32_t i = 0; i < span.count; ++i) {
      if (p_.limit_refs[span.first + i].legacy >= 0) return true;
    }
    return false;
  }

  Policy::Impl& p_;
  const int64_t now_;
  uint32_t next_stats_ = 0;
};

}  // namespace

std::string_view to_string(CheckError e) {
  switch (e) {
    case CheckError::kNone:
      return "none";
    case CheckError::kEmptyDomain:
      return "empty_domain";
    case CheckError::kUnknownDomain:
      return "unknown_domain";
    case CheckError::kTooManyDescriptors:
      return "too_many_entries";
    case CheckError::kEntryTooLong:
      return "entry_too_long";
    case CheckError::kEmptyDescriptorKey:
      return "empty_entry_key";
    case CheckError::kDuplicateDescriptor:
      return "duplicate_entry";
    case CheckError::kHitsTooLarge:
      return "hits_too_large";
    case CheckError::kBadLimitOverride:
      return "bad_limit_override";
    case CheckError::kLeaseUnknown:
      return "lease_unknown";
    case CheckError::kLeaseExpired:
      return "lease_expired";
    case CheckError::kLeaseReleased:
      return "lease_released";
  }
  return "unknown";
}

uint64_t key_hash(uint64_t hash_seed, std::string_view domain, const Rule& rule,
                  std::span<const std::string_view> values) {
  return hash_values(rule_seed(hash_seed, domain, rule), values);
}

uint64_t counter_id(uint64_t key_hash, const window::WindowSpec& spec) {
  return mix_counter(key_hash, spec);
}

uint64_t counter_id(uint64_t key_hash, const Limit& limit) {
  return limit_counter(key_hash, limit);
}

Policy::Policy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Policy::~Policy() = default;

std::shared_ptr<const Policy> Policy::compile(RuleSet rules, const Overrides& overrides,
                                              uint64_t hash_seed, InputLimits input,
                                              const Policy* previous, int64_t now_ms) {
  auto impl = std::make_unique<Impl>();
  Impl& p = *impl;
  p.rules = std::move(rules);  // never modified again: everything below points into it
  p.input = input;
  p.hash_seed = hash_seed;
  p.compiled_at_ms = now_ms;
  PolicyBuilder b(p, now_ms);
  b.domains(hash_seed);
  b.synthetic_rules(hash_seed);
  b.overrides(overrides);
  if (previous != nullptr) {
    CarryHistory(p, *previous->impl_, now_ms).build([&b](const window::WindowSpec& spec) {
      return b.spec_index(spec);
    });
  }
  return std::shared_ptr<const Policy>(new Policy(std::move(impl)));
}

ResolvedRequest Policy::resolve(const CheckRequest& req, int64_t now_ms, Resolution& out) const {
  ResolvedRequest res;
  resolve(req, now_ms, out, res);
  return res;
}

void Policy::resolve(const CheckRequest& req, int64_t now_ms, Resolution& out,
                     ResolvedRequest& res) const {
  const Impl& p = *impl_;
  res = ResolvedRequest{};
  res.first_rule = static_cast<uint32_t>(out.rules.size());  // valid even when nothing applies
  res.first_carry = static_cast<uint32_t>(out.carry.size());
  // Validation in a fixed order, so a request with several faults always gets the same answer.
  if (req.domain.empty()) {
    res.error = CheckError::kEmptyDomain;
    return;
  }
  if (req.hits > p.input.max_hits) {
    res.error = CheckError::kHitsTooLarge;
    return;
  }
  const std::span<const Descriptor> desc = req.descriptors;
  if (desc.size() > p.input.max_descriptors) {
    res.error = CheckError::kTooManyDescriptors;
    return;
  }
  bool too_long = false;
  for (const Descriptor& d : desc) {
    if (d.key.empty()) {
      res.error = CheckError::kEmptyDescriptorKey;
      return;
    }
    too_long |= d.key.size() > p.input.max_entry_bytes || d.value.size() > p.input.max_entry_bytes;
  }
  if (too_long) {
    res.error = CheckError::kEntryTooLong;
    return;
  }
  const auto dit = p.domain_index.find(req.domain);
  const bool envoy = dit != p.domain_index.end() && p.domains[dit->second].domain->envoy;
  // Pairwise: descriptors are few (bounded by max_descriptors) and this needs no memory. Envoy
  // descriptors may repeat a key (upstream walks them by position).
  for (size_t i = 1; i < desc.size() && !envoy; ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (desc[i].key == desc[j].key) {
        res.error = CheckError::kDuplicateDescriptor;
        return;
      }
    }
  }
  if (dit == p.domain_index.end()) {
    res.error = CheckError::kUnknownDomain;
    return;
  }
  const CompiledDomain& cd = p.domains[dit->second];
  if (req.cell != nullptr) [[unlikely]] {
    resolve_cell(p, cd, req, out, res);
    return;
  }
  if (allowlisted(cd, desc)) {
    res.allowlisted = true;
    return;
  }

  if (req.has_limit_override) {
    // The request's own limit replaces every rule (upstream's GetLimit checks it first).
    const LimitRef* unit = nullptr;
    for (const LimitRef& lr : p.unit_limits) {
      if (lr.limit->spec.window_ms == req.limit_override_window_ms) unit = &lr;
    }
    if (unit == nullptr) {
      res.error = CheckError::kBadLimitOverride;
      return;
    }
    const CompiledRule& cr = cd.limit_override;
    KeyBuffer key;
    bool fits = true;
    for (const Descriptor& d : desc)
      fits = fits && key.add(d.key) && key.add(d.value);
    const uint64_t kh = fits ? key.digest(cr.seed) : hash_entries(cr.seed, desc, true);
    out.rules.push_back(AppliedRule{cr.rule, cr.stats_index, Mode::kEnforce, false,
                                    static_cast<uint32_t>(out.limits.size()), 1});
    out.limits.push_back(AppliedLimit{unit->limit, mix_counter(kh, unit->limit->spec),
                                      unit->spec_index, req.limit_override_requests});
    res.num_rules = 1;
    return;
  }

  if (cd.domain->envoy) {
    const CompiledEnvoyNode* node = envoy_walk(cd.envoy, desc);
    if (node == nullptr) return;
    if (node->unlimited) {
      res.allowlisted = true;
      return;
    }
    if (node->rule < 0) return;
    // The path's keys are the request's keys, one per level: its values in order are the key.
    const CompiledRule& cr = cd.rules[static_cast<size_t>(node->rule)];
    KeyBuffer key;
    bool fits = true;
    for (const Descriptor& d : desc)
      fits = fits && key.add(d.value);
    const uint64_t kh = fits ? key.digest(cr.seed) : hash_entries(cr.seed, desc, false);
    apply_rule(p, cd, cr, kh, now_ms, desc, out, res);
    return;
  }

  for (const CompiledRule& cr : cd.rules) {
    const Rule& rule = *cr.rule;
    if (!matches(rule.match, desc)) continue;
    KeyBuffer key;
    bool complete = true;
    bool fits = true;
    for (const std::string& k : rule.key) {
      const std::string_view* v = find_value(desc, k);
      if (v == nullptr) {
        complete = false;  // a rule applies only when every key entry is present
        break;
      }
      if (fits) fits = key.add(*v);
    }
    if (!complete) continue;
    const uint64_t kh = fits ? key.digest(cr.seed) : hash_long_key(cr.seed, rule.key, desc);
    apply_rule(p, cd, cr, kh, now_ms, desc, out, res);
  }
}

const Rule* Policy::envoy_rule(std::string_view domain, std::span<const Descriptor> entries,
                               bool& unlimited) const {
  unlimited = false;
  const auto dit = impl_->domain_index.find(domain);
  if (dit == impl_->domain_index.end()) return nullptr;
  const CompiledDomain& cd = impl_->domains[dit->second];
  if (!cd.domain->envoy) return nullptr;
  const CompiledEnvoyNode* node = envoy_walk(cd.envoy, entries);
  if (node == nullptr) return nullptr;
  unlimited = node->unlimited;
  return node->rule < 0 ? nullptr : cd.rules[static_cast<size_t>(node->rule)].rule;
}

bool Policy::is_envoy_domain(std::string_view domain) const {
  const auto dit = impl_->domain_index.find(domain);
  return dit != impl_->domain_index.end() && impl_->domains[dit->second].domain->envoy;
}

bool Policy::domain_has_replaces(std::string_view domain) const {
  const auto dit = impl_->domain_index.find(domain);
  return dit != impl_->domain_index.end() && impl_->domains[dit->second].envoy.has_replaces;
}

const RuleSet& Policy::rules() const {
  return impl_->rules;
}
const InputLimits& Policy::input_limits() const {
  return impl_->input;
}
uint64_t Policy::hash_seed() const {
  return impl_->hash_seed;
}
size_t Policy::num_stats_slots() const {
  return impl_->stats_names.size();
}

std::string_view Policy::stats_name(uint32_t index) const {
  return index < impl_->stats_names.size() ? std::string_view(impl_->stats_names[index])
                                           : std::string_view();
}

std::span<const window::WindowSpec> Policy::window_specs() const {
  return impl_->specs;
}

}  // namespace sluice::rules
