#include "rls/rls_translate.h"

#include <algorithm>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "rules/rules.h"
#include "wire/ratelimit_headers.h"

namespace sluice::rls {
namespace {

using Unit = RateLimitResponse::RateLimit::Unit;
using Status = RateLimitResponse::DescriptorStatus;

constexpr int64_t kSecond = 1'000;
constexpr int64_t kDay = 86'400'000;
constexpr uint32_t kMaxU32 = std::numeric_limits<uint32_t>::max();

uint32_t clamp_u32(uint64_t v) {
  return v > kMaxU32 ? kMaxU32 : static_cast<uint32_t>(v);
}

// The window of a request's limit override, by upstream's units; 0 for UNKNOWN or a value this
// build does not know. The same windows as wire::kLimitOverrideWindowsMs.
int64_t window_of(int unit) {
  switch (unit) {
    case envoy::type::v3::SECOND:
      return kSecond;
    case envoy::type::v3::MINUTE:
      return 60 * kSecond;
    case envoy::type::v3::HOUR:
      return 3'600 * kSecond;
    case envoy::type::v3::DAY:
      return kDay;
    case envoy::type::v3::WEEK:
      return 7 * kDay;
    case envoy::type::v3::MONTH:
      return 30 * kDay;
    case envoy::type::v3::YEAR:
      return 365 * kDay;
    default:
      return 0;
  }
}

PlanError refuse(Refusal r, std::string message) {
  return PlanError{r, std::move(message)};
}

// The limit a descriptor's status shows: the one that denied it (the longest wait), else the one
// with the fewest remaining (ties: the later reset). Null when none applied.
// D is wire::Decision (an answer read from the check protocol) or wire::DecisionView (decided in
// this process); L its limit type.
template <typename D,
          typename L = std::remove_cvref_t<decltype(*std::declval<const D&>().limits.begin())>>
const L* binding_limit(const D& d) {
  const L* best = nullptr;
  for (const L& l : d.limits) {
    if (!d.allowed) {
      if (!l.exceeded || l.mode == wire::Mode::kDryRun) continue;
      const auto wait = [](const L& x) {
        return x.retry_after_ms < 0 ? std::numeric_limits<int64_t>::max() : x.retry_after_ms;
      };
      if (best == nullptr || wait(l) > wait(*best)) best = &l;
    } else if (best == nullptr || l.remaining < best->remaining ||
               (l.remaining == best->remaining && l.reset_ms > best->reset_ms)) {
      best = &l;
    }
  }
  if (best == nullptr && !d.limits.empty()) best = &d.limits.front();
  return best;
}

void set_duration(int64_t ms, google::protobuf::Duration* out) {
  if (ms < 0) ms = 0;
  out->set_seconds(ms / 1000);
  out->set_nanos(static_cast<int32_t>((ms % 1000) * 1'000'000));
}

// Upstream's `replaces` and `quota_mode` (envoy domains, docs/envoy.md): the limit each
// descriptor reaches by the domain's tree (a descriptor with its own limit reaches none of the
// config's); a limit named in another reached limit's `replaces` is not checked at all.
void mark_replaced(const RateLimitRequest& req, const rules::Policy& policy, Plan& out) {
  const int n = req.descriptors_size();
  out.reached.assign(static_cast<size_t>(n), nullptr);
  out.replacing.clear();
  for (int i = 0; i < n; ++i) {
    const auto& d = req.descriptors(i);
    if (d.has_limit()) continue;
    out.walk.clear();
    for (const auto& en : d.entries())
      out.walk.push_back(rules::Descriptor{en.key(), en.value()});
    bool unlimited = false;
    const rules::Rule* r = policy.envoy_rule(req.domain(), out.walk, unlimited);
    if (r == nullptr) continue;
    out.reached[static_cast<size_t>(i)] = r;
    out.quota_mode[static_cast<size_t>(i)] = r->quota_mode;
    for (const std::string& name : r->replaces)
      out.replacing.push_back(name);
  }
  for (int i = 0; i < n; ++i) {
    const rules::Rule* r = out.reached[static_cast<size_t>(i)];
    if (r == nullptr || r->limits.empty() || r->limits.front().name.empty()) continue;
    const std::string& name = r->limits.front().name;
    if (std::find(out.replacing.begin(), out.replacing.end(), name) != out.replacing.end()) {
      out.kind[static_cast<size_t>(i)] = Plan::Kind::kReplaced;
    }
  }
}

}  // namespace

void Plan::clear() {
  kind.clear();
  check.clear();
  quota_mode.clear();
  entries.clear();
  checks.clear();
  walk.clear();
  reached.clear();
  replacing.clear();
}

Unit unit_of(int64_t window_ms) {
  switch (window_ms) {
    case kSecond:
      return RateLimitResponse::RateLimit::SECOND;
    case 60 * kSecond:
      return RateLimitResponse::RateLimit::MINUTE;
    case 3'600 * kSecond:
      return RateLimitResponse::RateLimit::HOUR;
    case kDay:
      return RateLimitResponse::RateLimit::DAY;
    case 7 * kDay:
      return RateLimitResponse::RateLimit::WEEK;
    case 30 * kDay:
      return RateLimitResponse::RateLimit::MONTH;
    case 365 * kDay:
      return RateLimitResponse::RateLimit::YEAR;
    default:
      return RateLimitResponse::RateLimit::UNKNOWN;
  }
}

PlanError plan_request(const RateLimitRequest& req, const rules::Policy* policy,
                       const RlsOptions& options, Plan& out) {
  out.clear();
  // envoyproxy/ratelimit's own words for these two.
  if (req.domain().empty()) {
    return refuse(Refusal::kInvalidArgument, "rate limit domain must not be empty");
  }
  const int n = req.descriptors_size();
  if (n == 0) {
    return refuse(Refusal::kInvalidArgument, "rate limit descriptor list must not be empty");
  }
  if (static_cast<size_t>(n) > options.max_descriptors) {
    return refuse(Refusal::kInvalidArgument, std::to_string(n) +
                                                 " descriptors in one request, at most " +
                                                 std::to_string(options.max_descriptors));
  }
  const rules::InputLimits bounds =
      policy != nullptr ? policy->input_limits() : rules::InputLimits{};
  if (req.domain().size() > bounds.max_entry_bytes) {
    return refuse(Refusal::kInvalidArgument, "domain of " + std::to_string(req.domain().size()) +
                                                 " bytes, at most " +
                                                 std::to_string(bounds.max_entry_bytes));
  }
  const uint64_t request_hits = req.hits_addend() == 0 ? 1 : req.hits_addend();

  size_t total_entries = 0;
  for (int i = 0; i < n; ++i) {
    const auto& d = req.descriptors(i);
    const std::string at = "descriptor " + std::to_string(i) + ": ";
    if (d.entries_size() == 0) return refuse(Refusal::kInvalidArgument, at + "no entries");
    if (static_cast<size_t>(d.entries_size()) > bounds.max_descriptors) {
      return refuse(Refusal::kInvalidArgument, at + std::to_string(d.entries_size()) +
                                                   " entries, at most " +
                                                   std::to_string(bounds.max_descriptors));
    }
    for (int e = 0; e < d.entries_size(); ++e) {
      const auto& en = d.entries(e);
      if (en.key().empty()) {
        return refuse(Refusal::kInvalidArgument,
                      at + "entry " + std::to_string(e) + " has an empty key");
      }
      if (en.key().size() > bounds.max_entry_bytes || en.value().size() > bounds.max_entry_bytes) {
        return refuse(Refusal::kInvalidArgument,
                      at + "entry " + std::to_string(e) + " is longer than " +
                          std::to_string(bounds.max_entry_bytes) + " bytes");
      }
    }
    const uint64_t hits = d.has_hits_addend() ? d.hits_addend().value() : request_hits;
    if (hits > bounds.max_hits) {
      return refuse(Refusal::kInvalidArgument, at + "hits_addend " + std::to_string(hits) +
                                                   " is over " + std::to_string(bounds.max_hits));
    }
    if (d.has_limit() && window_of(d.limit().unit()) == 0) {
      return refuse(Refusal::kInvalidArgument, at + "limit override with unit " +
                                                   std::to_string(d.limit().unit()) +
                                                   ", not one of SECOND..WEEK");
    }
    total_entries += static_cast<size_t>(d.entries_size());
  }

  out.kind.assign(static_cast<size_t>(n), Plan::Kind::kCheck);
  out.check.assign(static_cast<size_t>(n), 0);
  out.quota_mode.assign(static_cast<size_t>(n), false);
  if (policy != nullptr && policy->domain_has_replaces(req.domain())) {
    mark_replaced(req, *policy, out);
  }

  // Entries first, all at once, so the checks' spans into them stay valid.
  out.entries.reserve(total_entries);
  for (int i = 0; i < n; ++i) {
    if (out.kind[static_cast<size_t>(i)] != Plan::Kind::kCheck) continue;
    const auto& d = req.descriptors(i);
    const size_t first = out.entries.size();
    for (const auto& en : d.entries())
      out.entries.push_back(wire::Entry{en.key(), en.value()});
    wire::Check c;
    c.domain = req.domain();
    c.entries = std::span<const wire::Entry>(out.entries.data() + first,
                                             static_cast<size_t>(d.entries_size()));
    c.hits = static_cast<int64_t>(d.has_hits_addend() ? d.hits_addend().value() : request_hits);
    if (d.has_limit()) {  // upstream: the caller's limit, in place of the configured one
      c.has_limit_override = true;
      c.limit_override_requests = d.limit().requests_per_unit();
      c.limit_override_window_ms = window_of(d.limit().unit());
    }
    out.check[static_cast<size_t>(i)] = static_cast<uint32_t>(out.checks.size());
    out.checks.push_back(c);
  }
  return {};
}

namespace {

wire::LimitStatus owned(const wire::LimitStatus& l) {
  return l;
}

wire::LimitStatus owned(const wire::LimitView& l) {
  wire::LimitStatus s;
  wire::assign(s, l);
  return s;
}

// fill_response over the decisions of plan.checks (null: no check was sent).
template <typename D>
sluice::Status fill(const Plan& plan, std::span<const D>* decisions, bool rate_limit_headers,
                    RateLimitResponse& resp) {
  resp.Clear();
  if (decisions != nullptr && decisions->size() != plan.checks.size()) {
    return sluice::Status::Unavailable("the node answered " + std::to_string(decisions->size()) +
                                       " of " + std::to_string(plan.checks.size()) + " checks");
  }
  bool over = false;
  size_t quota_total = 0;
  size_t quota_over = 0;
  std::vector<wire::LimitStatus> all_limits;  // for the headers
  for (size_t i = 0; i < plan.kind.size(); ++i) {
    Status* s = resp.add_statuses();
    s->set_code(RateLimitResponse::OK);
    if (plan.kind[i] == Plan::Kind::kUnlimited) {
      s->set_limit_remaining(kMaxU32);
      continue;
    }
    if (plan.kind[i] == Plan::Kind::kReplaced) continue;
    if (decisions == nullptr)
      return sluice::Status::Unavailable("no answer for descriptor " + std::to_string(i));
    const D& d = (*decisions)[plan.check[i]];
    switch (d.code) {
      case wire::Code::kOk:
        break;
      // envoyproxy/ratelimit answers an unknown domain with no limit; no room: allowed, uncounted.
      case wire::Code::kUnknownDomain:
      case wire::Code::kNoRoom:
        continue;
      default:
        return sluice::Status::Unavailable("descriptor " + std::to_string(i) + ": " +
                                           std::string(wire::to_string(d.code)));
    }
    if (d.allowlisted) {
      s->set_limit_remaining(kMaxU32);
      continue;
    }
    const auto* l = binding_limit(d);
    if (l == nullptr) continue;  // no rule applies: OK, no current limit
    const bool denied = !d.allowed;
    if (plan.quota_mode[i]) {
      ++quota_total;
      if (denied) ++quota_over;
    } else if (denied) {
      over = true;
    }
    s->set_code(denied ? RateLimitResponse::OVER_LIMIT : RateLimitResponse::OK);
    auto* cl = s->mutable_current_limit();
    cl->set_name(l->name.data(), l->name.size());
    cl->set_requests_per_unit(clamp_u32(l->limit));
    cl->set_unit(unit_of(l->window_ms));
    s->set_limit_remaining(denied ? 0 : clamp_u32(l->remaining));
    // Over the limit: how long until a request would be admitted (a sliding window frees budget
    // as hits leave it; no fixed reset). Else until the window holds none of the counted hits.
    const bool wait = denied && l->retry_after_ms >= 0;
    set_duration(wait ? l->retry_after_ms : l->reset_ms, s->mutable_duration_until_reset());
    if (rate_limit_headers) {
      for (const auto& limit : d.limits)
        all_limits.push_back(owned(limit));
    }
  }
  // As upstream: OVER_LIMIT when a descriptor is over, or when every quota-mode one is.
  if (quota_total > 0 && quota_over == quota_total) over = true;
  resp.set_overall_code(over ? RateLimitResponse::OVER_LIMIT : RateLimitResponse::OK);
  if (rate_limit_headers) {
    for (auto& [k, v] : wire::ratelimit_headers(all_limits, over).headers) {
      auto* h = resp.add_response_headers_to_add();
      h->set_key(k);
      h->set_value(v);
    }
  }
  return {};
}

}  // namespace

sluice::Status fill_response(const Plan& plan, const wire::Answer* answer, bool rate_limit_headers,
                             RateLimitResponse& resp) {
  if (answer != nullptr && answer->code != wire::Code::kOk) {
    resp.Clear();
    return sluice::Status::Unavailable("the node answered " +
                                       std::string(wire::to_string(answer->code)));
  }
  std::span<const wire::Decision> decisions;
  if (answer != nullptr) decisions = answer->decisions;
  return fill(plan, answer != nullptr ? &decisions : nullptr, rate_limit_headers, resp);
}

sluice::Status fill_response(const Plan& plan, std::span<const wire::DecisionView> decisions,
                             bool rate_limit_headers, RateLimitResponse& resp) {
  return fill(plan, &decisions, rate_limit_headers, resp);
}

}  // namespace sluice::rls
