// Private to lib/rules: the compiled form of a RuleSet plus overrides that Policy::resolve walks.
//
// Everything resolve needs per rule is precomputed here (the rule's hash seed, where its limits
// are, whether any override names it), so the hot path only compares descriptor entries, hashes
// the key values once per applying rule and appends to the caller's vectors.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rules/rules.h"

namespace sluice::rules {

// envoyproxy/ratelimit's units (fixed blocks upstream, sliding windows here): rules imported from
// its files, and the windows a request's limit override may take.
struct EnvoyUnit {
  std::string_view name;
  int64_t ms;
};
inline constexpr int64_t kDayMs = 86'400'000;
inline constexpr EnvoyUnit kEnvoyUnits[] = {
    {"second", 1'000},    {"minute", 60'000},     {"hour", 3'600'000},   {"day", kDayMs},
    {"week", 7 * kDayMs}, {"month", 30 * kDayMs}, {"year", 365 * kDayMs}};

// A run of Policy::Impl::limit_refs.
struct LimitSpan {
  uint32_t first = 0;
  uint32_t count = 0;
};

// A limit as resolve hands it out: the Limit (owned by the Impl) and its window spec's index.
struct LimitRef {
  const Limit* limit = nullptr;
  uint32_t spec_index = 0;
  // Into Impl::specs: the spec of the older default bucket (Limit::default_bucket) when it is
  // another, whose counter this limit carries from for one window after compile; else -1.
  int32_t legacy = -1;
};

struct CompiledRule {
  const Rule* rule = nullptr;  // into Impl::rules
  uint64_t seed = 0;           // XXH3(domain, rule name, key names; hash_seed): key_hash's seed
  uint32_t stats_index = 0;    // index among all rules of all domains
  LimitSpan limits;            // the rule's own limits, or its default plan's
  bool uses_plans = false;     // rule->plan_from is set
  bool has_overrides = false;  // only then is the override map consulted
  bool legacy = false;         // a limit of the rule (or of a plan) has a LimitRef::legacy
};

struct CompiledPlan {
  std::string_view name;  // into Impl::rules
  LimitSpan limits;
};

// An envoy domain's descriptor tree (Domain::envoy_tree) laid out for upstream's GetLimit walk
// (envoy_match.cc). Node 0 is the domain itself; a node's children are looked up by their
// composite key ("key" or "key_value") through a hash index, then through its wildcard children.
struct CompiledEnvoyNode {
  std::string composite;  // "key" or "key_value", as upstream's map key
  int32_t rule = -1;      // into CompiledDomain::rules
  bool unlimited = false;
  uint32_t first_index = 0;  // into CompiledEnvoyTree::index: the children, sorted by hash
  uint32_t num_children = 0;
  uint32_t first_wild = 0;  // into CompiledEnvoyTree::wild, in declaration order
  uint32_t num_wild = 0;
};

struct EnvoyWildcard {
  uint32_t node = 0;        // the child it leads to
  uint32_t first_part = 0;  // into CompiledEnvoyTree::parts: the pattern split on '*'
  uint32_t num_parts = 0;
};

struct CompiledEnvoyTree {
  std::vector<CompiledEnvoyNode> nodes;
  std::vector<std::pair<uint64_t, uint32_t>> index;  // (hash of composite, node)
  std::vector<EnvoyWildcard> wild;
  std::vector<std::string_view> parts;  // into nodes[].composite (stable: nodes is not resized
                                        // after compile_envoy_tree returns)
  bool has_replaces = false;            // some rule has replaces or quota_mode
};

void compile_envoy_tree(const Domain& d, CompiledEnvoyTree& out);
// Upstream's GetLimit walk: the node the request's last entry reaches, or nullptr.
const CompiledEnvoyNode* envoy_walk(const CompiledEnvoyTree& tree,
                                    std::span<const Descriptor> entries);

struct CompiledDomain {
  const Domain* domain = nullptr;  // into Impl::rules
  std::vector<CompiledRule> rules;
  std::vector<CompiledPlan> plans;
  // For allowlists too long to scan: (hash of key and value, entry index), sorted by hash.
  std::vector<std::pair<uint64_t, uint32_t>> allow_index;
  CompiledEnvoyTree envoy;      // Domain::envoy only
  CompiledRule limit_override;  // a request's own limit (CheckRequest::has_limit_override)
  CompiledRule cell;            // a request's redis-cell limit (CheckRequest::cell)
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
  // Until when rules carry from their limits' legacy counters (LimitRef::legacy): one window and
  // one bucket of the longest of their limits after compile.
  int64_t legacy_until_ms = INT64_MIN;
  std::vector<window::WindowSpec> specs;
  std::vector<std::string> stats_names;
  // What requests with a limit override count under: one rule per domain (CompiledDomain::
  // limit_override points here) and one limit per envoy unit, whose `requests` is not used
  // (AppliedLimit::requests carries the request's).
  std::deque<Rule> override_rules;
  std::vector<LimitRef> unit_limits;
  // What cell checks count under: the domains' `cell` rules (in override_rules) and one limit
  // (algorithm kCell, spec cell_window_spec()) whose values come with each check.
  LimitRef cell_limit;
};

}  // namespace sluice::rules
