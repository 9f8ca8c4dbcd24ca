// The OverrideSync payload (override_codec.h).
#include "cluster/override_codec.h"

#include <capnp/message.h>

#include <algorithm>
#include <string_view>

namespace sluice::cluster::detail {
namespace {

namespace ps = schema::peer;

constexpr size_t kWordBytes = 8;
constexpr size_t kSegmentTableWords = 1;
constexpr size_t kRootPointerWords = 1;
constexpr uint16_t kSyncKinds = 3;  // OverrideSyncKind::kFull + 1
constexpr uint16_t kModes = 4;      // OverrideMode: keep + rules::Mode's three

template <typename S>
constexpr size_t struct_words() {
  return size_t{S::_capnpPrivate::dataWordSize} + S::_capnpPrivate::pointerCount;
}
template <typename S>
constexpr size_t struct_list_words(size_t n) {
  return n == 0 ? 0 : 1 + n * struct_words<S>();
}
constexpr size_t text_words(std::string_view s) {
  return s.empty() ? 0 : (s.size() + 1 + kWordBytes - 1) / kWordBytes;
}

size_t record_words(const OverrideRecord& r) {
  const rules::Override& o = r.value;
  size_t w = struct_words<ps::OverrideRecord>() + text_words(o.domain) + text_words(o.plan) +
             struct_list_words<ps::OverrideEntry>(o.entries.size()) +
             struct_list_words<ps::OverrideLimit>(o.limits.size());
  for (const auto& [k, v] : o.entries)
    w += text_words(k) + text_words(v);
  for (const rules::Limit& l : o.limits)
    w += text_words(l.name);
  return w;
}

constexpr size_t fixed_words() {
  return kRootPointerWords + struct_words<ps::Envelope>() + struct_words<ps::OverrideSync>() +
         1;  // the records list's tag word
}

size_t datagram_bytes(size_t words) {
  return (kSegmentTableWords + words) * kWordBytes + kPeerTagBytes;
}

capnp::Text::Reader text(const std::string& s) {
  return {s.data(), s.size()};
}

std::string_view view(capnp::Text::Reader t) {
  return {t.begin(), t.size()};
}

// The wire's bounds are OverrideBounds' defaults: a longer string or more entries than any node
// accepts is not a record of ours.
PeerError check_bounds(size_t strings_max, size_t entries, size_t limits) {
  const OverrideBounds b;
  if (strings_max > b.max_string_bytes) return PeerError::kStringTooLong;
  if (entries > b.max_entries || limits > b.max_limits) return PeerError::kTooManyEntries;
  return PeerError::kOk;
}

size_t longest(const OverrideRecord& r) {
  const rules::Override& o = r.value;
  size_t m = std::max(o.domain.size(), o.plan.size());
  for (const auto& [k, v] : o.entries)
    m = std::max({m, k.size(), v.size()});
  for (const rules::Limit& l : o.limits)
    m = std::max(m, l.name.size());
  return m;
}

}  // namespace

size_t override_sync_words(const OverrideSyncMessage& m) {
  size_t w = struct_words<ps::OverrideSync>() + (m.records.empty() ? 0 : 1);  // the list's tag word
  for (const OverrideRecord& r : m.records)
    w += record_words(r);
  return w;
}

PeerError check_override_sync(const OverrideSyncMessage& m, const PeerLimits& limits) {
  if (static_cast<uint16_t>(m.kind) >= kSyncKinds) return PeerError::kBadField;
  if (m.records.size() > limits.max_override_records) return PeerError::kTooManyEntries;
  for (const OverrideRecord& r : m.records) {
    const PeerError e = check_bounds(longest(r), r.value.entries.size(), r.value.limits.size());
    if (e != PeerError::kOk) return e;
    for (const rules::Limit& l : r.value.limits) {
      // The wire carries 32-bit window and bucket sizes (a day in ms fits).
      if (l.spec.window_ms < 0 || l.spec.window_ms > UINT32_MAX || l.spec.bucket_ms < 0 ||
          l.spec.bucket_ms > UINT32_MAX)
        return PeerError::kBadWindow;
    }
    if (r.value.mode && static_cast<uint16_t>(*r.value.mode) + 1 >= kModes)
      return PeerError::kBadField;
  }
  return PeerError::kOk;
}

void write_override_sync(ps::OverrideSync::Builder out, const OverrideSyncMessage& m) {
  out.setKind(static_cast<ps::OverrideSyncKind>(m.kind));
  out.setCount(m.digest.count);
  out.setHash(m.digest.hash);
  out.setWantFull(m.want_full);
  if (m.records.empty()) return;
  auto list = out.initRecords(static_cast<unsigned int>(m.records.size()));
  for (size_t i = 0; i < m.records.size(); ++i) {
    const OverrideRecord& r = m.records[i];
    const rules::Override& o = r.value;
    auto w = list[static_cast<unsigned int>(i)];
    w.setVersionMs(r.version.ms);
    w.setVersionNode(r.version.node);
    w.setDeleted(r.deleted);
    if (!o.domain.empty()) w.setDomain(text(o.domain));
    if (!o.entries.empty()) {
      auto entries = w.initEntries(static_cast<unsigned int>(o.entries.size()));
      for (size_t k = 0; k < o.entries.size(); ++k) {
        auto e = entries[static_cast<unsigned int>(k)];
        if (!o.entries[k].first.empty()) e.setKey(text(o.entries[k].first));
        if (!o.entries[k].second.empty()) e.setValue(text(o.entries[k].second));
      }
    }
    if (!o.limits.empty()) {
      auto limits = w.initLimits(static_cast<unsigned int>(o.limits.size()));
      for (size_t k = 0; k < o.limits.size(); ++k) {
        const rules::Limit& l = o.limits[k];
        auto b = limits[static_cast<unsigned int>(k)];
        if (!l.name.empty()) b.setName(text(l.name));
        b.setRequests(l.requests);
        // check_override_sync() bounded both to 32 bits.
        b.setWindowMs(static_cast<uint32_t>(l.spec.window_ms));
        b.setBucketMs(static_cast<uint32_t>(l.spec.bucket_ms));
      }
    }
    if (!o.plan.empty()) w.setPlan(text(o.plan));
    w.setMode(o.mode ? static_cast<ps::OverrideMode>(static_cast<uint16_t>(*o.mode) + 1)
                     : ps::OverrideMode::KEEP);
    w.setExpiresAtMs(o.expires_at_ms);
  }
}

PeerError read_override_sync(ps::OverrideSync::Reader in, uint16_t from, const PeerLimits& limits,
                             OverrideSyncMessage& out) {
  out.from = from;
  const auto kind = static_cast<uint16_t>(in.getKind());
  if (kind >= kSyncKinds) return PeerError::kBadField;
  out.kind = static_cast<OverrideSyncKind>(kind);
  out.digest = {in.getCount(), in.getHash()};
  out.want_full = in.getWantFull();
  auto records = in.getRecords();
  if (records.size() > limits.max_override_records) return PeerError::kTooManyEntries;
  out.records.resize(records.size());
  for (unsigned int i = 0; i < records.size(); ++i) {
    auto r = records[i];
    OverrideRecord& rec = out.records[i];
    rules::Override& o = rec.value;
    auto entries = r.getEntries();
    auto lims = r.getLimits();
    if (PeerError e = check_bounds(0, entries.size(), lims.size()); e != PeerError::kOk) return e;
    rec.version = {r.getVersionMs(), r.getVersionNode()};
    rec.deleted = r.getDeleted();
    const std::string_view domain = view(r.getDomain());
    const std::string_view plan = view(r.getPlan());
    if (PeerError e = check_bounds(std::max(domain.size(), plan.size()), 0, 0); e != PeerError::kOk)
      return e;
    o.domain.assign(domain);
    o.plan.assign(plan);
    o.entries.resize(entries.size());
    for (unsigned int k = 0; k < entries.size(); ++k) {
      const std::string_view key = view(entries[k].getKey());
      const std::string_view value = view(entries[k].getValue());
      if (PeerError e = check_bounds(std::max(key.size(), value.size()), 0, 0); e != PeerError::kOk)
        return e;
      o.entries[k].first.assign(key);
      o.entries[k].second.assign(value);
    }
    o.limits.resize(lims.size());
    for (unsigned int k = 0; k < lims.size(); ++k) {
      auto l = lims[k];
      const std::string_view name = view(l.getName());
      if (PeerError e = check_bounds(name.size(), 0, 0); e != PeerError::kOk) return e;
      o.limits[k].name.assign(name);
      o.limits[k].requests = l.getRequests();
      o.limits[k].spec = window::WindowSpec{l.getWindowMs(), l.getBucketMs()};
    }
    const auto mode = static_cast<uint16_t>(r.getMode());
    if (mode >= kModes) return PeerError::kBadField;
    o.mode = mode == 0 ? std::nullopt : std::optional(static_cast<rules::Mode>(mode - 1));
    o.expires_at_ms = r.getExpiresAtMs();
  }
  return PeerError::kOk;
}

}  // namespace sluice::cluster::detail

namespace sluice::cluster {

size_t fit_overrides(std::span<const OverrideRecord> records, const PeerLimits& limits) {
  size_t words = detail::fixed_words();
  size_t n = 0;
  for (const OverrideRecord& r : records) {
    if (n >= limits.max_override_records) break;
    const size_t next = words + detail::record_words(r);
    if (detail::datagram_bytes(next) > limits.max_datagram_bytes) break;
    words = next;
    ++n;
  }
  return n;
}

}  // namespace sluice::cluster
