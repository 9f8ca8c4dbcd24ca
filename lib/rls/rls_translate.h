// Private to lib/rls: a RateLimitRequest into the node's checks, and the node's answer into the
// RateLimitResponse (docs/envoy.md, "Semantics"). Pure functions, no gRPC: unit-tested on their
// own (tests/unit/rls/rls_translate_test.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "envoy/service/ratelimit/v3/rls.pb.h"
#include "rls/rls.h"
#include "rules/rules.h"
#include "wire/protocol.h"

namespace sluice::rls {

using RateLimitRequest = envoy::service::ratelimit::v3::RateLimitRequest;
using RateLimitResponse = envoy::service::ratelimit::v3::RateLimitResponse;

enum class Refusal : uint8_t { kNone, kInvalidArgument, kResourceExhausted };

struct PlanError {
  Refusal refusal = Refusal::kNone;
  std::string message;  // for the gRPC status, e.g. "descriptor 2: entry 0 has an empty key"
};

// What becomes of each descriptor of a request. Reused across calls: clear() keeps capacity.
struct Plan {
  enum class Kind : uint8_t {
    kCheck,      // checks[check[i]] decides it
    kReplaced,   // its limit is replaced by another descriptor's (`replaces`): OK, not counted
    kUnlimited,  // an `unlimited` leaf: OK, remaining 2^32-1, not counted
  };
  std::vector<Kind> kind;
  std::vector<uint32_t> check;       // per descriptor, when kCheck: into checks
  std::vector<bool> quota_mode;      // per descriptor: its limit is in upstream's quota_mode
  std::vector<wire::Entry> entries;  // views into the request's strings
  std::vector<wire::Check> checks;
  std::vector<rules::Descriptor> walk;      // scratch: one descriptor's entries for the envoy walk
  std::vector<const rules::Rule*> reached;  // scratch: the rule each descriptor's walk reaches
  std::vector<std::string_view> replacing;  // scratch: limit names replaced in this request
  void clear();
};

// Validates `req` and plans its checks (entries point into `req`, which must outlive `out`).
// `policy` gives the entry bounds and the envoy domains' `replaces`; may be null (defaults).
PlanError plan_request(const RateLimitRequest& req, const rules::Policy* policy,
                       const RlsOptions& options, Plan& out);

// Fills `resp` from the node's answer to plan.checks (null when no check was sent); unavailable
// with why the answer cannot be used (a request-level error code, a count that does not match).
Status fill_response(const Plan& plan, const wire::Answer* answer, bool rate_limit_headers,
                     RateLimitResponse& resp);
// The same from decisions made in this process (Backend::decide_here), one per plan.checks.
Status fill_response(const Plan& plan, std::span<const wire::DecisionView> decisions,
                     bool rate_limit_headers, RateLimitResponse& resp);

// The RLS unit of a window: SECOND, MINUTE, HOUR, DAY, WEEK (7 d), MONTH (30 d), YEAR (365 d);
// UNKNOWN for any other window (a Sluice rule's 10 s or 90 s).
RateLimitResponse::RateLimit::Unit unit_of(int64_t window_ms);

}  // namespace sluice::rls
