// libFuzzer target for the two rules formats operators write (lib/rules): Sluice's rules file
// and envoyproxy/ratelimit's config, and what is built from them.
//
// Input: [mode][YAML text...]. Mode bit 0: envoyproxy/ratelimit's format, else Sluice's.
//
// Properties beyond "no crash, no sanitizer report":
//  - a parse either gives rules or errors, never both, and every error names the file;
//  - rules that parse compile into a Policy, and a request against every domain resolves
//    without error other than a per-request one (the hot path on operator-written rules);
//  - the Sluice rules-format text of parsed rules (`sluicectl rules convert`) can be produced.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "rules/rules.h"

namespace {

using namespace sluice::rules;

void fuzz_rules(std::span<const uint8_t> in) {
  if (in.empty()) return;
  const bool envoy = (in[0] & 1) != 0;
  const std::string_view text(reinterpret_cast<const char*>(in.data()) + 1, in.size() - 1);
  const ParseResult r = envoy ? parse_envoy_rules(text, "fuzz.yaml", EnvoyImportOptions{})
                              : parse_rules(text, "fuzz.yaml");
  FUZZ_REQUIRE(r.rules.has_value() == r.errors.empty());
  for (const ParseError& e : r.errors) {
    FUZZ_REQUIRE(e.file == "fuzz.yaml");
    FUZZ_REQUIRE(e.line >= 0);
    FUZZ_REQUIRE(!e.to_string().empty());
  }
  if (!r.rules) return;
  (void)to_rules_yaml(*r.rules);
  const auto policy = Policy::compile(*r.rules, Overrides{}, /*hash_seed=*/42);
  FUZZ_REQUIRE(policy != nullptr);
  Resolution res;
  for (const Domain& d : r.rules->domains) {
    // One request per rule: its key entries with a value each (and its match conditions).
    for (const Rule& rule : d.rules) {
      Descriptor desc[32];
      size_t n = 0;
      for (const Condition& c : rule.match) {
        if (n < 32) desc[n++] = Descriptor{c.key, c.value == "*" ? std::string_view("x") : c.value};
      }
      for (const std::string& k : rule.key) {
        if (n < 32) desc[n++] = Descriptor{k, "v"};
      }
      CheckRequest req;
      req.domain = d.name;
      req.descriptors = std::span<const Descriptor>(desc, n);
      res.clear();
      const ResolvedRequest rr = policy->resolve(req, 1'795'000'000'000, res);
      // Rules may repeat an entry key (a native request refuses duplicates) or be long.
      FUZZ_REQUIRE(rr.error == CheckError::kNone || rr.error == CheckError::kDuplicateDescriptor ||
                   rr.error == CheckError::kTooManyDescriptors ||
                   rr.error == CheckError::kEntryTooLong);
    }
  }
}

void write_seeds(const std::string& dir) {
  const std::string sluice_rules = R"(domains:
  - name: api
    rules:
      - name: per-user
        match: {path: "/login"}
        key: [user]
        limits: [100/1m, {limit: 1000, window: 1h, name: hourly}]
        mode: dry-run
        estimator: strict
        consistency: gossip
      - name: per-plan
        key: [client_id]
        plan: {from: plan, default: free}
    plans:
      free: [10/1s]
      pro: [1000/1s, 20000/1m]
    allowlist:
      - {client_id: internal}
)";
  const std::string envoy_rules = R"(domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5, name: marketing}
  - key: to_number
    rate_limit: {unit: week, requests_per_unit: 100}
    shadow_mode: true
  - key: path
    value: /api/*/orders*
    rate_limit:
      unit: hour
      requests_per_unit: 3
      replaces: [{name: marketing}]
  - key: ldap
    rate_limit: {unlimited: true}
)";
  // A seed that does not parse would start the fuzzer from an error path only.
  const ParseResult sluice_parsed = parse_rules(sluice_rules, "seed.yaml");
  if (!sluice_parsed.rules) {
    std::fprintf(stderr, "rules_fuzz seed: %s\n", sluice_parsed.errors.front().to_string().c_str());
    std::abort();
  }
  FUZZ_REQUIRE(parse_envoy_rules(envoy_rules, "seed.yaml", EnvoyImportOptions{}).rules);
  sluice::fuzz::write_seed(dir, "rules-seed-sluice", std::string(1, '\0') + sluice_rules);
  sluice::fuzz::write_seed(dir, "rules-seed-envoy", std::string(1, '\1') + envoy_rules);
}

}  // namespace

SLUICE_FUZZ_TARGET(fuzz_rules, write_seeds)
