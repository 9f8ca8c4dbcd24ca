// The runtime overrides table. Not on the hot path: Policy::compile turns it into the lookup
// tables resolve() uses.
#include <algorithm>

#include "rules/rules.h"

namespace sluice::rules {
namespace {

using Entry = std::pair<std::string, std::string>;

constexpr uint64_t kMaxRequests = uint64_t{1} << 40;  // as in the rules file

void sort_entries(std::vector<Entry>& entries) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.first < b.first; });
}

// Length-prefixed so that no choice of keys and values can make two different overrides share
// an id (entries may hold any bytes, including separators).
void append_part(std::string& id, std::string_view part) {
  id += std::to_string(part.size());
  id += ':';
  id += part;
}

std::string make_id(std::string_view domain, const std::vector<Entry>& sorted) {
  std::string id;
  append_part(id, domain);
  for (const auto& [k, v] : sorted) {
    append_part(id, k);
    append_part(id, v);
  }
  return id;
}

}  // namespace

std::string override_id(std::string_view domain, std::span<const Entry> entries) {
  std::vector<Entry> sorted(entries.begin(), entries.end());
  sort_entries(sorted);
  return make_id(domain, sorted);
}

Status Overrides::set(Override o) {
  const auto bad = [](std::string why) { return Status::InvalidArgument(std::move(why)); };
  if (o.domain.empty()) return bad("the override names no domain");
  if (o.entries.empty()) return bad("the override names no descriptor entries");
  sort_entries(o.entries);
  for (size_t i = 0; i < o.entries.size(); ++i) {
    if (o.entries[i].first.empty()) return bad("an override entry has an empty key");
    if (i > 0 && o.entries[i].first == o.entries[i - 1].first) {
      return bad("the override names the entry `" + o.entries[i].first + "` twice");
    }
  }
  if (o.limits.empty() && o.plan.empty() && !o.mode) {
    return bad("the override changes nothing: give limits, a plan or a mode");
  }
  for (size_t i = 0; i < o.limits.size(); ++i) {
    const Limit& l = o.limits[i];
    if (l.requests == 0 || l.requests > kMaxRequests) {
      return bad("limit " + std::to_string(i + 1) + ": the request count must be from 1 to 2^40");
    }
    // bucket_ms 0: no granularity given (the rule's, resolved when the policy is compiled).
    const window::WindowSpec spec =
        l.spec.bucket_ms == 0 ? window::make_spec(l.spec.window_ms) : l.spec;
    if (Status why = window::validate(spec); !why.ok()) {
      return bad("limit " + std::to_string(i + 1) + ": window: " + why.message());
    }
    for (size_t j = 0; j < i; ++j) {
      if (o.limits[j].spec.window_ms == l.spec.window_ms) {
        return bad("limits " + std::to_string(j + 1) + " and " + std::to_string(i + 1) +
                   " have the same window " + format_duration(l.spec.window_ms));
      }
    }
  }
  if (o.expires_at_ms < 0) return bad("the expiry time must not be negative (0 = never)");
  std::string id = make_id(o.domain, o.entries);
  by_id_.insert_or_assign(std::move(id), std::move(o));
  return {};
}

const Override* Overrides::get(std::string_view domain, std::span<const Entry> entries) const {
  auto it = by_id_.find(override_id(domain, entries));
  return it == by_id_.end() ? nullptr : &it->second;
}

bool Overrides::del(std::string_view domain, std::span<const Entry> entries) {
  return by_id_.erase(override_id(domain, entries)) > 0;
}

size_t Overrides::prune(int64_t now_ms) {
  return std::erase_if(by_id_, [now_ms](const auto& kv) {
    return kv.second.expires_at_ms != 0 && kv.second.expires_at_ms <= now_ms;
  });
}

std::vector<Override> Overrides::list() const {
  std::vector<Override> out;
  out.reserve(by_id_.size());
  for (const auto& [id, o] : by_id_)
    out.push_back(o);
  std::sort(out.begin(), out.end(), [](const Override& a, const Override& b) {
    if (a.domain != b.domain) return a.domain < b.domain;
    return a.entries < b.entries;
  });
  return out;
}

}  // namespace sluice::rules
