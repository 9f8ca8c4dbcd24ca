// Spreading overrides over the cluster (override_sync.h).
#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include "node/override_sync.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "node/node_state.h"

namespace sluice::node {

namespace asio = boost::asio;
using cluster::OverrideDigest;
using cluster::OverrideRecord;
using cluster::OverrideSyncKind;
using cluster::OverrideSyncMessage;

namespace {

// A full table to one member at most this often (a digest round and a reply cannot loop).
constexpr int64_t kFullGapMs = 250;

}  // namespace

struct OverrideSync::Impl {
  // What a job on the merge thread found; the control thread sends and counts it.
  struct Result {
    std::vector<std::pair<uint16_t, OverrideSyncMessage>> sends;
    bool full_to_send = false;  // `sends` is a whole table: subject to kFullGapMs
    std::optional<NodeState::OverrideMerge> merge;
    uint16_t from = 0;
    OverrideDigest own;
  };

  Impl(asio::io_context& c, NodeState& s, cluster::PeerLimits l, SendFn sf, LiveFn lf,
       std::map<std::string, uint64_t>& d, uint64_t seed)
      : control(c),
        st(s),
        limits(l),
        send(std::move(sf)),
        live(std::move(lf)),
        dropped(d),
        rng(seed),
        timer(c) {}

  // ---- control thread ----

  void on_local(const OverrideRecord& r) {
    if (stopped) return;
    OverrideSyncMessage m;
    m.kind = OverrideSyncKind::kPush;
    m.records.push_back(r);
    for (const uint16_t to : live()) {
      if (send(to, m)) {
        ++stats.pushes_sent;
        ++stats.records_sent;
      }
    }
  }

  void arm() {
    timer.expires_after(std::chrono::milliseconds(kTickMs));
    timer.async_wait([this](boost::system::error_code ec) {
      if (ec || stopped) return;
      tick();
      arm();
    });
  }

  void tick() {
    const int64_t now = st.opt.clock();
    const std::vector<uint16_t> members = live();
    std::set<uint16_t> now_live(members.begin(), members.end());
    // Newly alive (joined, restarted, back from a partition): compare tables with it now.
    for (const uint16_t id : now_live) {
      if (known_live.count(id) == 0) send_digest(id);
    }
    known_live = std::move(now_live);
    if (!members.empty() && now - last_digest_ms >= kDigestIntervalMs) {
      last_digest_ms = now;
      send_digest(members[std::uniform_int_distribution<size_t>(0, members.size() - 1)(rng)]);
    }
  }

  void send_digest(uint16_t to) {
    run([this, to] {
      Result r;
      r.own = st.override_digest();
      OverrideSyncMessage m;
      m.kind = OverrideSyncKind::kDigest;
      m.digest = r.own;
      r.sends.emplace_back(to, std::move(m));
      return r;
    });
  }

  void on_message(const OverrideSyncMessage& m) {
    if (stopped) return;
    if (m.kind == OverrideSyncKind::kDigest) {
      ++stats.digests_received;
      run([this, from = m.from, theirs = m.digest] {
        Result r;
        r.own = st.override_digest();
        if (r.own != theirs) {
          spdlog::debug("overrides: node {} holds {} records, this node {}: sending ours", from,
                        theirs.count, r.own.count);
          full_table(from, r, /*want_full=*/true);
        }
        return r;
      });
      return;
    }
    stats.records_received += m.records.size();
    // On a full table's last part: answer with ours when the tables still differ after the merge.
    const bool answer = m.kind == OverrideSyncKind::kFull && m.want_full;
    run([this, m, answer] {
      Result r;
      r.from = m.from;
      if (!m.records.empty()) r.merge = st.merge_overrides(m.records, m.from);
      r.own = st.override_digest();
      if (answer && r.own != m.digest) full_table(m.from, r, /*want_full=*/false);
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
      asio::post(control, [this, r = std::move(r)]() mutable { finish(std::move(r)); });
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
    if (stopped || r.sends.empty()) return;
    const int64_t now = st.opt.clock();
    if (r.full_to_send) {
      int64_t& last = last_full_ms[r.sends.front().first];
      if (now - last < kFullGapMs) return;
      last = now;
      ++stats.full_sent;
    }
    for (const auto& [to, m] : r.sends) {
      if (!send(to, m)) continue;
      if (m.kind == OverrideSyncKind::kDigest) ++stats.digests_sent;
      stats.records_sent += m.records.size();
    }
  }

  // ---- merge thread ----

  // This node's whole table for `to`, in as many datagrams as it takes; `want_full` (and the
  // digest) on the last.
  void full_table(uint16_t to, Result& r, bool want_full) {
    const std::vector<OverrideRecord> all = st.override_records_now();
    r.own = st.override_digest();
    r.full_to_send = true;
    std::span<const OverrideRecord> rest(all);
    do {
      size_t n = cluster::fit_overrides(rest, limits);
      if (n == 0 && !rest.empty()) {
        // Cannot happen for records within OverrideBounds; never loop on one that does.
        spdlog::warn("overrides: a record does not fit a datagram; not sent");
        rest = rest.subspan(1);
        continue;
      }
      OverrideSyncMessage m;
      m.kind = OverrideSyncKind::kFull;
      m.digest = r.own;
      m.records.assign(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(n));
      rest = rest.subspan(n);
      m.want_full = want_full && rest.empty();
      r.sends.emplace_back(to, std::move(m));
    } while (!rest.empty());
  }

  asio::io_context& control;
  NodeState& st;
  cluster::PeerLimits limits;
  SendFn send;
  LiveFn live;
  std::map<std::string, uint64_t>& dropped;  // the cluster's (control thread)
  std::mt19937_64 rng;
  asio::steady_timer timer;
  // The merge thread.
  asio::io_context work_io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;
  // Control thread.
  size_t queued = 0;
  bool started = false, stopped = false;
  std::set<uint16_t> known_live;
  int64_t last_digest_ms = 0;
  std::map<uint16_t, int64_t> last_full_ms;
  OverrideSyncStats stats;
};

OverrideSync::OverrideSync(asio::io_context& control, NodeState& state, cluster::PeerLimits limits,
                           SendFn send, LiveFn live, std::map<std::string, uint64_t>& dropped,
                           uint64_t seed)
    : impl_(std::make_unique<Impl>(control, state, limits, std::move(send), std::move(live),
                                   dropped, seed)) {}

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
      asio::post(s.control, [&s, r] { s.on_local(r); });
    };
  }
  s.last_digest_ms = s.st.opt.clock();
  s.arm();
}

void OverrideSync::stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped) return;
  s.stopped = true;
  {
    std::lock_guard g(s.st.rules_mu);
    s.st.on_local_override = nullptr;
  }
  s.timer.cancel();
  // Jobs not started yet are dropped: anti-entropy brings their records again after a restart.
  s.work.reset();
  s.work_io.stop();
  if (s.thread.joinable()) s.thread.join();
}

void OverrideSync::on_message(const cluster::OverrideSyncMessage& m) {
  impl_->on_message(m);
}

OverrideSyncStats OverrideSync::stats() const {
  return impl_->stats;
}

}  // namespace sluice::node
