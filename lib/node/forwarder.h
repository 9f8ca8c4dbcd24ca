// Private to lib/node: cluster owner mode on a check-front worker, forwarding checks to the owner
// of their key. The routed check path's Asio part: included by routed_check.cc only.
#pragma once

#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cluster/peer_codec.h"
#include "front/check/check_front.h"
#include "node/check_handler.h"
#include "node/node_cluster.h"
#include "node/owner_routing.h"
#include "node/routed_check.h"

namespace sluice::node {

namespace asio = boost::asio;
using asio::ip::udp;

// ---- cluster owner mode: forwarding checks to the owner of their key ---------------------------
//
// A client request whose owner-mode checks belong to other nodes is split by owner
// (CheckHandler::handle_routed); each part goes, marked forwarded, to its owner's check port from
// this worker's forwarding socket, the owner decides it as it decides any request, and the
// answers are merged into one answer to the client in the client's order.
//
// Who decides a key is OwnerRouting's answer (owner_routing.h): the first of its owner and
// replicas in reach, a replica taking over (counted in sluice_forward_failovers_total), or, none
// in reach, this node by the rule's `fallback` (sluice_forward_fallbacks_total). A part whose
// owner, in reach, does not answer within forward_timeout_ms is denied here (counted the same
// way): the owner may have admitted it, and admitting it here too could count it twice; an owner
// that lets OwnerRouting::kSilentAfter parts in a row time out is not waited for (its parts are
// denied at once) for a while, or until it answers again. Everything runs on the worker's thread;
// the answer goes back to the client through the front (WorkerLoop::answer).
struct Forwarder final : CheckRouter {
  using Client = front::check::Reply;  // where the client waits for its answer
  struct Pending {
    bool busy = false;
    uint32_t generation = 0;
    Client client;
    uint64_t client_id = 0;
    size_t max_answer = 0;
    int64_t deadline_ms = 0;
    size_t outstanding = 0;
    std::vector<wire::Decision> decisions;  // per client check
    std::vector<ForwardPlan::Part> parts;
    std::vector<uint8_t> part_done;
    bool internal = false;  // a slice asked for on its own (a prefetch): no client waits
  };
  static constexpr size_t kMaxParts = 256;  // part index in the low 8 bits of a forwarded id

  Forwarder(front::check::WorkerLoop& l, CheckHandler& h, ForwardCounters& k,
            const std::function<int64_t()>& clock_, ClusterNode& c, const std::string& secret)
      : loop(l),
        handler(h),
        counters(k),
        clock(clock_),
        cluster(c),
        socket(l.io()),
        timer(l.io()),
        auth(std::make_unique<cluster::PeerCodec>(secret, c.self(), 0)),
        routing(c.self(), [this](uint16_t id) { return endpoints.count(id) != 0; }) {
    handler.set_forward_auth([this](std::span<const uint8_t> d) { return auth->verify(d); });
    socket.open(udp::v4());
    socket.bind(udp::endpoint(asio::ip::address_v4::any(), 0));
    socket.non_blocking(true);
    receive();
  }

  // CheckRouter (owner_routing.h)
  Route route(uint64_t routing_key, bool forwarded) override {
    refresh();
    const uint64_t failovers = routing.failovers();
    const Route r = routing.route(view, routing_key, forwarded, clock());
    if (routing.failovers() != failovers) {
      counters.forward_failovers.fetch_add(1, std::memory_order_relaxed);
    }
    return r;
  }
  bool routes_forwarded() override {
    refresh();
    return OwnerRouting::routes_forwarded(view, clock());
  }
  bool fences_redirects() override {
    refresh();
    return view.restarted != nullptr && !view.restarted->empty();
  }

  std::optional<udp::endpoint> endpoint_of(uint16_t id) const {
    const auto it = endpoints.find(id);
    if (it == endpoints.end()) return std::nullopt;
    return it->second;
  }

  // Takes the cluster's newest view, and parses the members' check addresses once per view
  // rather than once per check.
  void refresh() {
    const uint64_t v = cluster.view_version();
    if (v == version) return;
    view = cluster.view();
    version = v;
    endpoints.clear();
    for (const cluster::Member& m : *view.members) {
      if (m.check_port == 0) continue;
      boost::system::error_code ec;
      const auto addr = asio::ip::make_address(m.host, ec);
      if (!ec) endpoints[m.id] = udp::endpoint(addr, m.check_port);
    }
  }

  // Handles one client request; kForward when its answer will come later.
  CheckHandler::Outcome handle(std::span<const uint8_t> request, size_t max_answer, int64_t now,
                               std::vector<uint8_t>& reply, const Client& client) {
    const size_t slot = take_slot();
    Pending& p = pending[slot];
    const uint64_t base = (static_cast<uint64_t>(p.generation) << 32) | (slot << 8);
    const CheckHandler::Outcome o =
        handler.handle_routed(request, max_answer, now, reply, this, base, plan);
    // Slices asked for and given back go out after the client's answer, not before it (the
    // prefetches are encoded now, while the request they come from is at hand).
    for (const ForwardPlan::Prefetch& pf : plan.prefetch)
      prepare_prefetch(pf, now);
    CheckHandler::take_slice_returns(returns);
    if ((!prefetches.empty() || !returns.empty()) && !slice_flush_posted) {
      slice_flush_posted = true;
      asio::post(loop.io(), [this] { flush_slices(); });
    }
    if (o != CheckHandler::Outcome::kForward || plan.used > kMaxParts) {
      release(slot);
      if (o == CheckHandler::Outcome::kForward) {  // more owners than ids: decide it all here
        return handler.handle(request, max_answer, now, reply) ? CheckHandler::Outcome::kAnswer
                                                               : CheckHandler::Outcome::kDrop;
      }
      return o;
    }
    counters.forwarded_requests.fetch_add(1, std::memory_order_relaxed);
    p.busy = true;
    p.internal = false;
    p.client = client;
    p.client_id = plan.client_id;
    p.max_answer = max_answer;
    p.deadline_ms = now + cluster.forward_timeout_ms();
    p.decisions.assign(plan.num_checks, wire::Decision{});
    for (const auto& [i, code] : plan.refused)
      p.decisions[i].code = code;
    for (auto& [i, decision] : plan.decided)  // decided here from slices
      p.decisions[i] = std::move(decision);
    if (p.parts.size() < plan.used) p.parts.resize(plan.used);
    p.part_done.assign(plan.used, 0);
    p.outstanding = plan.used;
    for (size_t i = 0; i < plan.used; ++i) {
      std::swap(p.parts[i].checks, plan.parts[i].checks);
      std::swap(p.parts[i].request, plan.parts[i].request);
      p.parts[i].owner = plan.parts[i].owner;
      p.parts[i].redirected = plan.parts[i].redirected;
      p.parts[i].fallback = plan.parts[i].fallback;
      p.parts[i].takeover = plan.parts[i].takeover;
      p.parts[i].takeover_cap_ms = plan.parts[i].takeover_cap_ms;
      p.parts[i].fallback_since_ms = plan.parts[i].fallback_since_ms;
      p.parts[i].asks_slices = plan.parts[i].asks_slices;
      p.parts[i].sent_ms = now;
      auth->sign(p.parts[i].request);  // the owner honours `forwarded` only under our tag
    }
    for (size_t i = 0; i < plan.used && p.busy; ++i) {
      ForwardPlan::Part& part = p.parts[i];
      if (part.owner == 0) {
        if (part.fallback) counters.forward_fallbacks.fetch_add(1, std::memory_order_relaxed);
        decide_here(slot, i, now, planned(part));
        continue;
      }
      if (send_part(part.owner, part)) {
        counters.forwarded_parts.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      // The owner cannot be sent to: denied here (see above).
      counters.forward_fallbacks.fetch_add(1, std::memory_order_relaxed);
      decide_here(slot, i, now, denied_from(now));
    }
    if (pending[slot].busy) arm_timer();
    return CheckHandler::Outcome::kForward;
  }

  // Sends the prefetches and returns the requests handled since the last flush left.
  void flush_slices() {
    slice_flush_posted = false;
    if (loop.stopping()) return;
    for (const size_t slot : prefetches) {
      Pending& p = pending[slot];
      if (!p.busy || !p.internal) continue;  // timed out meanwhile
      if (!send_part(p.parts[0].owner, p.parts[0])) {
        release(slot);
        continue;
      }
      counters.slice_prefetches.fetch_add(1, std::memory_order_relaxed);
      arm_timer();
    }
    prefetches.clear();
    send_returns();
  }

  // Leased quotas: a request asking `pf.owner` for a slice of a check's key on its own, in a
  // pending slot of its own (its answer installs the slice, and nobody waits for it; lost, the
  // next check asks again), sent by flush_slices.
  void prepare_prefetch(const ForwardPlan::Prefetch& pf, int64_t now) {
    const size_t slot = take_slot();
    Pending& p = pending[slot];
    const uint64_t id = (static_cast<uint64_t>(p.generation) << 32) | (slot << 8);
    p.busy = true;
    p.internal = true;
    p.client = Client{};
    p.client_id = 0;
    p.max_answer = 0;
    p.deadline_ms = now + cluster.forward_timeout_ms();
    p.decisions.assign(1, wire::Decision{});
    if (p.parts.empty()) p.parts.resize(1);
    ForwardPlan::Part& part = p.parts[0];
    part.checks.assign(1, 0);
    part.owner = pf.owner;
    part.redirected = part.fallback = part.takeover = false;
    part.asks_slices = true;
    part.sent_ms = now;
    handler.encode_prefetch(pf, id, part.request);
    auth->sign(part.request);
    p.part_done.assign(1, 0);
    p.outstanding = 1;
    prefetches.push_back(slot);
  }

  // Gives the slices in `returns` back to the nodes that granted them, one datagram per node
  // (signed; no answer is waited for: one lost, its slice counts in full when it expires).
  void send_returns() {
    while (!returns.empty()) {
      const uint16_t owner = returns.front().owner;
      const auto split =
          std::stable_partition(returns.begin(), returns.end(),
                                [owner](const engine::SliceReturn& r) { return r.owner == owner; });
      handler.encode_returns({returns.data(), static_cast<size_t>(split - returns.begin())},
                             scratch_returns);
      returns.erase(returns.begin(), split);
      auth->sign(scratch_returns);
      if (const auto ep = endpoint_of(owner)) {
        boost::system::error_code ec;
        socket.send_to(asio::buffer(scratch_returns), *ep, 0, ec);
      }
    }
  }

  // Sends a part (signed, as planned) to node `to`; false when it has no address or the send
  // failed.
  bool send_part(uint16_t to, const ForwardPlan::Part& part) {
    const auto ep = endpoint_of(to);
    if (!ep) return false;
    boost::system::error_code ec;
    socket.send_to(asio::buffer(part.request), *ep, 0, ec);
    return !ec;
  }

  size_t take_slot() {
    if (free_slots.empty()) {
      free_slots.push_back(pending.size());
      pending.emplace_back();
    }
    const size_t slot = free_slots.back();
    free_slots.pop_back();
    pending[slot].generation = ++generation;
    return slot;
  }
  void release(size_t slot) {
    pending[slot].busy = false;
    free_slots.push_back(slot);
  }

  // In place of an owner that cannot be asked since `since_ms`, by each rule's `fallback` (deny,
  // or this node's share of the limit, 1 / the members expected, growing over one window from
  // then: engine::StandIn), never as if it were the owner; from now: nothing is admitted.
  engine::StandIn denied_from(int64_t since_ms) const {
    return {std::max<uint32_t>(1, view.expected_members), since_ms};
  }
  // How a part planned to be decided here (owner 0) is decided: as the owner, as a fallback, or
  // as the replica taking over (CheckRouter::Route).
  engine::StandIn planned(const ForwardPlan::Part& part) const {
    if (part.fallback) return denied_from(part.fallback_since_ms);
    if (part.takeover) {
      engine::StandIn s{0, part.fallback_since_ms, true};
      s.takeover_cap_ms = part.takeover_cap_ms;
      return s;
    }
    return {};
  }

  // Decides part i of a pending request on this node (the part itself is marked forwarded),
  // with `f` (engine::StandIn).
  void decide_here(size_t slot, size_t i, int64_t now, engine::StandIn f) {
    Pending& p = pending[slot];
    if (!handler.handle(p.parts[i].request, wire::kMaxDatagramBytes, now, scratch, f) ||
        wire::decode_answer(scratch, answer) != wire::Code::kOk) {
      answer.decisions.clear();  // leaves those checks as malformed below
    }
    fill(slot, i);
  }

  // Copies a part's answer (in `answer`) into the request's decisions; finishes when complete.
  void fill(size_t slot, size_t i) {
    Pending& p = pending[slot];
    if (!p.busy || p.part_done[i]) return;
    p.part_done[i] = 1;
    const auto& checks = p.parts[i].checks;
    for (size_t k = 0; k < checks.size(); ++k) {
      wire::Decision& d = p.decisions[checks[k]];
      if (k < answer.decisions.size()) {
        d = std::move(answer.decisions[k]);
      } else {
        d = wire::Decision{};
        d.code = wire::Code::kMalformed;
      }
    }
    if (--p.outstanding == 0) finish(slot);
  }

  void finish(size_t slot) {
    Pending& p = pending[slot];
    if (p.internal) {
      release(slot);
      return;
    }
    limit_views.clear();
    views.clear();
    for (const wire::Decision& d : p.decisions) {
      for (const wire::LimitStatus& l : d.limits) {
        limit_views.push_back({l.name, l.limit, l.window_ms, l.remaining, l.reset_ms,
                               l.retry_after_ms, l.mode, l.exceeded});
      }
    }
    size_t at = 0;
    for (const wire::Decision& d : p.decisions) {
      wire::DecisionView v;
      v.code = d.code;
      v.allowed = d.allowed;
      v.would_deny = d.would_deny;
      v.shadow = d.shadow;
      v.allowlisted = d.allowlisted;
      v.lease = d.lease;
      v.limits = std::span<const wire::LimitView>(limit_views.data() + at, d.limits.size());
      at += d.limits.size();
      views.push_back(v);
    }
    const size_t n =
        wire::encode_answer(p.client_id, wire::Code::kOk, views, p.max_answer, scratch);
    // An answer over the client's cap (a datagram is never amplified) goes as nothing: dropped.
    const bool fits = p.max_answer == 0 || n <= p.max_answer;
    loop.answer(p.client, fits ? std::span<const uint8_t>(scratch) : std::span<const uint8_t>());
    release(slot);
  }

  void receive() {
    socket.async_wait(udp::socket::wait_read, [this](boost::system::error_code ec) {
      if (ec == asio::error::operation_aborted || loop.stopping()) return;
      for (int n = 0; n < 64; ++n) {
        boost::system::error_code rec;
        udp::endpoint from;
        const size_t got = socket.receive_from(asio::buffer(in), from, 0, rec);
        if (rec) break;  // would block: drained
        on_answer({in.data(), got});
      }
      receive();
    });
  }

  void on_answer(std::span<const uint8_t> bytes) {
    if (wire::decode_answer(bytes, answer) != wire::Code::kOk) return;  // undecodable: timeout
    const uint64_t id = answer.id;
    const auto slot = static_cast<size_t>((id >> 8) & 0xFFFFFF);
    const size_t part = id & 0xFF;
    if (slot >= pending.size()) return;
    Pending& p = pending[slot];
    if (!p.busy || p.generation != static_cast<uint32_t>(id >> 32) || part >= p.part_done.size()) {
      return;  // late: already decided here after a timeout
    }
    routing.note_answer(p.parts[part].owner);  // it answers again
    if (p.parts[part].redirected) {
      handler.credit(p.parts[part].request, answer, p.parts[part].owner, clock());
    }
    if (p.parts[part].asks_slices) {
      handler.settle_slices(p.parts[part].request, answer, p.parts[part].owner,
                            p.parts[part].sent_ms, clock(), returns);
      send_returns();
    }
    fill(slot, part);
  }

  void arm_timer() {
    if (timer_armed) return;
    timer_armed = true;
    timer.expires_after(
        std::chrono::milliseconds(std::max<int64_t>(1, cluster.forward_timeout_ms() / 4)));
    timer.async_wait([this](boost::system::error_code ec) {
      timer_armed = false;
      if (ec || loop.stopping()) return;
      const int64_t now = clock();
      bool any = false;
      for (size_t slot = 0; slot < pending.size(); ++slot) {
        if (!pending[slot].busy) continue;
        if (pending[slot].deadline_ms > now) {
          any = true;
          continue;
        }
        if (pending[slot].internal) {  // a prefetch unanswered: the next check asks again
          release(slot);
          continue;
        }
        for (size_t i = 0; i < pending[slot].parts.size() && pending[slot].busy; ++i) {
          if (i >= pending[slot].part_done.size() || pending[slot].part_done[i]) continue;
          // The owner, in reach, did not answer: it may have admitted the part, so it is denied
          // here (a share from now is nothing), never admitted twice.
          routing.note_timeout(pending[slot].parts[i].owner, now);
          counters.forward_fallbacks.fetch_add(1, std::memory_order_relaxed);
          decide_here(slot, i, now, denied_from(now));
        }
      }
      if (any) arm_timer();
    });
  }

  void stop() {
    const int64_t now = clock();
    for (size_t slot = 0; slot < pending.size(); ++slot) {
      if (pending[slot].busy && pending[slot].internal) {
        release(slot);
        continue;
      }
      for (size_t i = 0; i < pending[slot].parts.size() && pending[slot].busy; ++i) {
        if (i < pending[slot].part_done.size() && !pending[slot].part_done[i]) {
          const ForwardPlan::Part& part = pending[slot].parts[i];
          decide_here(slot, i, now, part.owner != 0 ? denied_from(now) : planned(part));
        }
      }
    }
    boost::system::error_code ec;
    timer.cancel();
    socket.close(ec);
  }

  front::check::WorkerLoop& loop;  // the worker this forwarder runs on
  CheckHandler& handler;           // the worker's
  ForwardCounters& counters;
  const std::function<int64_t()>& clock;  // the node's
  ClusterNode& cluster;
  udp::socket socket;
  asio::steady_timer timer;
  std::unique_ptr<cluster::PeerCodec> auth;  // tags forwarded parts, checks received ones
  bool timer_armed = false;
  OwnerRouting routing;  // who decides each owner-mode check
  ClusterNode::View view;
  uint64_t version = 0;
  std::unordered_map<uint16_t, udp::endpoint> endpoints;  // members' check ports, of `view`
  ForwardPlan plan;
  std::vector<Pending> pending;
  std::vector<size_t> free_slots;
  uint32_t generation = 0;
  std::array<uint8_t, 65'536> in{};  // an answer (any UDP payload fits)
  std::vector<uint8_t> scratch;
  wire::Answer answer;
  std::vector<wire::LimitView> limit_views;
  std::vector<wire::DecisionView> views;
  std::vector<engine::SliceReturn> returns;  // slices to give back (settle_slices)
  std::vector<size_t> prefetches;  // pending slots of prefetches to send once answers are out
  bool slice_flush_posted = false;
  std::vector<uint8_t> scratch_returns;
};

}  // namespace sluice::node
