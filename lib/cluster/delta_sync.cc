#include "cluster/delta_sync.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>

#include "cluster/peer_codec.h"
#include "rules/rules.h"

namespace sluice::cluster {

namespace {
const size_t kMaxPackedTotals = PeerLimits{}.max_totals;
}  // namespace

class DeltaSync::Router : public engine::SyncSink {
 public:
  Router(DeltaSync& ds, Run& run, const Send& send)
      : ds_(ds),
        run_(run),
        ring_(run.ring),
        in_reach_(run.use_in_reach ? &run.in_reach : nullptr),
        handoff_(run.handoff),
        send_(send) {}

  void item(const engine::SyncItem& it) override {
    dests_.clear();
    add_owners(ring_, it.counter);
    if (in_reach_ != nullptr) add_owners(*in_reach_, it.counter);
    if (it.with_others) {
      for (NodeId r : it.reporters) {
        if (r != ds_.self_ && (ring_.contains(r) || (in_reach_ && in_reach_->contains(r)))) {
          dests_.push_back(r);
        }
      }
    }
    std::sort(dests_.begin(), dests_.end());
    dests_.erase(std::unique(dests_.begin(), dests_.end()), dests_.end());
    if (!run_.only.empty()) {
      std::erase_if(dests_, [&](NodeId d) {
        return !std::binary_search(run_.only.begin(), run_.only.end(), d);
      });
    }
    if (dests_.empty()) return;
    ++ds_.stats_.counters;
    for (NodeId d : dests_) {
      Pending& p = batch_for(d);
      for (const engine::RemoteTotal& t : it.totals) {
        // A node is never sent its own totals back unless it is the owner's push (it may have
        // lost them: a restart after kill -9).
        if (t.node == d && !it.with_others) continue;
        if (p.batch.compact && !packable(t)) {
          // A total without a packed form (none the engine makes) goes in a list batch.
          flush(d, p);
          p.batch.compact = false;
        }
        if (p.batch.compact) {  // packed until the byte budget
          if (p.packed.bytes() + p.packed.cost(t) > ds_.max_packed_) flush(d, p);
          p.packed.add(t, nullptr);
        }
        if (!p.batch.compact && (t.spec.window_ms > UINT32_MAX || t.spec.bucket_ms > UINT32_MAX)) {
          ++ds_.stats_.list_skipped;  // a list's 32-bit fields cannot hold it (delta_sync.h)
          continue;
        }
        p.batch.totals.push_back(t);
        ++ds_.stats_.totals;
        // A list binds at max_totals; a packed batch closes by bytes (above), or at the count a
        // receiver takes.
        if (p.batch.totals.size() >= (p.batch.compact ? kMaxPackedTotals : ds_.max_totals_)) {
          flush(d, p);
        }
      }
    }
  }

  void flush_all() {
    for (auto& [d, p] : run_.pending) {
      if (!p.batch.totals.empty()) flush(d, p);
    }
  }

 private:
  void add_owners(const HashRing& ring, uint64_t counter) {
    std::array<NodeId, HashRing::kMaxReplicas> owners{};
    const size_t n = ring.owners(rules::routing_key(counter), owners);
    for (size_t i = 0; i < n; ++i) {
      if (owners[i] != ds_.self_) dests_.push_back(owners[i]);
    }
  }
  using Pending = Run::Pending;
  Pending& batch_for(NodeId d) {
    Pending& p = run_.pending[d];
    p.batch.from = ds_.self_;
    p.batch.handoff = handoff_;
    if (p.batch.totals.empty()) start(d, p);
    return p;
  }
  void start(NodeId d, Pending& p) {
    p.batch.compact = ds_.max_packed_ > 0 && ds_.compact_to_ && ds_.compact_to_(d);
    p.packed.clear();
  }
  void flush(NodeId d, Pending& p) {
    if (p.batch.totals.empty()) return;
    send_(d, p.batch);
    ++ds_.stats_.batches;
    p.batch.totals.clear();
    start(d, p);
  }

  DeltaSync& ds_;
  Run& run_;
  const HashRing& ring_;
  const HashRing* in_reach_;
  bool handoff_;
  const Send& send_;
  std::vector<NodeId> dests_;
};

DeltaSync::DeltaSync(engine::Engine& engine, NodeId self, size_t max_totals)
    : engine_(engine), self_(self), max_totals_(std::max<size_t>(max_totals, 1)) {}

void DeltaSync::set_compact(std::function<bool(NodeId)> to, size_t max_packed) {
  compact_to_ = std::move(to);
  max_packed_ = max_packed;
}

void DeltaSync::pass(const HashRing& ring, Mode mode, bool handoff, const Send& send,
                     const HashRing* in_reach, int64_t now_ms) {
  begin(ring, mode, handoff, in_reach, {}, now_ms);
  while (!resume(mode != Mode::kChanged, send, std::numeric_limits<int64_t>::max())) {
  }
}

void DeltaSync::begin(const HashRing& ring, Mode mode, bool handoff, const HashRing* in_reach,
                      std::vector<NodeId> only, int64_t now_ms) {
  ++stats_.passes;
  if (mode == Mode::kEverything) engine_.mark_all_changed_for_sync();
  Run& run = runs_[mode == Mode::kChanged ? 0 : 1];
  run.ring = ring;
  run.use_in_reach = in_reach != nullptr;
  if (run.use_in_reach) run.in_reach = *in_reach;
  run.handoff = handoff;
  std::sort(only.begin(), only.end());
  run.only = std::move(only);
  run.cursor.restart(mode != Mode::kChanged);
  run.lead_pushes = mode == Mode::kResend;
  run.cursor.mark_pushed = run.only.empty();
  if (mode == Mode::kChanged) {
    // Own buckets counted since the previous changed pass began (sync.h); all of them when
    // either time is not known.
    const bool known = last_changed_ms_ != INT64_MIN && now_ms != INT64_MIN;
    run.cursor.own_from_ms = known ? last_changed_ms_ - kCountLateMs : INT64_MIN;
    last_changed_ms_ = now_ms;
  }
  run.active = true;
}

bool DeltaSync::resume(bool bulk, const Send& send, int64_t budget_ns) {
  Run& run = runs_[bulk ? 1 : 0];
  if (!run.active) return true;
  Router router(*this, run, send);
  const HashRing* in_reach = run.use_in_reach ? &run.in_reach : nullptr;
  // The owner and the replicas all push the merged state they hold: when the owner dies, its
  // replica keeps every holder current during the seconds before membership declares it dead.
  // Across a cut, the holders in reach do it on their side.
  const auto holds = [this](const HashRing& r, uint64_t counter) {
    std::array<NodeId, HashRing::kMaxReplicas> owners{};
    const size_t n = r.owners(rules::routing_key(counter), owners);
    return std::find(owners.begin(), owners.begin() + static_cast<std::ptrdiff_t>(n), self_) !=
           owners.begin() + static_cast<std::ptrdiff_t>(n);
  };
  // The resend pass: of the holders, the first in reach pushes the merged state (delta_sync.h);
  // the others send their own totals, as any node does, and what they hold of others' stays due.
  const auto leads = [this](const HashRing& r, uint64_t counter) {
    std::array<NodeId, HashRing::kMaxReplicas> owners{};
    return r.owners(rules::routing_key(counter), owners) > 0 && owners[0] == self_;
  };
  const std::function<bool(uint64_t)> owns = [&](uint64_t counter) {
    if (run.lead_pushes) return leads(in_reach != nullptr ? *in_reach : run.ring, counter);
    return holds(run.ring, counter) || (in_reach != nullptr && holds(*in_reach, counter));
  };
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (engine_.sync_step(run.cursor, 256, owns, router)) break;
    if (budget_ns != std::numeric_limits<int64_t>::max() &&
        std::chrono::steady_clock::now() - start >= std::chrono::nanoseconds(budget_ns)) {
      return false;  // half-filled batches wait in run.pending for the next slice
    }
  }
  router.flush_all();
  run.active = false;
  return true;
}

}  // namespace sluice::cluster
