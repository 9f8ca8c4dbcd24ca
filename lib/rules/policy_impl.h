// Private to lib/rules: the compiled form of a RuleSet plus overrides that Policy::resolve walks.
//
// Everything resolve needs per rule is precomputed here (the rule's hash seed, where its limits
// are, whether any override names it), so the hot path only compares descriptor entries, hashes
// the key values once per applying rule and appends to the caller's vectors.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rules/rules.h"

namespace sluice::rules {

// A run of Policy::Impl::limit_refs.
struct LimitSpan {
  uint32_t first = 0;
  uint32_t count = 0;
};

// A limit as resolve hands it out: the Limit (owned by the Impl) and its window spec's index.
struct LimitRef {
  const Limit* limit = nullptr;
  uint32_t spec_index = 0;
};

struct CompiledRule {
  const Rule* rule = nullptr;  // into Impl::rules
  uint64_t seed = 0;           // XXH3(domain, rule name, key names; hash_seed): key_hash's seed
  uint32_t stats_index = 0;    // index among all rules of all domains
  LimitSpan limits;            // the rule's own limits, or its default plan's
  bool uses_plans = false;     // rule->plan_from is set
  bool has_overrides = false;  // only then is the override map consulted
};

struct CompiledPlan {
  std::string_view name;  // into Impl::rules
  LimitSpan limits;
};

struct CompiledDomain {
  const Domain* domain = nullptr;  // into Impl::rules
  std::vector<CompiledRule> rules;
  std::vector<CompiledPlan> plans;
  // For allowlists too long to scan: (hash of key and value, entry index), sorted by hash.
  std::vector<std::pair<uint64_t, uint32_t>> allow_index;
};

// A limit set a key was under before its current one, kept while its counters can hold hits
// inside a window (Policy::compile's `previous`).
struct PastLimits {
  bool base = false;     // the rule's own limits (or the request's plan's), resolved per request
  LimitSpan limits;      // when !base: into Impl::limit_refs
  int64_t until_ms = 0;  // from then on its counters hold nothing inside any of their windows
};

// A key's override (`active`), or only what it was under before (an override deleted or pruned
// after it expired: `active` false, and nothing of the override applies).
struct CompiledOverride {
  uint32_t stats_index = 0;  // the rule it belongs to; guards against a key_hash collision
  bool active = true;
  bool has_limits = false;  // limits (own or an assigned plan's) replace the rule's
  bool has_mode = false;
  Mode mode = Mode::kEnforce;
  LimitSpan limits;
  int64_t expires_at_ms = 0;  // 0 = never
  uint32_t first_past = 0;    // into Impl::past, newest first
  uint32_t num_past = 0;
};

// Views into `rules` stay valid because the Impl lives behind a unique_ptr and `rules` is never
// modified after compile().
struct Policy::Impl {
  RuleSet rules;
  InputLimits input;
  uint64_t hash_seed = 0;
  std::vector<CompiledDomain> domains;
  std::unordered_map<std::string_view, uint32_t> domain_index;  // name -> index into domains
  std::vector<LimitRef> limit_refs;
  std::deque<Limit> override_limits;  // a deque: pointers stay valid while it grows
  std::unordered_map<uint64_t, CompiledOverride> overrides;  // by key_hash
  std::vector<PastLimits> past;
  int64_t compiled_at_ms = 0;  // compile's now_ms
  std::vector<window::WindowSpec> specs;
  std::vector<std::string> stats_names;
};

}  // namespace sluice::rules
