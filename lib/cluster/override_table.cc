// The versioned overrides table (override_table.h).
#include "cluster/override_table.h"

#include <xxhash.h>

#include <algorithm>
#include <limits>
#include <utility>

namespace sluice::cluster {
namespace {

using Entry = std::pair<std::string, std::string>;

void sort_entries(std::vector<Entry>& e) {
  std::sort(e.begin(), e.end(), [](const Entry& a, const Entry& b) { return a.first < b.first; });
}

void put_part(std::string& out, std::string_view part) {
  out += std::to_string(part.size());
  out += ':';
  out += part;
}

void put_number(std::string& out, int64_t v) {
  out += std::to_string(v);
  out += ';';
}

// A tombstone is its domain, entries and version: whatever else it carried is dropped, so two
// tombstones of one version are equal whatever the writer left in them.
void normalize(OverrideRecord& r) {
  sort_entries(r.value.entries);
  if (!r.deleted) return;
  r.value.limits.clear();
  r.value.plan.clear();
  r.value.mode.reset();
  r.value.expires_at_ms = 0;
}

int64_t add_saturating(int64_t a, int64_t b) {
  if (a > std::numeric_limits<int64_t>::max() - b) return std::numeric_limits<int64_t>::max();
  return a + b;
}

}  // namespace

std::string record_id(const OverrideRecord& r) {
  return rules::override_id(r.value.domain, r.value.entries);
}

std::string canonical(const OverrideRecord& r) {
  OverrideRecord n = r;
  normalize(n);
  std::string out = rules::override_id(n.value.domain, n.value.entries);
  put_number(out, n.version.ms);
  put_number(out, n.version.node);
  put_number(out, n.deleted ? 1 : 0);
  if (n.deleted) return out;
  put_number(out, static_cast<int64_t>(n.value.limits.size()));
  for (const rules::Limit& l : n.value.limits) {
    put_part(out, l.name);
    put_number(out, static_cast<int64_t>(l.requests));
    put_number(out, l.spec.window_ms);
    put_number(out, l.spec.bucket_ms);
  }
  put_part(out, n.value.plan);
  put_number(out, n.value.mode ? static_cast<int64_t>(*n.value.mode) + 1 : 0);
  put_number(out, n.value.expires_at_ms);
  return out;
}

bool operator==(const OverrideRecord& a, const OverrideRecord& b) {
  return canonical(a) == canonical(b);
}

bool newer(const OverrideRecord& a, const OverrideRecord& b) {
  if (a.version != b.version) return a.version > b.version;
  if (a.deleted != b.deleted) return a.deleted;
  return canonical(a) > canonical(b);
}

std::string check_record(const OverrideRecord& r, int64_t now_ms, const OverrideBounds& b) {
  const rules::Override& o = r.value;
  auto too_long = [&](std::string_view s) { return s.size() > b.max_string_bytes; };
  const std::string max = std::to_string(b.max_string_bytes);
  if (too_long(o.domain)) return "too_long: the domain is over " + max + " bytes";
  if (o.domain.empty()) return "invalid: the override names no domain";
  if (o.entries.size() > b.max_entries) {
    return "too_many: over " + std::to_string(b.max_entries) + " descriptor entries";
  }
  for (const auto& [k, v] : o.entries) {
    if (too_long(k) || too_long(v)) return "too_long: a descriptor entry is over " + max + " bytes";
  }
  if (o.limits.size() > b.max_limits) {
    return "too_many: over " + std::to_string(b.max_limits) + " limits";
  }
  for (const rules::Limit& l : o.limits) {
    if (too_long(l.name)) return "too_long: a limit name is over " + max + " bytes";
  }
  if (too_long(o.plan)) return "too_long: the plan name is over " + max + " bytes";
  if (r.version.ms < 0) return "invalid: a negative version";
  if (r.version.ms > add_saturating(now_ms, b.max_future_ms)) {
    return "from_future: the version is " + std::to_string(r.version.ms - now_ms) +
           " ms ahead of this node's clock";
  }
  if (r.deleted) {
    // A tombstone needs only a valid identity: a set of it would have been valid too.
    rules::Override probe;
    probe.domain = o.domain;
    probe.entries = o.entries;
    probe.mode = rules::Mode::kEnforce;
    rules::Overrides scratch;
    if (Status s = scratch.set(std::move(probe)); !s.ok()) return "invalid: " + s.message();
    return {};
  }
  rules::Overrides scratch;
  if (Status s = scratch.set(o); !s.ok()) return "invalid: " + s.message();
  return {};
}

std::string_view reason_label(std::string_view why) {
  return why.substr(0, why.find(':'));
}

OverrideTable::OverrideTable(int64_t tombstone_ttl_ms) : ttl_ms_(tombstone_ttl_ms) {}

OverrideVersion OverrideTable::next_version(std::string_view id, uint16_t self,
                                            int64_t now_ms) const {
  OverrideVersion v{now_ms, self};
  if (const OverrideRecord* cur = find(id)) {
    v.ms = std::max(now_ms, add_saturating(cur->version.ms, 1));
  }
  return v;
}

int64_t OverrideTable::horizon_ms(const OverrideRecord& r) const {
  if (r.deleted) return add_saturating(r.version.ms, ttl_ms_);
  if (r.value.expires_at_ms != 0) return add_saturating(r.value.expires_at_ms, ttl_ms_);
  return std::numeric_limits<int64_t>::max();
}

OverrideTable::Offer OverrideTable::offer(const OverrideRecord& r, int64_t now_ms) const {
  if (horizon_ms(r) <= now_ms) return Offer::kExpired;
  const OverrideRecord* cur = find(record_id(r));
  if (cur == nullptr || horizon_ms(*cur) <= now_ms) return Offer::kNewer;
  OverrideRecord n = r;
  normalize(n);
  return newer(n, *cur) ? Offer::kNewer : Offer::kKnown;
}

OverrideTable::Offer OverrideTable::merge(OverrideRecord r, int64_t now_ms) {
  const Offer o = offer(r, now_ms);
  if (o != Offer::kNewer) return o;
  normalize(r);
  std::string id = record_id(r);
  by_id_.insert_or_assign(std::move(id), std::move(r));
  return o;
}

const OverrideRecord* OverrideTable::find(std::string_view id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

std::vector<std::string> OverrideTable::forget_expired(int64_t now_ms) {
  std::vector<std::string> gone;
  for (auto it = by_id_.begin(); it != by_id_.end();) {
    if (horizon_ms(it->second) <= now_ms) {
      gone.push_back(it->first);
      it = by_id_.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

OverrideDigest OverrideTable::digest(int64_t now_ms) const {
  OverrideDigest d;
  for (const auto& [id, r] : by_id_) {
    if (horizon_ms(r) <= now_ms) continue;
    const std::string c = canonical(r);
    ++d.count;
    d.hash += XXH3_64bits(c.data(), c.size());
  }
  return d;
}

std::vector<OverrideRecord> OverrideTable::records(int64_t now_ms) const {
  std::vector<OverrideRecord> out;
  out.reserve(by_id_.size());
  for (const auto& [id, r] : by_id_) {
    if (horizon_ms(r) > now_ms) out.push_back(r);
  }
  return out;
}

}  // namespace sluice::cluster
