// CheckHandler: decode a request, decide with the engine, encode the answer. No Asio here.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "node/node.h"

namespace sluice::node {
namespace {

constexpr size_t kForwardTagBytes = 32;  // HMAC-SHA256 (cluster/peer_codec.h)

wire::Code to_wire(rules::CheckError e) {
  switch (e) {
    case rules::CheckError::kNone:
      return wire::Code::kOk;
    case rules::CheckError::kEmptyDomain:
      return wire::Code::kEmptyDomain;
    case rules::CheckError::kUnknownDomain:
      return wire::Code::kUnknownDomain;
    case rules::CheckError::kTooManyDescriptors:
      return wire::Code::kTooManyEntries;
    case rules::CheckError::kEntryTooLong:
      return wire::Code::kEntryTooLong;
    case rules::CheckError::kEmptyDescriptorKey:
      return wire::Code::kEmptyEntryKey;
    case rules::CheckError::kDuplicateDescriptor:
      return wire::Code::kDuplicateEntry;
    case rules::CheckError::kHitsTooLarge:
      return wire::Code::kHitsTooLarge;
    case rules::CheckError::kBadLimitOverride:
      return wire::Code::kMalformed;
    case rules::CheckError::kLeaseUnknown:
      return wire::Code::kLeaseUnknown;
    case rules::CheckError::kLeaseExpired:
      return wire::Code::kLeaseExpired;
    case rules::CheckError::kLeaseReleased:
      return wire::Code::kLeaseReleased;
  }
  return wire::Code::kMalformed;
}

wire::Mode to_wire(rules::Mode m) {
  switch (m) {
    case rules::Mode::kEnforce:
      return wire::Mode::kEnforce;
    case rules::Mode::kDryRun:
      return wire::Mode::kDryRun;
    case rules::Mode::kShadow:
      return wire::Mode::kShadow;
  }
  return wire::Mode::kEnforce;
}

}  // namespace

// Reused per worker: after the first few requests nothing here allocates.
struct CheckHandler::Scratch {
  wire::RequestDecoder decoder;
  std::vector<rules::CheckRequest> requests;
  std::vector<rules::Descriptor> descriptors;
  std::vector<uint32_t> engine_index;  // per wire check: index into requests, or UINT32_MAX
  engine::BatchResult result;
  std::vector<wire::LimitView> limits;
  std::vector<wire::DecisionView> decisions;
  std::vector<CheckRouter::Route> routes;  // per wire check: where it is decided
  wire::RequestDecoder credit_decoder;     // a redirected part, when its answer comes
  std::vector<rules::Descriptor> credit_descriptors;
  std::vector<wire::Check> part_checks;  // one part of a split request
};

CheckHandler::CheckHandler(engine::Engine& engine)
    : engine_(engine), s_(std::make_unique<Scratch>()) {}

CheckHandler::~CheckHandler() = default;

bool CheckHandler::handle(std::span<const uint8_t> request, size_t max_answer_bytes, int64_t now_ms,
                          std::vector<uint8_t>& out, engine::Fallback fallback) {
  static thread_local ForwardPlan unused;
  fallback_ = fallback;
  const bool answered =
      handle_routed(request, max_answer_bytes, now_ms, out, nullptr, 0, unused) == Outcome::kAnswer;
  fallback_ = {};
  return answered;
}

CheckHandler::Outcome CheckHandler::handle_routed(std::span<const uint8_t> request,
                                                  size_t max_answer_bytes, int64_t now_ms,
                                                  std::vector<uint8_t>& out, CheckRouter* router,
                                                  uint64_t first_id, ForwardPlan& plan) {
  Scratch& s = *s_;
  const auto answered = [max_answer_bytes](size_t n) {
    // A tiny request must not draw a larger answer (no amplification): drop it instead.
    return max_answer_bytes == 0 || n <= max_answer_bytes ? Outcome::kAnswer : Outcome::kDrop;
  };
  // A part forwarded by another node ends with the cluster's tag: a single-segment message of
  // exactly the rest of the datagram (read from its segment table) is checked, and stripped.
  bool trusted = false;
  if (verify_forward_ && request.size() > 8 + kForwardTagBytes) {
    uint32_t segments_minus_one = 0, words = 0;
    std::memcpy(&segments_minus_one, request.data(), 4);
    std::memcpy(&words, request.data() + 4, 4);
    const size_t message = 8 + static_cast<size_t>(words) * 8;
    if (segments_minus_one == 0 && message + kForwardTagBytes == request.size() &&
        verify_forward_(request)) {
      request = request.first(message);
      trusted = true;
    }
  }
  const wire::Code code = s.decoder.decode(request);
  last_code_ = code;
  if (s.decoder.forwarded() && !trusted && code == wire::Code::kOk) {
    untrusted_forwards_.fetch_add(1, std::memory_order_relaxed);
  }
  if (code != wire::Code::kOk) {
    // Without an id the sender could not match an answer: drop (the caller counts it).
    if (s.decoder.id() == 0) return Outcome::kDrop;
    return answered(wire::encode_answer(s.decoder.id(), code, {}, max_answer_bytes, out));
  }

  const auto checks = s.decoder.checks();
  size_t total_entries = 0;
  for (const auto& c : checks)
    total_entries += c.entries.size();
  s.requests.clear();
  s.descriptors.clear();
  s.engine_index.clear();
  s.descriptors.reserve(total_entries);  // spans below point into it: no reallocation after
  for (size_t i = 0; i < checks.size(); ++i) {
    if (s.decoder.check_code(i) != wire::Code::kOk) {
      s.engine_index.push_back(UINT32_MAX);
      continue;
    }
    const wire::Check& c = checks[i];
    const size_t first = s.descriptors.size();
    for (const auto& e : c.entries)
      s.descriptors.push_back({e.key, e.value});
    s.engine_index.push_back(static_cast<uint32_t>(s.requests.size()));
    rules::CheckRequest& req = s.requests.emplace_back(rules::CheckRequest{
        c.domain,
        std::span<const rules::Descriptor>(s.descriptors.data() + first, c.entries.size()),
        static_cast<uint64_t>(c.hits)});
    req.has_limit_override = c.has_limit_override;
    req.limit_override_requests = c.limit_override_requests;
    req.limit_override_window_ms = c.limit_override_window_ms;
    req.is_release = c.is_release;
    req.release = c.release;
  }
  // A forwarded request is decided here, unless this node has just joined and the owner before
  // it still decides some of its keys; a redirected one is always decided here.
  if (router != nullptr && (!trusted || (!s.decoder.redirected() && router->routes_forwarded())) &&
      split(router, now_ms, first_id, plan, trusted)) {
    return Outcome::kForward;
  }
  engine_.check(s.requests, now_ms, s.result, fallback_);

  s.limits.clear();
  s.limits.reserve(s.result.limits.size());
  for (const auto& l : s.result.limits) {
    s.limits.push_back({l.limit->name, l.requests, rules::reported_window_ms(*l.limit), l.remaining,
                        l.reset_ms, l.retry_after_ms == window::kNever ? -1 : l.retry_after_ms,
                        to_wire(l.mode), l.exceeded});
  }
  s.decisions.clear();
  for (size_t i = 0; i < checks.size(); ++i) {
    wire::DecisionView dv;
    if (s.engine_index[i] == UINT32_MAX) {
      dv.code = s.decoder.check_code(i);
    } else {
      const engine::Decision& d = s.result.decisions[s.engine_index[i]];
      dv.code = d.no_room ? wire::Code::kNoRoom : to_wire(d.error);
      dv.allowed = d.allowed;
      dv.would_deny = d.would_deny;
      dv.shadow = d.shadow;
      dv.allowlisted = d.allowlisted;
      dv.lease = d.lease;
      dv.limits = std::span<const wire::LimitView>(s.limits.data() + d.first_limit, d.num_limits);
    }
    s.decisions.push_back(dv);
  }
  return answered(
      wire::encode_answer(s.decoder.id(), wire::Code::kOk, s.decisions, max_answer_bytes, out));
}

bool CheckHandler::split(CheckRouter* router, int64_t now_ms, uint64_t first_id, ForwardPlan& plan,
                         bool forwarded) {
  Scratch& s = *s_;
  const auto checks = s.decoder.checks();
  s.routes.assign(checks.size(), CheckRouter::Route{});
  bool remote = false;
  for (size_t i = 0; i < checks.size(); ++i) {
    if (s.engine_index[i] == UINT32_MAX) continue;  // refused here: answered here
    const auto key = engine_.owner_routing_key(s.requests[s.engine_index[i]], now_ms);
    if (!key) continue;
    s.routes[i] = router->route(*key, forwarded);
    remote = remote || s.routes[i].node != 0 || s.routes[i].fallback || s.routes[i].takeover;
  }
  if (!remote) return false;
  plan.client_id = s.decoder.id();
  plan.num_checks = checks.size();
  plan.used = 0;
  plan.refused.clear();
  for (size_t i = 0; i < checks.size(); ++i) {
    if (s.engine_index[i] == UINT32_MAX) {  // refused by the decoder: answered with its code
      plan.refused.emplace_back(static_cast<uint32_t>(i), s.decoder.check_code(i));
      continue;
    }
    ForwardPlan::Part* part = nullptr;
    const CheckRouter::Route& r = s.routes[i];
    for (size_t p = 0; p < plan.used; ++p) {
      const ForwardPlan::Part& q = plan.parts[p];
      if (q.owner == r.node && q.fallback == r.fallback && q.takeover == r.takeover) {
        part = &plan.parts[p];
      }
    }
    if (part == nullptr) {
      if (plan.parts.size() <= plan.used) plan.parts.emplace_back();
      part = &plan.parts[plan.used++];
      part->owner = r.node;
      part->fallback = r.fallback;
      part->takeover = r.takeover;
      part->fallback_since_ms = r.fallback_since_ms;
      part->redirected = false;
      part->checks.clear();
    }
    part->fallback_since_ms = std::max(part->fallback_since_ms, r.fallback_since_ms);
    part->redirected = part->redirected || s.routes[i].redirect;
    part->checks.push_back(static_cast<uint32_t>(i));
  }
  for (size_t p = 0; p < plan.used; ++p) {
    ForwardPlan::Part& part = plan.parts[p];
    s.part_checks.clear();
    for (uint32_t i : part.checks)
      s.part_checks.push_back(checks[i]);
    // Room for the owner's answer: it never answers larger than the request it got.
    const size_t pad = std::min<size_t>(wire::kMaxDatagramBytes, 512 + 256 * part.checks.size());
    wire::encode_request(first_id + p, s.part_checks, pad, part.request, /*forwarded=*/true,
                         part.redirected);
  }
  return true;
}

void CheckHandler::credit(std::span<const uint8_t> part, const wire::Answer& answer, uint16_t node,
                          int64_t now_ms) {
  Scratch& s = *s_;
  if (part.size() > kForwardTagBytes) part = part.first(part.size() - kForwardTagBytes);
  if (s.credit_decoder.decode(part) != wire::Code::kOk) return;
  const auto checks = s.credit_decoder.checks();
  for (size_t i = 0; i < checks.size() && i < answer.decisions.size(); ++i) {
    const wire::Decision& d = answer.decisions[i];
    if (d.code != wire::Code::kOk || !d.allowed || d.allowlisted ||
        s.credit_decoder.check_code(i) != wire::Code::kOk) {
      continue;
    }
    s.credit_descriptors.clear();
    for (const auto& e : checks[i].entries)
      s.credit_descriptors.push_back({e.key, e.value});
    rules::CheckRequest req{checks[i].domain, s.credit_descriptors,
                            static_cast<uint64_t>(checks[i].hits)};
    req.has_limit_override = checks[i].has_limit_override;
    req.limit_override_requests = checks[i].limit_override_requests;
    req.limit_override_window_ms = checks[i].limit_override_window_ms;
    req.is_release = checks[i].is_release;
    req.release = checks[i].release;
    engine_.credit(req, node, now_ms);
  }
}

}  // namespace sluice::node
