// The envoyproxy/ratelimit descriptor walk (upstream's GetLimit, src/config/config_impl.go) over
// a compiled tree. The walk runs on the hot path: it allocates nothing. Upstream looks children
// up by the string "key_value" (and "key"); here that string is never built: its hash is computed
// from the two pieces and candidates are compared piece by piece, so the same pairs match
// (including upstream's conflation of key "a_b" with key "a" and value "b").
#include <algorithm>

#include "rules/policy_impl.h"

namespace sluice::rules {
namespace {

// "key" + '_' + "value" without building it.
class Joined {
 public:
  Joined(std::string_view key, std::string_view value) : key_(key), value_(value) {}
  size_t size() const { return key_.size() + 1 + value_.size(); }
  char operator[](size_t i) const {
    if (i < key_.size()) return key_[i];
    if (i == key_.size()) return '_';
    return value_[i - key_.size() - 1];
  }
  bool equals(std::string_view s) const {
    return s.size() == size() && s.substr(0, key_.size()) == key_ && s[key_.size()] == '_' &&
           s.substr(key_.size() + 1) == value_;
  }
  // Whether `part` occurs at position `at`.
  bool has_at(size_t at, std::string_view part) const {
    if (at + part.size() > size()) return false;
    for (size_t i = 0; i < part.size(); ++i) {
      if ((*this)[at + i] != part[i]) return false;
    }
    return true;
  }
  // The first position >= from and <= last - part.size() where `part` occurs, or npos.
  size_t find(std::string_view part, size_t from, size_t last) const {
    for (size_t at = from; at + part.size() <= last; ++at) {
      if (has_at(at, part)) return at;
    }
    return std::string_view::npos;
  }

 private:
  std::string_view key_;
  std::string_view value_;
};

// FNV-1a: fed piece by piece, so "key" "_" "value" hashes as the joined string would.
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
uint64_t fnv(uint64_t h, std::string_view s) {
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}
uint64_t hash_joined(std::string_view key, std::string_view value) {
  return fnv(fnv(fnv(kFnvOffset, key), "_"), value);
}

// Upstream's wildcardMatch: each '*' stands for any run of characters (possibly none); the first
// and last literal parts anchor the ends, middle parts are found left to right.
bool wildcard_match(std::span<const std::string_view> parts, const Joined& v) {
  if (parts.size() == 1) return v.equals(parts[0]);
  const std::string_view first = parts.front();
  const std::string_view last = parts.back();
  size_t fixed = 0;
  for (std::string_view p : parts)
    fixed += p.size();
  if (v.size() < fixed) return false;
  if (!v.has_at(0, first) || !v.has_at(v.size() - last.size(), last)) return false;
  size_t pos = first.size();
  const size_t end = v.size() - last.size();
  for (size_t i = 1; i + 1 < parts.size(); ++i) {
    const size_t at = v.find(parts[i], pos, end);
    if (at == std::string_view::npos) return false;
    pos = at + parts[i].size();
  }
  return true;
}

const CompiledEnvoyNode* child(const CompiledEnvoyTree& t, const CompiledEnvoyNode& parent,
                               uint64_t h, const auto& same) {
  const auto begin = t.index.begin() + parent.first_index;
  const auto end = begin + parent.num_children;
  for (auto it = std::lower_bound(begin, end, std::pair<uint64_t, uint32_t>{h, 0});
       it != end && it->first == h; ++it) {
    if (same(t.nodes[it->second].composite)) return &t.nodes[it->second];
  }
  return nullptr;
}

}  // namespace

void compile_envoy_tree(const Domain& d, CompiledEnvoyTree& out) {
  // Breadth-first, so each node's children are laid out together and its index run is contiguous.
  struct Pending {
    const std::vector<EnvoyNode>* children;
    uint32_t parent;
  };
  out.nodes.clear();
  out.nodes.emplace_back();  // the domain
  std::vector<Pending> queue{{&d.envoy_tree, 0}};
  for (size_t q = 0; q < queue.size(); ++q) {
    const Pending pending = queue[q];
    const auto first = static_cast<uint32_t>(out.nodes.size());
    for (const EnvoyNode& n : *pending.children) {
      CompiledEnvoyNode c;
      c.composite = n.value.empty() ? n.key : n.key + "_" + n.value;
      c.rule = n.rule;
      c.unlimited = n.unlimited;
      out.nodes.push_back(std::move(c));
    }
    for (size_t i = 0; i < pending.children->size(); ++i)
      queue.push_back({&(*pending.children)[i].children, first + static_cast<uint32_t>(i)});
    CompiledEnvoyNode& parent = out.nodes[pending.parent];
    parent.num_children = static_cast<uint32_t>(pending.children->size());
    parent.first_index = first;  // fixed up below into index positions
  }
  // Index and wildcard runs, now that the nodes no longer move (parts point into them).
  for (CompiledEnvoyNode& parent : out.nodes) {
    const uint32_t first = parent.first_index;
    parent.first_index = static_cast<uint32_t>(out.index.size());
    parent.first_wild = static_cast<uint32_t>(out.wild.size());
    for (uint32_t i = first; i < first + parent.num_children; ++i) {
      const std::string& c = out.nodes[i].composite;
      out.index.emplace_back(fnv(kFnvOffset, c), i);
      if (c.find('*') == std::string::npos) continue;
      EnvoyWildcard w{i, static_cast<uint32_t>(out.parts.size()), 0};
      size_t start = 0;
      for (size_t star = c.find('*');; star = c.find('*', start)) {
        out.parts.emplace_back(std::string_view(c).substr(
            start, star == std::string::npos ? std::string::npos : star - start));
        ++w.num_parts;
        if (star == std::string::npos) break;
        start = star + 1;
      }
      out.wild.push_back(w);
    }
    parent.num_wild = static_cast<uint32_t>(out.wild.size()) - parent.first_wild;
    std::sort(out.index.begin() + parent.first_index, out.index.end());
  }
  for (const Rule& r : d.rules)
    out.has_replaces = out.has_replaces || !r.replaces.empty() || r.quota_mode;
}

const CompiledEnvoyNode* envoy_walk(const CompiledEnvoyTree& t,
                                    std::span<const Descriptor> entries) {
  if (t.nodes.empty()) return nullptr;
  const CompiledEnvoyNode* level = &t.nodes[0];
  for (size_t i = 0; i < entries.size(); ++i) {
    const Descriptor& e = entries[i];
    const Joined joined(e.key, e.value);
    // key_value exactly, else the first wildcard that matches key_value, else the key alone.
    const CompiledEnvoyNode* next = child(t, *level, hash_joined(e.key, e.value),
                                          [&](std::string_view c) { return joined.equals(c); });
    for (uint32_t w = 0; next == nullptr && w < level->num_wild; ++w) {
      const EnvoyWildcard& wc = t.wild[level->first_wild + w];
      if (wildcard_match({t.parts.data() + wc.first_part, wc.num_parts}, joined)) {
        next = &t.nodes[wc.node];
      }
    }
    if (next == nullptr) {
      next =
          child(t, *level, fnv(kFnvOffset, e.key), [&](std::string_view c) { return c == e.key; });
    }
    if (next == nullptr) return nullptr;
    if (i + 1 == entries.size()) return next;
    // Deeper entries than the tree: no limit (upstream: "request depth does not match").
    if (next->num_children == 0) return nullptr;
    level = next;
  }
  return nullptr;
}

}  // namespace sluice::rules
