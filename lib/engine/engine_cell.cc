// Cell checks (engine.h, "Cell limits"): redis-cell's CL.THROTTLE against a key's arrival time,
// kept in a GCRA counter slot (Impl::gcra_tat) under rules::cell_window_spec(). The arithmetic is
// window/cell.h's; this file finds the counter, writes what an allowed call leaves, and reports.
#include <array>

#include "engine/engine_impl.h"
#include "window/cell.h"

namespace sluice::engine {
namespace {

__extension__ typedef __int128 i128;

static_assert(sizeof(LimitResult) == 56, "reset_ns_short must stay in LimitResult's padding");

constexpr int64_t kNsPerMs = 1'000'000;

// The call's time: its own ns when they lie within the batch's millisecond, else the batch's.
int64_t cell_now_ns(const rules::CellCheck& cell, int64_t now_ms) {
  if (cell.now_ns > 0 && cell.now_ns / kNsPerMs == now_ms) return cell.now_ns;
  return now_ms * kNsPerMs;
}

// Whole milliseconds rounded up (toward +inf), for the limit's ms fields.
int64_t ceil_ms(int64_t ns) {
  return ns / kNsPerMs + (ns % kNsPerMs > 0 ? 1 : 0);
}

rules::CheckError check_error(window::CellError e) {
  return e == window::CellError::kOverRefund ? rules::CheckError::kHitsTooLarge
                                             : rules::CheckError::kBadLimitOverride;
}

}  // namespace

void Engine::Impl::decide_cell(const State& st, const rules::CheckRequest& req,
                               const rules::Resolution& res, const rules::ResolvedRequest& rr,
                               int64_t now_ms, BatchResult& out, Decision& d, bool report) {
  const rules::AppliedRule& ar = res.rules[rr.first_rule];
  const rules::AppliedLimit& al = res.limits[ar.first_limit];
  const rules::CellCheck& cell = *req.cell;
  window::CellParams p;
  (void)window::cell_params(cell.interval_ns, cell.limit, p);  // valid: resolve checked them
  const int64_t now_ns = cell_now_ns(cell, now_ms);
  const uint32_t spec_id = st.spec_ids[al.spec_index];
  Shard& sh = shards[al.counter & shard_mask];
  std::lock_guard g(sh.lock);
  if (cell.reset) {
    // Dropped, not zeroed: nothing of the key is left to persist or to expire later.
    bool existed = false;
    if (CounterTable* t = sh.tables[spec_id].load(std::memory_order_relaxed)) {
      const int64_t found = t->find(al.counter);
      if (found >= 0) {
        const auto i = static_cast<size_t>(found);
        const uint64_t tat = gcra_tat(*t, i);
        existed = tat != 0 && tat >= static_cast<uint64_t>(now_ns);
        forget(sh, *t, i, spec_id);
        t->erase_at(i);
      }
    }
    d.allowed = existed;
    d.num_limits = 0;
    return;
  }
  CounterTable& t = table(sh, spec_id);
  bool inserted = false;
  const int64_t found =
      find_or_insert(sh, t, spec_id, al.counter, now_ms, {&al.counter, 1}, inserted);
  if (found < 0) [[unlikely]] {
    answer_no_room(d);
    return;
  }
  const auto i = static_cast<size_t>(found);
  const auto tat = static_cast<int64_t>(gcra_tat(t, i));  // written by this file: under 2^63
  const window::CellOutcome o = window::cell_decide(tat, p, now_ns, cell.quantity);
  if (o.error != window::CellError::kNone) {
    d.error = check_error(o.error);
    if (report) rejected[static_cast<size_t>(d.error)].fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (o.write) {
    set_gcra_tat(t, i, static_cast<uint64_t>(o.new_tat),
                 window::gcra_head(static_cast<uint64_t>(o.new_tat), t.spec(), now_ms));
    t.set_flags(i, CounterTable::kDirtyFlag);  // for the store; never synced
  }
  d.allowed = !o.limited;
  if (!report) return;
  d.first_limit = static_cast<uint32_t>(out.limits.size());
  d.num_limits = 1;
  RuleCounters& rs = sh.rule_stats[st.stats_ids[ar.stats_index]];
  if (o.limited) {
    ++rs.denied;
  } else {
    ++rs.allowed;
  }

  const window::CellReply reply = window::cell_reply(p, cell.quantity, o.limited, o.ttl_ns);
  LimitResult& lr = out.limits.emplace_back();
  lr.rule = ar.rule;
  lr.limit = al.limit;
  lr.requests = static_cast<uint64_t>(p.limit);
  lr.mode = rules::Mode::kEnforce;
  lr.exceeded = o.limited;
  lr.remaining = reply.remaining > 0 ? static_cast<uint64_t>(reply.remaining) : 0;
  lr.reset_ms = ceil_ms(o.ttl_ns);
  const int64_t part = o.ttl_ns % kNsPerMs;  // of ttl's sign; ttl > -1 ms (cell.h)
  lr.reset_ns_short = static_cast<int32_t>(part > 0 ? kNsPerMs - part : -part);
  if (o.limited) {
    // Until the quantity fits (ttl + inc - tau, window/cell.h), or never.
    const i128 inc = static_cast<i128>(p.interval_ns) * cell.quantity;
    lr.retry_after_ms = inc <= p.tolerance_ns
                            ? ceil_ms(static_cast<int64_t>(o.ttl_ns + inc - p.tolerance_ns))
                            : window::kNever;
  }
  const uint64_t used = lr.requests - std::min(lr.requests, lr.remaining);
  if (o.limited || used * 5 >= lr.requests * 4) {
    note_hot(sh, al.counter, st.stats_ids[ar.stats_index], ar, al, req, used, o.limited, now_ms);
  }
}

void Engine::Impl::credit_cell(const rules::CheckRequest& req, int64_t now_ms) {
  thread_local rules::Resolution res;  // not the check path's: check() may be mid-batch here
  const State& st = current_state();
  res.clear();
  const rules::ResolvedRequest rr = st.policy->resolve(req, now_ms, res);
  if (rr.error != rules::CheckError::kNone || rr.num_rules != 1) return;
  // Decided as a check here, unreported: the same arithmetic moves the arrival time on as it
  // moved at the former owner (or drops it, for a reset).
  BatchResult unused;
  Decision d;
  decide_cell(st, req, res, rr, now_ms, unused, d, false);
}

}  // namespace sluice::engine
