// Spreading overrides over the cluster (override_sync.h).
#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include "node/override_sync.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <optional>
#include <thread>

#include "node/node_state.h"

namespace sluice::node {

namespace asio = boost::asio;
using cluster::OverrideDigest;
using cluster::OverrideRecord;
using cluster::OverrideSyncKind;
using cluster::OverrideSyncMessage;

struct OverrideSync::Impl {
  // What a job on the merge thread found; the control thread sends and counts it.
  struct Result {
    cluster::OverrideOutbox out;
    std::optional<NodeState::OverrideMerge> merge;
    OverrideDigest own;
  };

  Impl(asio::io_context& c, NodeState& s, cluster::PeerLimits l, SendFn sf, LiveFn lf,
       std::map<std::string, uint64_t>& d, uint64_t seed, std::unique_ptr<PeerTimer> t)
      : control(c),
        st(s),
        limits(l),
        live(std::move(lf)),
        dropped(d),
        spread(cluster::OverrideSpreadOptions{kDigestIntervalMs, kFullGapMs}, std::move(sf), seed),
        timer(std::move(t)) {}

  // ---- control thread ----

  void on_local(const OverrideRecord& r) {
    if (stopped) return;
    spread.on_local_write(r, live());
  }

  void arm() {
    timer->arm(kTickMs * 1'000, [this] {
      if (stopped) return;
      tick();
      arm();
    });
  }

  void tick() {
    for (const uint16_t to : spread.digest_targets(st.opt.clock(), live()))
      send_digest(to);
  }

  void send_digest(uint16_t to) {
    run([this, to] {
      Result r;
      r.own = st.override_digest();
      r.out = cluster::digest_message(to, r.own);
      return r;
    });
  }

  void on_message(const OverrideSyncMessage& m) {
    if (stopped) return;
    if (m.kind == OverrideSyncKind::kDigest) {
      ++stats.digests_received;
      run([this, m] {
        Result r;
        r.own = st.override_digest();
        answer(m, r);
        return r;
      });
      return;
    }
    stats.records_received += m.records.size();
    run([this, m] {
      Result r;
      if (!m.records.empty()) r.merge = st.merge_overrides(m.records, m.from);
      r.own = st.override_digest();
      answer(m, r);
      return r;
    });
  }

  // Runs `job` on the merge thread, then finish() here with its result.
  template <typename Job>
  void run(Job job) {
    if (queued >= kMaxQueued) {
      ++dropped["override_busy"];
      ++stats.dropped;
      return;
    }
    ++queued;
    asio::post(work_io, [this, job = std::move(job)]() mutable {
      Result r;
      try {
        r = job();
      } catch (const std::exception& e) {
        spdlog::error("overrides: sync job failed: {}", e.what());
      }
      asio::post(control, [this, alive = alive, r = std::move(r)]() mutable {
        if (*alive) finish(std::move(r));
      });
    });
  }

  void finish(Result r) {
    --queued;
    stats.records = r.own.count;
    stats.hash = r.own.hash;
    if (r.merge) {
      stats.applied += r.merge->applied.size();
      stats.known += r.merge->known;
      stats.expired += r.merge->expired;
      for (const auto& [reason, n] : r.merge->dropped) {
        dropped["override_" + reason] += n;
        stats.dropped += n;
      }
    }
    if (stopped) return;
    spread.send(std::move(r.out), st.opt.clock());
  }

  // ---- merge thread ----

  // What `m` calls for (override_spread.h), given this node's digest after merging it (r.own):
  // this node's whole table, in as many datagrams as it takes.
  void answer(const OverrideSyncMessage& m, Result& r) {
    const cluster::OverrideAnswer a = cluster::answer_to(m, r.own);
    if (a == cluster::OverrideAnswer::kNothing) return;
    if (m.kind == OverrideSyncKind::kDigest) {
      spdlog::debug("overrides: node {} holds {} records, this node {}: sending ours", m.from,
                    m.digest.count, r.own.count);
    }
    const std::vector<OverrideRecord> all = st.override_records_now();
    r.own = st.override_digest();
    size_t unfit = 0;
    r.out = cluster::full_table(m.from, all, r.own, a == cluster::OverrideAnswer::kFullWantBack,
                                limits, &unfit);
    // Cannot happen for records within OverrideBounds.
    if (unfit > 0) spdlog::warn("overrides: {} records do not fit a datagram; not sent", unfit);
  }

  asio::io_context& control;
  NodeState& st;
  cluster::PeerLimits limits;
  LiveFn live;
  std::map<std::string, uint64_t>& dropped;  // the cluster's (control thread)
  cluster::OverrideSpread spread;            // control thread
  std::unique_ptr<PeerTimer> timer;
  // The merge thread.
  asio::io_context work_io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;
  // Control thread.
  size_t queued = 0;
  bool started = false, stopped = false;
  // False from stop() on. What the merge thread and the rules' callback post to the control
  // thread checks it first: the control io_context may run on after this is gone (a node that
  // stopped its cluster part while the rest runs, or tests that run several nodes on one).
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
  OverrideSyncStats stats;  // the received side; spread.stats() has the sent side
};

OverrideSync::OverrideSync(asio::io_context& control, NodeState& state, cluster::PeerLimits limits,
                           SendFn send, LiveFn live, std::map<std::string, uint64_t>& dropped,
                           uint64_t seed, std::unique_ptr<PeerTimer> tick)
    : impl_(std::make_unique<Impl>(control, state, limits, std::move(send), std::move(live),
                                   dropped, seed, std::move(tick))) {}

OverrideSync::~OverrideSync() {
  stop();
}

void OverrideSync::start() {
  Impl& s = *impl_;
  if (s.started) return;
  s.started = true;
  s.work.emplace(s.work_io.get_executor());
  s.thread = std::thread([&s] { s.work_io.run(); });
  {
    std::lock_guard g(s.st.rules_mu);
    s.st.on_local_override = [&s](const OverrideRecord& r) {
      asio::post(s.control, [&s, alive = s.alive, r] {
        if (*alive) s.on_local(r);
      });
    };
  }
  s.spread.start(s.st.opt.clock());
  s.arm();
}

void OverrideSync::stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped) return;
  s.stopped = true;
  *s.alive = false;
  {
    std::lock_guard g(s.st.rules_mu);
    s.st.on_local_override = nullptr;
  }
  s.timer->cancel();
  // Jobs not started yet are dropped: anti-entropy brings their records again after a restart.
  s.work.reset();
  s.work_io.stop();
  if (s.thread.joinable()) s.thread.join();
}

void OverrideSync::on_message(const cluster::OverrideSyncMessage& m) {
  impl_->on_message(m);
}

OverrideSyncStats OverrideSync::stats() const {
  OverrideSyncStats s = impl_->stats;
  const cluster::OverrideSpreadStats& sent = impl_->spread.stats();
  s.records_sent = sent.records_sent;
  s.pushes_sent = sent.pushes_sent;
  s.digests_sent = sent.digests_sent;
  s.full_sent = sent.full_sent;
  return s;
}

}  // namespace sluice::node
