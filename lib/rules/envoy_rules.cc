// envoyproxy/ratelimit config files -> RuleSet (docs/envoy-config.md).
//
// Upstream's loader (src/config/config_impl.go) defines what a file means; this follows it:
// every map key anywhere must be one of upstream's keys (it checks keys, not where they are, and
// ignores known keys in places they mean nothing), lists hold maps, a descriptor's composite key
// (`key`, or `key_value`) is unique among its siblings, units are upstream's fixed names, and two
// files may not declare one domain. Unlike upstream, which stops at the first problem, every
// problem is reported, each with its file, line and field path.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>

#include "rules/policy_impl.h"
#include "rules/rules.h"
#include "rules/yaml_source.h"

namespace sluice::rules {
namespace {

constexpr std::string_view kKnownKeys[] = {"domain",
                                           "descriptors",
                                           "key",
                                           "value",
                                           "rate_limit",
                                           "unit",
                                           "requests_per_unit",
                                           "unlimited",
                                           "name",
                                           "replaces",
                                           "shadow_mode",
                                           "quota_mode",
                                           "detailed_metric",
                                           "value_to_metric",
                                           "share_threshold",
                                           "metadata"};

std::string ticked(std::string_view s) {
  return "`" + std::string(s) + "`";
}

// A plain (unquoted) scalar that YAML 1.1 (upstream's yaml.v2) reads as something other than a
// string: a number, a bool or null. Upstream refuses such map keys.
bool plain_non_string(const YAML::Node& n) {
  if (!n.IsScalar() || n.Tag() != "?") return false;
  const std::string& s = n.Scalar();
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return true;
  static constexpr std::string_view kBools[] = {
      "y",    "Y",    "yes",   "Yes",   "YES",   "n",  "N",  "no", "No",  "NO",  "true",
      "True", "TRUE", "false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF"};
  for (std::string_view b : kBools) {
    if (s == b) return true;
  }
  double d = 0;
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data() + (s[0] == '+' ? 1 : 0), end, d);
  return ec == std::errc() && ptr == end;
}

std::optional<bool> yaml11_bool(std::string_view s) {
  static constexpr std::string_view kTrue[] = {"y",    "Y",    "yes", "Yes", "YES", "true",
                                               "True", "TRUE", "on",  "On",  "ON"};
  static constexpr std::string_view kFalse[] = {"n",     "N",     "no",  "No",  "NO", "false",
                                                "False", "FALSE", "off", "Off", "OFF"};
  for (std::string_view t : kTrue) {
    if (s == t) return true;
  }
  for (std::string_view f : kFalse) {
    if (s == f) return false;
  }
  return std::nullopt;
}

class EnvoyParser {
 public:
  EnvoyParser(std::string_view file, const EnvoyImportOptions& options, ErrorList& errors)
      : file_(file), options_(options), errors_(errors) {}

  void parse_root(const YAML::Node& root);
  Domain take_domain() { return std::move(domain_); }
  void error(int line, std::string field, std::string message) {
    errors_.error(line, std::move(field), std::move(message));
  }

 private:
  // upstream's validateYamlKeys: every key of every map (metadata's contents aside) is known.
  void check_keys(const YAML::Node& map, const std::string& path);
  // The value of a map's field (a handle sharing the document's node), or nullopt.
  static std::optional<YAML::Node> field(const YAML::Node& map, std::string_view name);
  std::optional<std::string> scalar(const YAML::Node& n, int line, const std::string& path);
  bool flag(const YAML::Node& map, std::string_view name, const std::string& path);
  void parse_descriptors(const YAML::Node& list, int line, const std::string& path,
                         const std::string& parent_name, const std::vector<std::string>& keys,
                         std::vector<EnvoyNode>& out);
  void parse_rate_limit(const YAML::Node& n, int line, const std::string& path,
                        const std::string& name, bool shadow, bool quota,
                        const std::vector<std::string>& keys, EnvoyNode& node);

  std::string file_;
  EnvoyImportOptions options_;
  ErrorList& errors_;
  Domain domain_;
};

void EnvoyParser::check_keys(const YAML::Node& map, const std::string& path) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node key = it->first;
    const int line = line_of(key, 0);
    if (!key.IsScalar() || plain_non_string(key)) {
      error(line, path,
            "field names must be strings, got " +
                ticked(key.IsScalar() ? key.Scalar() : "a list or map"));
      continue;
    }
    const std::string& name = key.Scalar();
    const std::string sub = path.empty() ? name : path + "." + name;
    if (std::find(std::begin(kKnownKeys), std::end(kKnownKeys), name) == std::end(kKnownKeys)) {
      error(line, sub,
            "unknown field " + ticked(name) +
                " (upstream's fields: domain, descriptors, key, value, rate_limit, unit, "
                "requests_per_unit, unlimited, name, replaces, shadow_mode, quota_mode, "
                "detailed_metric, value_to_metric, share_threshold, metadata)");
      continue;
    }
    // Recurse where upstream's fields hold maps: descriptors and replaces (lists of maps) and
    // rate_limit. metadata is free-form (upstream converts it, never checks its keys); other
    // fields are single values, whose wrong shapes the typed reads report.
    const YAML::Node v = it->second;
    if ((name == "descriptors" || name == "replaces") && v.IsSequence()) {
      size_t i = 0;
      for (auto e = v.begin(); e != v.end(); ++e, ++i) {
        const std::string item = sub + "[" + std::to_string(i) + "]";
        if (!e->IsMap()) {
          error(line_of(*e, line), item, "list items must be maps");
          continue;
        }
        check_keys(*e, item);
      }
    } else if (name == "rate_limit" && v.IsMap()) {
      check_keys(v, sub);
    }
  }
}

// Copy-constructed, never assigned: assigning to a YAML::Node that already refers to a node
// rewrites that node in the document.
std::optional<YAML::Node> EnvoyParser::field(const YAML::Node& map, std::string_view name) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (it->first.IsScalar() && it->first.Scalar() == name) return YAML::Node(it->second);
  }
  return std::nullopt;
}

std::optional<std::string> EnvoyParser::scalar(const YAML::Node& n, int line,
                                               const std::string& path) {
  if (n.IsNull()) return std::string();
  if (!n.IsScalar()) {
    error(line, path, "must be a single value, got a list or map");
    return std::nullopt;
  }
  return n.Scalar();
}

bool EnvoyParser::flag(const YAML::Node& map, std::string_view name, const std::string& path) {
  const std::optional<YAML::Node> v = field(map, name);
  if (!v) return false;
  const std::string p = path + "." + std::string(name);
  auto s = scalar(*v, line_of(*v, line_of(map, 0)), p);
  if (!s) return false;
  if (s->empty()) return false;
  if (auto b = yaml11_bool(*s)) return *b;
  error(line_of(*v, 0), p, "must be true or false, got " + ticked(*s));
  return false;
}

void EnvoyParser::parse_root(const YAML::Node& root) {
  if (!root.IsDefined() || root.IsNull() || !root.IsMap()) {
    error(line_of(root, 1), "",
          "an envoy rate limit config is a map with `domain` and `descriptors`");
    return;
  }
  check_keys(root, "");
  const std::optional<YAML::Node> d = field(root, "domain");
  std::optional<std::string> name = !d ? std::string() : scalar(*d, line_of(*d, 1), "domain");
  if (name) domain_.name = *name;
  if (name && name->empty()) {
    error(!d ? line_of(root, 1) : line_of(*d, 1), "domain", "the domain must not be empty");
  }
  domain_.envoy = true;
  domain_.source = file_;
  if (const std::optional<YAML::Node> list = field(root, "descriptors")) {
    if (list->IsSequence()) {
      parse_descriptors(*list, line_of(*list, 1), "descriptors", "", {}, domain_.envoy_tree);
    } else if (!list->IsNull()) {
      error(line_of(*list, 1), "descriptors", "must be a list of descriptors");
    }
  }
}

void EnvoyParser::parse_descriptors(const YAML::Node& list, int line, const std::string& path,
                                    const std::string& parent_name,
                                    const std::vector<std::string>& keys,
                                    std::vector<EnvoyNode>& out) {
  size_t i = 0;
  for (auto it = list.begin(); it != list.end(); ++it, ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    const YAML::Node n = *it;
    const int nline = line_of(n, line);
    if (!n.IsMap()) continue;  // reported by check_keys
    EnvoyNode node;
    node.line = nline;
    if (const std::optional<YAML::Node> k = field(n, "key")) {
      if (auto s = scalar(*k, line_of(*k, nline), p + ".key")) node.key = *s;
    }
    if (node.key.empty()) {
      error(nline, p + ".key", "a descriptor needs a non-empty `key`");
      continue;
    }
    if (const std::optional<YAML::Node> v = field(n, "value")) {
      if (auto s = scalar(*v, line_of(*v, nline), p + ".value")) node.value = *s;
    }
    const std::string composite = node.value.empty() ? node.key : node.key + "_" + node.value;
    const std::string name = parent_name.empty() ? composite : parent_name + "." + composite;
    auto dup = std::find_if(out.begin(), out.end(), [&](const EnvoyNode& o) {
      return (o.value.empty() ? o.key : o.key + "_" + o.value) == composite;
    });
    if (dup != out.end()) {
      error(nline, p,
            "duplicate descriptor composite key " + ticked(name) + " (first on line " +
                std::to_string(dup->line) + ")");
      continue;
    }
    const bool shadow = flag(n, "shadow_mode", p);
    const bool quota = flag(n, "quota_mode", p);
    flag(n, "detailed_metric", p);
    flag(n, "value_to_metric", p);
    if (flag(n, "share_threshold", p) && composite.find('*') == std::string::npos) {
      error(nline, p + ".share_threshold",
            "share_threshold needs a wildcard ('*') in the key or value, got " + ticked(composite));
    }
    std::vector<std::string> path_keys = keys;
    path_keys.push_back(node.key);
    if (const std::optional<YAML::Node> rl = field(n, "rate_limit")) {
      const YAML::Node limit = *rl;
      if (limit.IsMap()) {
        parse_rate_limit(limit, line_of(limit, nline), p + ".rate_limit", name, shadow, quota,
                         path_keys, node);
      } else if (!limit.IsNull()) {
        error(line_of(limit, nline), p + ".rate_limit", "must be a map");
      }
    }
    if (const std::optional<YAML::Node> sub = field(n, "descriptors")) {
      if (sub->IsSequence()) {
        parse_descriptors(*sub, line_of(*sub, nline), p + ".descriptors", name, path_keys,
                          node.children);
      } else if (!sub->IsNull()) {
        error(line_of(*sub, nline), p + ".descriptors", "must be a list of descriptors");
      }
    }
    out.push_back(std::move(node));
  }
}

void EnvoyParser::parse_rate_limit(const YAML::Node& n, int line, const std::string& path,
                                   const std::string& name, bool shadow, bool quota,
                                   const std::vector<std::string>& keys, EnvoyNode& node) {
  std::string unit;
  const std::optional<YAML::Node> u = field(n, "unit");
  if (u) {
    if (auto s = scalar(*u, line_of(*u, line), path + ".unit")) unit = *s;
  }
  const int unit_line = u ? line_of(*u, line) : line;
  const std::optional<int64_t> window_ms = envoy_unit_ms(unit);
  node.unlimited = flag(n, "unlimited", path);
  if (node.unlimited) {
    if (window_ms)
      error(unit_line, path + ".unit", "a rate limit with `unlimited: true` takes no unit");
  } else if (!window_ms) {
    error(unit_line, path + ".unit",
          "invalid unit " + ticked(unit) + " (second, minute, hour, day, week, month or year)");
  }
  uint64_t requests = 0;
  if (const std::optional<YAML::Node> r = field(n, "requests_per_unit")) {
    const int rline = line_of(*r, line);
    if (auto s = scalar(*r, rline, path + ".requests_per_unit")) {
      const auto [ptr, ec] = std::from_chars(s->data(), s->data() + s->size(), requests);
      if (s->empty() || ec != std::errc() || ptr != s->data() + s->size() ||
          requests > 0xFFFF'FFFFull) {
        error(rline, path + ".requests_per_unit",
              "must be a whole number from 0 to 4294967295, got " + ticked(*s));
      }
    }
  }
  std::string limit_name;
  if (const std::optional<YAML::Node> nm = field(n, "name")) {
    if (auto s = scalar(*nm, line_of(*nm, line), path + ".name")) limit_name = *s;
  }
  std::vector<std::string> replaces;
  if (const std::optional<YAML::Node> rp = field(n, "replaces")) {
    const YAML::Node list = *rp;
    if (list.IsSequence()) {
      size_t i = 0;
      for (auto it = list.begin(); it != list.end(); ++it, ++i) {
        const std::string rpath = path + ".replaces[" + std::to_string(i) + "]";
        if (!it->IsMap()) continue;  // reported by check_keys
        std::string target;
        if (const std::optional<YAML::Node> t = field(*it, "name")) {
          if (auto s = scalar(*t, line_of(*t, line), rpath + ".name")) target = *s;
        }
        const int rline = line_of(*it, line);
        if (target.empty()) {
          error(rline, rpath, "a `replaces` entry needs a non-empty `name`");
        } else if (target == limit_name) {
          error(rline, rpath, "a rate limit cannot replace itself (" + ticked(target) + ")");
        } else {
          replaces.push_back(target);
        }
      }
    } else if (!list.IsNull()) {
      error(line_of(list, line), path + ".replaces", "must be a list of {name: ...}");
    }
  }
  if (node.unlimited || !window_ms) return;
  Rule r;
  r.name = name;
  r.key = keys;
  Limit l;
  l.name = limit_name;
  l.requests = requests;
  l.spec = window::make_spec(*window_ms);
  l.default_bucket = true;
  r.limits.push_back(std::move(l));
  r.mode = shadow ? Mode::kDryRun : Mode::kEnforce;
  r.count_denied = options_.count_denied;
  r.line = node.line;  // the descriptor's `- key:` line
  r.replaces = std::move(replaces);
  r.quota_mode = quota;
  node.rule = static_cast<int32_t>(domain_.rules.size());
  domain_.rules.push_back(std::move(r));
}

}  // namespace

std::optional<int64_t> envoy_unit_ms(std::string_view unit) {
  for (const EnvoyUnit& u : kEnvoyUnits) {
    if (unit.size() == u.name.size() &&
        std::equal(unit.begin(), unit.end(), u.name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == b;
        })) {
      return u.ms;
    }
  }
  return std::nullopt;
}

std::string_view envoy_unit_name(int64_t window_ms) {
  for (const EnvoyUnit& u : kEnvoyUnits) {
    if (u.ms == window_ms) return u.name;
  }
  return {};
}

ParseResult parse_envoy_rules(std::string_view text, std::string_view file,
                              const EnvoyImportOptions& options) {
  ParseResult result;
  ErrorList errors(file);
  EnvoyParser parser(file, options, errors);
  parse_yaml_document(text, "the file", errors,
                      [&](const YAML::Node& root) { parser.parse_root(root); });
  result.errors = errors.take();
  if (result.errors.empty()) {
    result.rules.emplace();
    result.rules->domains.push_back(parser.take_domain());
  }
  return result;
}

ParseResult load_envoy_rules(const std::string& path, const EnvoyImportOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      const std::string ext = e.path().extension().string();
      if ((ext == ".yaml" || ext == ".yml") && e.is_regular_file(ec))
        files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(path, ec)) {
    files.push_back(path);
  }
  ParseResult out;
  if (files.empty()) {
    out.errors.push_back(ParseError{
        path, 0, "", "no envoy rate limit config here (a .yaml file, or a directory of them)"});
    return out;
  }
  RuleSet all;
  for (const std::string& f : files) {
    ParseResult r;
    if (std::optional<std::string> text = read_text_file(f, "the file", r.errors)) {
      r = parse_envoy_rules(*text, f, options);
    }
    if (!r.errors.empty()) {
      out.errors.insert(out.errors.end(), r.errors.begin(), r.errors.end());
      continue;
    }
    for (ParseError& e : merge_rule_sets(all, std::move(*r.rules), "", f))
      out.errors.push_back(std::move(e));
  }
  if (out.errors.empty()) out.rules = std::move(all);
  return out;
}

std::vector<ParseError> merge_rule_sets(RuleSet& into, RuleSet extra, std::string_view into_file,
                                        std::string_view extra_file) {
  std::vector<ParseError> errors;
  for (Domain& d : extra.domains) {
    auto prev = std::find_if(into.domains.begin(), into.domains.end(),
                             [&](const Domain& o) { return o.name == d.name; });
    if (prev != into.domains.end()) {
      const std::string first = prev->source.empty() ? std::string(into_file) : prev->source;
      errors.push_back(
          ParseError{d.source.empty() ? std::string(extra_file) : d.source, 0, "domain",
                     "duplicate domain " + ticked(d.name) + " (also in " + first + ")"});
      continue;
    }
    into.domains.push_back(std::move(d));
  }
  return errors;
}

}  // namespace sluice::rules
