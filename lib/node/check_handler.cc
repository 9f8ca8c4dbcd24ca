// CheckHandler: decode a request, decide with the engine, encode the answer. No Asio here.
#include "node/check_handler.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace sluice::node {

// A slice's uses cross the wire as they are kept (engine::SliceReturn::uses).
static_assert(engine::kMaxSliceUses == wire::kMaxSliceUses);

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

wire::LimitView to_view(const engine::LimitResult& l) {
  return {l.limit->name,   l.requests, rules::reported_window_ms(*l.limit),
          l.remaining,     l.reset_ms, l.retry_after_ms == window::kNever ? -1 : l.retry_after_ms,
          to_wire(l.mode), l.exceeded, l.reset_ns_short};
}

// A decoded check as the engine's request over `descs` (its entries, which must outlive it). A
// check with a cell limit gets it in `cell`, which must outlive the request too.
rules::CheckRequest request_of(const wire::Check& c, std::span<const rules::Descriptor> descs,
                               rules::CellCheck& cell) {
  rules::CheckRequest req{c.domain, descs, static_cast<uint64_t>(c.hits)};
  req.has_limit_override = c.has_limit_override;
  req.limit_override_requests = c.limit_override_requests;
  req.limit_override_window_ms = c.limit_override_window_ms;
  req.is_release = c.is_release;
  req.release = c.release;
  if (c.has_cell_limit) {
    cell = {c.cell_interval_ns, c.cell_limit, c.cell_quantity, c.cell_reset, 0};
    req.cell = &cell;
  }
  return req;
}

// The same into `descs` (cleared first).
rules::CheckRequest to_request(const wire::Check& c, std::vector<rules::Descriptor>& descs,
                               rules::CellCheck& cell) {
  descs.clear();
  for (const auto& e : c.entries)
    descs.push_back({e.key, e.value});
  return request_of(c, descs, cell);
}

// An engine decision as an answer's decision (owning its strings).
wire::Decision to_answer(const engine::Decision& d, std::span<const engine::LimitResult> limits) {
  wire::Decision w;
  w.code = d.no_room ? wire::Code::kNoRoom : to_wire(d.error);
  w.allowed = d.allowed;
  w.would_deny = d.would_deny;
  w.shadow = d.shadow;
  w.allowlisted = d.allowlisted;
  w.lease = d.lease;
  w.limits.resize(limits.size());
  for (size_t i = 0; i < limits.size(); ++i)
    wire::assign(w.limits[i], to_view(limits[i]));
  return w;
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
  wire::RequestDecoder credit_decoder;     // a part, when its answer comes (credit, settle_slices)
  std::vector<rules::Descriptor> credit_descriptors;
  std::vector<rules::CellCheck> cells;  // per wire check: its cell limit, if any
  rules::CellCheck credit_cell;
  std::vector<wire::Check> part_checks;  // one part of a split request
  // Leased quotas: per engine request, decided from slices (index into slice_decisions, or
  // UINT32_MAX); those decisions and their limits (owned by slice_policy); per wire check, the
  // hits to ask the owner for; the requests the engine decides after them.
  std::vector<uint32_t> sliced;
  size_t num_sliced = 0;
  engine::BatchResult slice_result;
  std::shared_ptr<const rules::Policy> slice_policy;
  std::vector<engine::Decision> slice_decisions;
  std::vector<engine::LimitResult> slice_limits;
  std::vector<uint32_t> wants;
  std::vector<uint32_t> part_wants;
  std::vector<rules::CheckRequest> rest;
  std::vector<uint32_t> rest_index;  // per engine request: its index in rest
  std::vector<engine::SliceReturn> returns;
  std::vector<wire::SliceGrant> grants;
  std::vector<wire::Code> codes;  // per wire check: kOk, or why the engine must not see it
};

CheckHandler::CheckHandler(engine::Engine& engine)
    : engine_(engine), s_(std::make_unique<Scratch>()) {}

CheckHandler::~CheckHandler() = default;

bool CheckHandler::handle(std::span<const uint8_t> request, size_t max_answer_bytes, int64_t now_ms,
                          std::vector<uint8_t>& out, engine::StandIn fallback) {
  static thread_local ForwardPlan unused;
  fallback_ = fallback;
  const bool answered =
      handle_routed(request, max_answer_bytes, now_ms, out, nullptr, 0, unused) == Outcome::kAnswer;
  fallback_ = {};
  return answered;
}

std::span<const wire::DecisionView> CheckHandler::decide(std::span<const wire::Check> checks,
                                                         int64_t now_ms) {
  Scratch& s = *s_;
  last_code_ = checks.size() > wire::kMaxChecks ? wire::Code::kTooManyChecks : wire::Code::kOk;
  s.decisions.clear();
  if (last_code_ != wire::Code::kOk) return {};
  s.codes.clear();
  for (const wire::Check& c : checks)
    s.codes.push_back(wire::check_code(c));
  to_requests(checks);
  s.sliced.assign(s.requests.size(), UINT32_MAX);
  s.num_sliced = 0;
  decide_requests(checks.size(), now_ms);
  return s.decisions;
}

void CheckHandler::to_requests(std::span<const wire::Check> checks) {
  Scratch& s = *s_;
  size_t total_entries = 0;
  for (const auto& c : checks)
    total_entries += c.entries.size();
  s.requests.clear();
  s.descriptors.clear();
  s.engine_index.clear();
  s.descriptors.reserve(total_entries);  // spans below point into it: no reallocation after
  s.cells.resize(checks.size());         // requests point into it too
  for (size_t i = 0; i < checks.size(); ++i) {
    if (s.codes[i] != wire::Code::kOk) {
      s.engine_index.push_back(UINT32_MAX);
      continue;
    }
    const wire::Check& c = checks[i];
    const size_t first = s.descriptors.size();
    for (const auto& e : c.entries)
      s.descriptors.push_back({e.key, e.value});
    s.engine_index.push_back(static_cast<uint32_t>(s.requests.size()));
    s.requests.push_back(request_of(
        c, std::span<const rules::Descriptor>(s.descriptors.data() + first, c.entries.size()),
        s.cells[i]));
  }
}

void CheckHandler::decide_requests(size_t num_checks, int64_t now_ms) {
  Scratch& s = *s_;
  // Requests decided from slices (split) are not decided again.
  std::span<const rules::CheckRequest> batch = s.requests;
  if (s.num_sliced != 0) {
    s.rest.clear();
    s.rest_index.assign(s.requests.size(), UINT32_MAX);
    for (size_t j = 0; j < s.requests.size(); ++j) {
      if (s.sliced[j] != UINT32_MAX) continue;
      s.rest_index[j] = static_cast<uint32_t>(s.rest.size());
      s.rest.push_back(s.requests[j]);
    }
    batch = s.rest;
  }
  engine_.check(batch, now_ms, s.result, fallback_);

  s.limits.clear();
  s.limits.reserve(s.result.limits.size() + s.slice_limits.size());
  for (const auto& l : s.result.limits)
    s.limits.push_back(to_view(l));
  const size_t slice_limits_at = s.limits.size();
  if (s.num_sliced != 0) {
    for (const auto& l : s.slice_limits)
      s.limits.push_back(to_view(l));
  }
  s.decisions.clear();
  s.grants.clear();
  for (size_t i = 0; i < num_checks; ++i) {
    wire::DecisionView dv;
    if (s.engine_index[i] == UINT32_MAX) {
      dv.code = s.codes[i];
    } else {
      const uint32_t j = s.engine_index[i];
      const bool sliced = s.sliced[j] != UINT32_MAX;
      const engine::Decision& d = sliced              ? s.slice_decisions[s.sliced[j]]
                                  : s.num_sliced != 0 ? s.result.decisions[s.rest_index[j]]
                                                      : s.result.decisions[j];
      const size_t limits_at = sliced ? slice_limits_at : 0;
      if (d.slice_hits != 0) {
        s.grants.push_back({static_cast<uint32_t>(i), d.slice_hits, d.slice_ttl_ms, d.slice_id});
      }
      dv.code = d.no_room ? wire::Code::kNoRoom : to_wire(d.error);
      dv.allowed = d.allowed;
      dv.would_deny = d.would_deny;
      dv.shadow = d.shadow;
      dv.allowlisted = d.allowlisted;
      dv.lease = d.lease;
      dv.limits = std::span<const wire::LimitView>(s.limits.data() + limits_at + d.first_limit,
                                                   d.num_limits);
    }
    s.decisions.push_back(dv);
  }
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
  s.codes.clear();
  for (size_t i = 0; i < checks.size(); ++i)
    s.codes.push_back(s.decoder.check_code(i));
  to_requests(checks);
  // Leased quotas: another node asks for slices of these checks' lease limits (its tag vouches
  // for the node id).
  if (trusted) {
    for (size_t i = 0; i < checks.size(); ++i) {
      const uint32_t j = s.engine_index[i];
      if (j != UINT32_MAX && i < s.decoder.slice_wants().size()) {
        s.requests[j].slice_want = s.decoder.slice_wants()[i];
        s.requests[j].slice_for = s.decoder.slice_node();
      }
    }
  }
  if (trusted && !s.decoder.slice_returns().empty()) {
    s.returns.clear();
    for (const wire::SliceReturn& r : s.decoder.slice_returns())
      s.returns.push_back({r.counter, r.id, r.used, 0, {r.uses.begin(), r.uses.end()}, r.step_ms});
    engine_.return_slices(s.decoder.slice_node(), s.returns, now_ms);
  }
  s.sliced.assign(s.requests.size(), UINT32_MAX);
  s.num_sliced = 0;
  if (router != nullptr) {
    plan.decided.clear();
    plan.prefetch.clear();
  }
  // A forwarded request is decided here, unless this node has just joined and the owner before
  // it still decides some of its keys; a redirected one is always decided here (as a takeover
  // while the owner that redirected it is a new life of its node: split).
  if (router != nullptr &&
      (!trusted ||
       ((!s.decoder.redirected() || router->fences_redirects()) && router->routes_forwarded())) &&
      split(router, now_ms, first_id, plan, trusted)) {
    return Outcome::kForward;
  }
  decide_requests(checks.size(), now_ms);
  return answered(wire::encode_answer(s.decoder.id(), wire::Code::kOk, s.decisions,
                                      max_answer_bytes, out, s.grants));
}

bool CheckHandler::decide_from_slices(size_t i, size_t j, uint16_t owner, int64_t now_ms,
                                      ForwardPlan& plan) {
  Scratch& s = *s_;
  engine::StandIn f;
  f.slice_owner = owner;
  engine_.check(std::span<const rules::CheckRequest>(&s.requests[j], 1), now_ms, s.slice_result, f);
  const engine::Decision& d = s.slice_result.decisions[0];
  s.wants[i] = d.slice_want;
  if (d.needs_owner) return false;
  if (s.num_sliced == 0) {
    s.slice_decisions.clear();
    s.slice_limits.clear();
  }
  s.slice_policy = s.slice_result.policy;  // the limits' names live there
  engine::Decision& kept = s.slice_decisions.emplace_back(d);
  kept.first_limit = static_cast<uint32_t>(s.slice_limits.size());
  const auto limits = s.slice_result.limits_of(d);
  s.slice_limits.insert(s.slice_limits.end(), limits.begin(), limits.end());
  s.sliced[j] = static_cast<uint32_t>(s.slice_decisions.size() - 1);
  ++s.num_sliced;
  if (d.slice_want != 0) plan.prefetch.push_back({static_cast<uint32_t>(i), owner, d.slice_want});
  return true;
}

bool CheckHandler::split(CheckRouter* router, int64_t now_ms, uint64_t first_id, ForwardPlan& plan,
                         bool forwarded) {
  Scratch& s = *s_;
  const auto checks = s.decoder.checks();
  s.routes.assign(checks.size(), CheckRouter::Route{});
  s.wants.assign(checks.size(), 0);
  bool remote = false;
  for (size_t i = 0; i < checks.size(); ++i) {
    if (s.engine_index[i] == UINT32_MAX) continue;  // refused here: answered here
    const uint32_t j = s.engine_index[i];
    bool lease = false;
    const auto key = engine_.owner_routing_key(s.requests[j], now_ms, &lease);
    if (!key) continue;
    s.routes[i] = router->route(*key, forwarded);
    if (s.routes[i].node != 0 && s.decoder.redirected()) s.routes[i] = {};  // never sent on
    const CheckRouter::Route& r = s.routes[i];
    // Leased quotas: a client's check of a key another node owns, in reach, is decided here
    // when the slice that node granted covers it.
    if (lease && !forwarded && r.node != 0 && !r.redirect && !r.fallback && !r.takeover &&
        !s.requests[j].is_release && decide_from_slices(i, j, r.node, now_ms, plan)) {
      s.routes[i] = CheckRouter::Route{};
      continue;
    }
    remote = remote || r.node != 0 || r.fallback || r.takeover;
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
    if (const uint32_t at = s.sliced[s.engine_index[i]]; at != UINT32_MAX) {
      const engine::Decision& d = s.slice_decisions[at];
      plan.decided.emplace_back(static_cast<uint32_t>(i),
                                to_answer(d, std::span<const engine::LimitResult>(s.slice_limits)
                                                 .subspan(d.first_limit, d.num_limits)));
      continue;
    }
    ForwardPlan::Part* part = nullptr;
    const CheckRouter::Route& r = s.routes[i];
    for (size_t p = 0; p < plan.used; ++p) {
      const ForwardPlan::Part& q = plan.parts[p];
      if (q.owner == r.node && q.fallback == r.fallback && q.takeover == r.takeover &&
          q.takeover_cap_ms == r.takeover_cap_ms) {
        part = &plan.parts[p];
      }
    }
    if (part == nullptr) {
      if (plan.parts.size() <= plan.used) plan.parts.emplace_back();
      part = &plan.parts[plan.used++];
      part->owner = r.node;
      part->fallback = r.fallback;
      part->takeover = r.takeover;
      part->takeover_cap_ms = r.takeover_cap_ms;
      part->fallback_since_ms = r.fallback_since_ms;
      part->redirected = false;
      part->asks_slices = false;
      part->checks.clear();
    }
    part->asks_slices = part->asks_slices || s.wants[i] != 0;
    part->fallback_since_ms = std::max(part->fallback_since_ms, r.fallback_since_ms);
    part->redirected = part->redirected || s.routes[i].redirect;
    part->checks.push_back(static_cast<uint32_t>(i));
  }
  for (size_t p = 0; p < plan.used; ++p) {
    ForwardPlan::Part& part = plan.parts[p];
    s.part_checks.clear();
    s.part_wants.clear();
    for (uint32_t i : part.checks) {
      s.part_checks.push_back(checks[i]);
      s.part_wants.push_back(s.wants[i]);
    }
    // Room for the owner's answer: it never answers larger than the request it got (a slice
    // granted takes 32 bytes more per check).
    const size_t pad = std::min<size_t>(wire::kMaxDatagramBytes, 512 + 288 * part.checks.size());
    const wire::SliceAsk ask{engine_.node_id(), s.part_wants, {}};
    wire::encode_request(first_id + p, s.part_checks, pad, part.request, /*forwarded=*/true,
                         part.redirected, part.asks_slices ? &ask : nullptr);
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
    engine_.credit(to_request(checks[i], s.credit_descriptors, s.credit_cell), node, now_ms);
  }
}

void CheckHandler::settle_slices(std::span<const uint8_t> part, const wire::Answer& answer,
                                 uint16_t owner, int64_t sent_ms, int64_t now_ms,
                                 std::vector<engine::SliceReturn>& returns) {
  Scratch& s = *s_;
  if (part.size() > kForwardTagBytes) part = part.first(part.size() - kForwardTagBytes);
  if (s.credit_decoder.decode(part) != wire::Code::kOk) return;
  const auto checks = s.credit_decoder.checks();
  const auto wants = s.credit_decoder.slice_wants();
  for (size_t i = 0; i < checks.size() && i < wants.size() && i < answer.decisions.size(); ++i) {
    if (wants[i] == 0 || s.credit_decoder.check_code(i) != wire::Code::kOk) continue;
    const wire::Decision& d = answer.decisions[i];
    if (d.code != wire::Code::kOk) continue;
    const wire::SliceGrant* grant = nullptr;
    for (const wire::SliceGrant& g : answer.grants) {
      if (g.check == i) grant = &g;
    }
    // Without a slice, a denial tells until when the key is spent: the longest retry_after of
    // the limits it exceeded (none known, or one that never admits: nothing noted).
    int64_t denied_until = 0;
    if (grant == nullptr) {
      if (d.allowed || answer.truncated) continue;
      int64_t wait = 0;
      for (const wire::LimitStatus& l : d.limits) {
        if (!l.exceeded) continue;
        if (l.retry_after_ms < 0) {
          wait = 0;
          break;
        }
        wait = std::max(wait, l.retry_after_ms);
      }
      if (wait == 0) continue;
      denied_until = sent_ms + wait;
    }
    const rules::CheckRequest req = to_request(checks[i], s.credit_descriptors, s.credit_cell);
    if (grant != nullptr) {
      engine_.install_slice(req, owner, grant->id, grant->hits, sent_ms, grant->ttl_ms, 0, now_ms,
                            returns);
    } else {
      engine_.install_slice(req, owner, 0, 0, sent_ms, 0, denied_until, now_ms, returns);
    }
  }
}

void CheckHandler::encode_prefetch(const ForwardPlan::Prefetch& pf, uint64_t id,
                                   std::vector<uint8_t>& out) {
  Scratch& s = *s_;
  wire::Check c = s.decoder.checks()[pf.check];
  c.hits = 0;  // asks, counts nothing
  const uint32_t want = pf.want;
  const wire::SliceAsk ask{engine_.node_id(), std::span<const uint32_t>(&want, 1), {}};
  wire::encode_request(id, std::span<const wire::Check>(&c, 1), 512, out, /*forwarded=*/true, false,
                       &ask);
}

void CheckHandler::encode_returns(std::span<const engine::SliceReturn> returns,
                                  std::vector<uint8_t>& out) {
  std::vector<wire::SliceReturn> wire_returns;
  wire_returns.reserve(returns.size());
  for (const engine::SliceReturn& r : returns)
    wire_returns.push_back({r.counter, r.id, r.used, r.uses, r.step_ms});
  const wire::SliceAsk ask{engine_.node_id(), {}, wire_returns};
  // An id no answer is matched to: the owner's empty answer is dropped.
  wire::encode_request(UINT64_MAX, {}, 0, out, /*forwarded=*/true, false, &ask);
}

}  // namespace sluice::node
