// What a node sends to whom to spread overrides (override_spread.h).
#include "cluster/override_spread.h"

#include <algorithm>
#include <iterator>

namespace sluice::cluster {

OverrideSpread::OverrideSpread(OverrideSpreadOptions options, SendFn send, uint64_t rng_seed)
    : options_(options), send_(std::move(send)), rng_(rng_seed) {}

void OverrideSpread::start(int64_t now_ms) {
  last_digest_ms_ = now_ms;
}

void OverrideSpread::on_local_write(const OverrideRecord& record, std::span<const NodeId> live) {
  OverrideSyncMessage m;
  m.kind = OverrideSyncKind::kPush;
  m.records.push_back(record);
  for (const NodeId to : live) {
    if (send_(to, m)) {
      ++stats_.pushes_sent;
      ++stats_.records_sent;
    }
  }
}

std::vector<NodeId> OverrideSpread::digest_targets(int64_t now_ms, std::span<const NodeId> live) {
  std::vector<NodeId> now_live(live.begin(), live.end());
  if (!std::is_sorted(now_live.begin(), now_live.end()))  // the node lists them by id
    std::sort(now_live.begin(), now_live.end());
  now_live.erase(std::unique(now_live.begin(), now_live.end()), now_live.end());
  // Newly live (joined, restarted, back from a partition): compare tables with it now.
  std::vector<NodeId> targets;
  std::set_difference(now_live.begin(), now_live.end(), known_live_.begin(), known_live_.end(),
                      std::back_inserter(targets));
  known_live_ = std::move(now_live);
  if (!live.empty() && now_ms - last_digest_ms_ >= options_.digest_interval_ms) {
    last_digest_ms_ = now_ms;
    targets.push_back(live[std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng_)]);
  }
  return targets;
}

void OverrideSpread::send(OverrideOutbox outbox, int64_t now_ms) {
  if (outbox.messages.empty()) return;
  if (outbox.full_table) {
    const NodeId to = outbox.messages.front().first;
    const auto [it, first] = last_full_ms_.try_emplace(to, now_ms);
    if (!first) {
      if (now_ms - it->second < options_.full_gap_ms) return;
      it->second = now_ms;
    }
    ++stats_.full_sent;
  }
  for (const auto& [to, m] : outbox.messages) {
    if (!send_(to, m)) continue;
    if (m.kind == OverrideSyncKind::kDigest) ++stats_.digests_sent;
    stats_.records_sent += m.records.size();
  }
}

OverrideOutbox digest_message(NodeId to, const OverrideDigest& own) {
  OverrideOutbox out;
  OverrideSyncMessage m;
  m.kind = OverrideSyncKind::kDigest;
  m.digest = own;
  out.messages.emplace_back(to, std::move(m));
  return out;
}

OverrideAnswer answer_to(const OverrideSyncMessage& received, const OverrideDigest& own) {
  switch (received.kind) {
    case OverrideSyncKind::kDigest:
      return own != received.digest ? OverrideAnswer::kFullWantBack : OverrideAnswer::kNothing;
    case OverrideSyncKind::kFull:
      // Only the last part asks; the tables may still differ when the sender had records we
      // lacked and we have some it lacks, or when its table changed while the parts travelled.
      return received.want_full && own != received.digest ? OverrideAnswer::kFull
                                                          : OverrideAnswer::kNothing;
    case OverrideSyncKind::kPush:
      break;
  }
  return OverrideAnswer::kNothing;
}

OverrideOutbox full_table(NodeId to, std::span<const OverrideRecord> records,
                          const OverrideDigest& own, bool want_full, const PeerLimits& limits,
                          size_t* unfit) {
  OverrideOutbox out;
  out.full_table = true;
  std::span<const OverrideRecord> rest = records;
  do {
    const size_t n = fit_overrides(rest, limits);
    if (n == 0 && !rest.empty()) {
      // Cannot happen for records within OverrideBounds; never loop on one that does.
      if (unfit != nullptr) ++*unfit;
      rest = rest.subspan(1);
      continue;
    }
    OverrideSyncMessage m;
    m.kind = OverrideSyncKind::kFull;
    m.digest = own;
    m.records.assign(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(n));
    rest = rest.subspan(n);
    m.want_full = want_full && rest.empty();
    out.messages.emplace_back(to, std::move(m));
  } while (!rest.empty());
  return out;
}

}  // namespace sluice::cluster
