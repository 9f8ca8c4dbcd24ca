// The rules file: YAML text -> RuleSet, or every error found, each with its line and field path.
//
// yaml-cpp builds a node tree (and throws on syntax errors); this file walks that tree field by
// field. Every map is read through `read_fields`, which rejects unknown and repeated field names,
// so a typo never silently turns into a default. Errors are collected, not thrown, and sorted by
// line at the end, because cross-references (a rule's default plan, duplicate names) are checked
// after the fields they refer to have been read.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>

#include "rules/rules.h"
#include "rules/yaml_source.h"

namespace sluice::rules {
namespace {

// 2^40: far above any sensible limit, and a bound the window code's 128-bit arithmetic is sure of.
constexpr uint64_t kMaxRequests = uint64_t{1} << 40;

struct Unit {
  std::string_view suffix;
  int64_t ms;
};
// Smallest first; format_duration walks them from the largest down.
constexpr Unit kUnits[] = {
    {"ms", 1}, {"s", 1'000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000}};

std::string ticked(std::string_view s) {
  return "`" + std::string(s) + "`";
}

std::optional<uint64_t> parse_count(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  if (v == 0 || v > kMaxRequests) return std::nullopt;
  return v;
}

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

// Names of domains, rules, plans: they appear in stats names ("<domain>/<rule>") and in answers.
bool valid_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), name_char);
}

// Limit names go into RateLimit-Policy headers; the default names contain ':' and '/'.
bool valid_limit_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [](char c) { return name_char(c) || c == ':' || c == '/'; });
}

std::string default_limit_name(std::string_view owner, const Limit& l) {
  if (l.algorithm == Algorithm::kGcra) {
    return std::string(owner) + ":" + std::to_string(l.rate_requests) + "/" +
           format_duration(l.rate_period_ms) + ":burst-" + std::to_string(l.requests);
  }
  if (l.algorithm == Algorithm::kConcurrency) {
    return std::string(owner) + ":" + std::to_string(l.requests) + "-in-flight";
  }
  return std::string(owner) + ":" + std::to_string(l.requests) + "/" +
         format_duration(l.spec.window_ms);
}

// One field of a YAML map. `line` is where the value is (or the key's line when the value is
// empty: yaml-cpp marks an empty value at the start of the next token, often the next line).
struct Field {
  std::string name;
  YAML::Node value;
  int line = 0;
  std::string path;
};

class Fields {
 public:
  const Field* find(std::string_view name) const {
    for (const Field& f : fields_) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }
  void add(Field f) { fields_.push_back(std::move(f)); }

 private:
  std::vector<Field> fields_;
};

std::string index_path(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

std::string_view type_name(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "a single value";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "an undefined value";
  }
}

class RulesParser {
 public:
  explicit RulesParser(ErrorList& errors) : errors_(errors) {}

  void parse_root(const YAML::Node& root);
  RuleSet take_rules() { return std::move(rules_); }
  void error(int line, std::string field, std::string message) {
    errors_.error(line, std::move(field), std::move(message));
  }

 private:
  // Reads a map's fields; unknown, repeated or non-scalar field names are errors.
  Fields read_fields(const YAML::Node& map, const std::string& path,
                     std::initializer_list<std::string_view> known);
  bool expect(const YAML::Node& n, YAML::NodeType::value type, int line, const std::string& path,
              std::string_view what);
  std::optional<std::string> read_string(const Field& f);
  std::optional<std::string> read_name(const Field& f);
  std::optional<bool> read_bool(const Field& f);
  std::optional<int64_t> read_duration(const Field& f);
  template <typename T>
  std::optional<T> read_choice(const Field& f,
                               std::initializer_list<std::pair<std::string_view, T>> choices);

  void parse_domain(const YAML::Node& n, int line, const std::string& path, Domain& d);
  void parse_plans(const Field& f, Domain& d);
  void parse_rule(const YAML::Node& n, int line, const std::string& path, const Domain& d, Rule& r);
  void parse_match(const Field& f, Rule& r);
  void parse_key(const Field& f, Rule& r);
  void parse_rule_plan(const Field& plan, const Domain& d, Rule& r);
  void parse_rule_modes(const Fields& fields, Rule& r);
  // Reads a list of limits; `owner` names them by default ("<owner>:<N>/<window>").
  void parse_limits(const Field& f, std::string_view owner, int64_t bucket_ms,
                    std::vector<Limit>& out);
  bool parse_concurrency_node(const Fields& fields, int line, const std::string& path,
                              std::string_view owner, Limit& out);
  bool parse_gcra_node(const Fields& fields, int line, const std::string& path,
                       std::string_view owner, Limit& out);
  bool read_limit_name(const Fields& fields, Limit& out);
  bool parse_limit_node(const YAML::Node& n, int line, const std::string& path,
                        std::string_view owner, int64_t bucket_ms, Limit& out);

  ErrorList& errors_;
  RuleSet rules_;
};

Fields RulesParser::read_fields(const YAML::Node& map, const std::string& path,
                                std::initializer_list<std::string_view> known) {
  Fields out;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node key = it->first;  // a copy: it-> yields a temporary
    const int key_line = line_of(key, 0);
    if (!key.IsScalar()) {
      error(key_line, path, "field names must be plain words");
      continue;
    }
    const std::string& name = key.Scalar();
    const std::string field_path = path.empty() ? name : path + "." + name;
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string expected;
      for (std::string_view k : known)
        expected += (expected.empty() ? "" : ", ") + std::string(k);
      error(key_line, field_path,
            "unknown field " + ticked(name) + " (expected one of: " + expected + ")");
      continue;
    }
    if (const Field* first = out.find(name)) {
      error(key_line, field_path,
            "field " + ticked(name) + " is repeated (first on line " + std::to_string(first->line) +
                ")");
      continue;
    }
    out.add(Field{name, it->second, line_of(it->second, key_line), field_path});
  }
  return out;
}

bool RulesParser::expect(const YAML::Node& n, YAML::NodeType::value type, int line,
                         const std::string& path, std::string_view what) {
  if (n.Type() == type) return true;
  error(line, path, "must be " + std::string(what) + ", got " + std::string(type_name(n)));
  return false;
}

std::optional<std::string> RulesParser::read_string(const Field& f) {
  if (!expect(f.value, YAML::NodeType::Scalar, f.line, f.path, "a single value")) {
    return std::nullopt;
  }
  if (f.value.Scalar().empty()) {
    error(f.line, f.path, "must not be empty");
    return std::nullopt;
  }
  return f.value.Scalar();
}

std::optional<std::string> RulesParser::read_name(const Field& f) {
  auto s = read_string(f);
  if (!s) return std::nullopt;
  if (!valid_name(*s)) {
    error(f.line, f.path,
          ticked(*s) + " is not a valid name (letters, digits, '_', '.' and '-' only)");
    return std::nullopt;
  }
  return s;
}

std::optional<bool> RulesParser::read_bool(const Field& f) {
  auto s = read_string(f);
  if (!s) return std::nullopt;
  if (*s == "true" || *s == "True" || *s == "TRUE") return true;
  if (*s == "false" || *s == "False" || *s == "FALSE") return false;
  error(f.line, f.path, "must be true or false, got " + ticked(*s));
  return std::nullopt;
}

std::optional<int64_t> RulesParser::read_duration(const Field& f) {
  auto s = read_string(f);
  if (!s) return std::nullopt;
  auto ms = parse_duration_ms(*s);
  if (!ms) {
    error(f.line, f.path,
          "bad duration " + ticked(*s) +
              ": use a whole number and a unit, e.g. 250ms, 1s, 15m, "
              "1h, 1d");
  }
  return ms;
}

template <typename T>
std::optional<T> RulesParser::read_choice(
    const Field& f, std::initializer_list<std::pair<std::string_view, T>> choices) {
  auto s = read_string(f);
  if (!s) return std::nullopt;
  std::string names;
  for (const auto& [name, value] : choices) {
    if (name == *s) return value;
    names += (names.empty() ? "" : " | ") + std::string(name);
  }
  error(f.line, f.path, "must be " + names + ", got " + ticked(*s));
  return std::nullopt;
}

void RulesParser::parse_root(const YAML::Node& root) {
  if (!root.IsDefined() || root.IsNull()) {
    error(1, "", "the rules file is empty; it needs a `domains:` list");
    return;
  }
  if (!expect(root, YAML::NodeType::Map, line_of(root, 1), "", "a map with a `domains:` list")) {
    return;
  }
  const Fields top = read_fields(root, "", {"domains"});
  const Field* domains = top.find("domains");
  if (domains == nullptr) {
    error(line_of(root, 1), "domains", "missing required field `domains`");
    return;
  }
  if (!expect(domains->value, YAML::NodeType::Sequence, domains->line, domains->path, "a list")) {
    return;
  }
  struct Seen {
    std::string name;
    int line;
  };
  std::vector<Seen> seen;
  size_t i = 0;
  for (auto it = domains->value.begin(); it != domains->value.end(); ++it, ++i) {
    const std::string path = index_path(domains->path, i);
    const int line = line_of(*it, domains->line);
    Domain d;
    parse_domain(*it, line, path, d);
    if (d.name.empty()) continue;  // already reported
    auto prev =
        std::find_if(seen.begin(), seen.end(), [&](const Seen& s) { return s.name == d.name; });
    if (prev != seen.end()) {
      error(line, path + ".name",
            "duplicate domain " + ticked(d.name) + " (first on line " + std::to_string(prev->line) +
                ")");
      continue;
    }
    seen.push_back({d.name, line});
    rules_.domains.push_back(std::move(d));
  }
}

void RulesParser::parse_domain(const YAML::Node& n, int line, const std::string& path, Domain& d) {
  if (!expect(n, YAML::NodeType::Map, line, path, "a map")) return;
  const Fields fields = read_fields(n, path, {"name", "allowlist", "plans", "rules"});
  if (const Field* f = fields.find("name")) {
    if (auto name = read_name(*f)) d.name = *name;
  } else {
    error(line, path, "missing required field `name`");
  }

  if (const Field* f = fields.find("allowlist")) {
    if (expect(f->value, YAML::NodeType::Sequence, f->line, f->path, "a list")) {
      size_t i = 0;
      for (auto it = f->value.begin(); it != f->value.end(); ++it, ++i) {
        const std::string entry_path = index_path(f->path, i);
        const int entry_line = line_of(*it, f->line);
        if (!it->IsMap() || it->size() != 1) {
          error(entry_line, entry_path,
                "an allowlist entry is one `key: value` map, e.g. "
                "{client_id: allegro-mobile}");
          continue;
        }
        const auto kv = it->begin();
        const Field key_field{"", kv->first, entry_line, entry_path};
        const Field value_field{"", kv->second, line_of(kv->second, entry_line), entry_path};
        auto key = read_string(key_field);
        auto value = read_string(value_field);
        if (key && value) d.allowlist.push_back({*key, *value});
      }
    }
  }

  if (const Field* f = fields.find("plans")) parse_plans(*f, d);

  if (const Field* f = fields.find("rules")) {
    if (!expect(f->value, YAML::NodeType::Sequence, f->line, f->path, "a list")) return;
    struct Seen {
      std::string name;
      int line;
    };
    std::vector<Seen> seen;
    size_t i = 0;
    for (auto it = f->value.begin(); it != f->value.end(); ++it, ++i) {
      const std::string rule_path = index_path(f->path, i);
      const int rule_line = line_of(*it, f->line);
      Rule r;
      r.line = rule_line;
      parse_rule(*it, rule_line, rule_path, d, r);
      if (r.name.empty()) continue;
      auto prev =
          std::find_if(seen.begin(), seen.end(), [&](const Seen& s) { return s.name == r.name; });
      if (prev != seen.end()) {
        error(rule_line, rule_path + ".name",
              "duplicate rule " + ticked(r.name) + " in domain " + ticked(d.name) +
                  " (first on line " + std::to_string(prev->line) + ")");
        continue;
      }
      seen.push_back({r.name, rule_line});
      d.rules.push_back(std::move(r));
    }
  }
}

void RulesParser::parse_plans(const Field& f, Domain& d) {
  if (!expect(f.value, YAML::NodeType::Map, f.line, f.path, "a map of plan name to limits")) {
    return;
  }
  for (auto it = f.value.begin(); it != f.value.end(); ++it) {
    const int key_line = line_of(it->first, f.line);
    if (!it->first.IsScalar()) {
      error(key_line, f.path, "plan names must be plain words");
      continue;
    }
    const std::string name = it->first.Scalar();
    const Field plan{name, it->second, line_of(it->second, key_line), f.path + "." + name};
    if (!valid_name(name)) {
      error(key_line, plan.path,
            ticked(name) + " is not a valid plan name (letters, digits, '_', '.' and '-' only)");
      continue;
    }
    if (std::any_of(d.plans.begin(), d.plans.end(),
                    [&](const Plan& p) { return p.name == name; })) {
      error(key_line, plan.path, "plan " + ticked(name) + " is declared twice");
      continue;
    }
    Plan p;
    p.name = name;
    // Kept even when its limits are bad (already reported), so rules naming it are not also
    // told that the plan does not exist.
    parse_limits(plan, name, 0, p.limits);
    d.plans.push_back(std::move(p));
  }
}

void RulesParser::parse_rule(const YAML::Node& n, int line, const std::string& path,
                             const Domain& d, Rule& r) {
  if (!expect(n, YAML::NodeType::Map, line, path, "a map")) return;
  const Fields fields =
      read_fields(n, path,
                  {"name", "match", "key", "limits", "plan", "mode", "count_denied", "estimator",
                   "granularity", "consistency", "fallback"});
  std::string name;
  if (const Field* f = fields.find("name")) {
    if (auto v = read_name(*f)) name = *v;
  } else {
    error(line, path, "missing required field `name`");
  }
  if (const Field* f = fields.find("match")) parse_match(*f, r);
  if (const Field* f = fields.find("key")) {
    parse_key(*f, r);
  } else {
    error(line, path, "missing required field `key` (the descriptor entries forming the counter)");
  }

  int64_t bucket_ms = 0;
  const Field* granularity = fields.find("granularity");
  if (granularity != nullptr) {
    if (auto ms = read_duration(*granularity)) bucket_ms = *ms;
  }
  const Field* limits = fields.find("limits");
  const Field* plan = fields.find("plan");
  if (limits != nullptr && plan != nullptr) {
    error(plan->line, plan->path, "a rule takes either `limits` or `plan`, not both");
  } else if (limits == nullptr && plan == nullptr) {
    error(line, path, "a rule needs `limits` or `plan`");
  }
  if (limits != nullptr) parse_limits(*limits, name, bucket_ms, r.limits);
  if (plan != nullptr) {
    if (granularity != nullptr) {
      error(granularity->line, granularity->path,
            "granularity applies to a rule's own limits; with `plan`, set it on the plan's "
            "limits");
    }
    parse_rule_plan(*plan, d, r);
  }
  parse_rule_modes(fields, r);
  r.name = name;
}

// `match: {entry: value, ...}`: the conditions a request must meet for the rule to apply.
void RulesParser::parse_match(const Field& f, Rule& r) {
  if (expect(f.value, YAML::NodeType::Map, f.line, f.path, "a map of entry: value")) {
    for (auto it = f.value.begin(); it != f.value.end(); ++it) {
      const int key_line = line_of(it->first, f.line);
      const Field key_field{"", it->first, key_line, f.path};
      auto key = read_string(key_field);
      if (!key) continue;
      const Field value_field{"", it->second, line_of(it->second, key_line), f.path + "." + *key};
      auto value = read_string(value_field);
      if (!value) continue;
      if (std::any_of(r.match.begin(), r.match.end(),
                      [&](const Condition& c) { return c.key == *key; })) {
        error(key_line, value_field.path, "condition on " + ticked(*key) + " is repeated");
        continue;
      }
      r.match.push_back({*key, *value});
    }
  }
}

// `key: [entry, ...]`: the entries whose values form the counter's key.
void RulesParser::parse_key(const Field& f, Rule& r) {
  if (expect(f.value, YAML::NodeType::Sequence, f.line, f.path, "a list of entry names")) {
    if (f.value.size() == 0) error(f.line, f.path, "must name at least one entry");
    size_t i = 0;
    for (auto it = f.value.begin(); it != f.value.end(); ++it, ++i) {
      const Field item{"", *it, line_of(*it, f.line), index_path(f.path, i)};
      auto key = read_string(item);
      if (!key) continue;
      if (std::find(r.key.begin(), r.key.end(), *key) != r.key.end()) {
        error(item.line, item.path, "entry " + ticked(*key) + " is repeated in the key");
        continue;
      }
      r.key.push_back(*key);
    }
  }
}

// `plan: {from: <entry>, default: <plan>}`: the rule's limits are a plan's, named by an entry.
void RulesParser::parse_rule_plan(const Field& plan, const Domain& d, Rule& r) {
  if (expect(plan.value, YAML::NodeType::Map, plan.line, plan.path,
             "a map {from: <entry>, default: <plan>}")) {
    const Fields pf = read_fields(plan.value, plan.path, {"from", "default"});
    if (const Field* from = pf.find("from")) {
      if (auto v = read_string(*from)) r.plan_from = *v;
    } else {
      error(plan.line, plan.path, "missing required field `from` (the entry naming the plan)");
    }
    if (const Field* def = pf.find("default")) {
      if (auto v = read_string(*def)) {
        if (d.plans.empty()) {
          error(def->line, def->path,
                "unknown plan " + ticked(*v) + ": the domain declares no `plans`");
        } else if (std::none_of(d.plans.begin(), d.plans.end(),
                                [&](const Plan& p) { return p.name == *v; })) {
          std::string names;
          for (const Plan& p : d.plans)
            names += (names.empty() ? "" : ", ") + p.name;
          error(def->line, def->path,
                "unknown plan " + ticked(*v) + " (the domain declares: " + names + ")");
        } else {
          r.default_plan = *v;
        }
      }
    } else {
      error(plan.line, plan.path,
            "missing required field `default` (the plan when the entry is absent or unknown)");
    }
  }
}

// How the rule decides: mode, count_denied, estimator, consistency and fallback, checked against
// the rule's limits (parsed before).
void RulesParser::parse_rule_modes(const Fields& fields, Rule& r) {
  if (const Field* f = fields.find("mode")) {
    if (auto v = read_choice<Mode>(
            *f,
            {{"enforce", Mode::kEnforce}, {"dry-run", Mode::kDryRun}, {"shadow", Mode::kShadow}})) {
      r.mode = *v;
    }
  }
  if (const Field* f = fields.find("count_denied")) {
    if (auto v = read_bool(*f)) r.count_denied = *v;
  }
  if (const Field* f = fields.find("estimator")) {
    if (auto v = read_choice<window::Estimator>(*f, {{"weighted", window::Estimator::kWeighted},
                                                     {"strict", window::Estimator::kStrict}})) {
      r.estimator = *v;
    }
  }
  if (const Field* f = fields.find("consistency")) {
    if (auto v = read_choice<Consistency>(*f, {{"owner", Consistency::kOwner},
                                               {"gossip", Consistency::kGossip},
                                               {"lease", Consistency::kLease}})) {
      r.consistency = *v;
      const auto has = [&](Algorithm a) {
        return std::any_of(r.limits.begin(), r.limits.end(),
                           [a](const Limit& l) { return l.algorithm == a; });
      };
      if (r.consistency != Consistency::kOwner && has(Algorithm::kConcurrency)) {
        error(f->line, f->path,
              "a rule with an `algorithm: concurrency` limit takes `consistency: owner` (the "
              "key's owner holds its leases)");
      } else if (r.consistency == Consistency::kLease && has(Algorithm::kGcra)) {
        error(f->line, f->path,
              "`consistency: lease` slices a window's budget; a rule with an `algorithm: gcra` "
              "limit takes `consistency: owner` or `gossip`");
      }
    }
  }
  if (const Field* f = fields.find("fallback")) {
    if (auto v =
            read_choice<Fallback>(*f, {{"share", Fallback::kShare}, {"deny", Fallback::kDeny}})) {
      r.fallback = *v;
      if (!owner_decides(r.consistency)) {
        error(f->line, f->path,
              "applies to `consistency: owner` and `lease` only (a gossip rule never waits for an "
              "owner)");
      }
    }
  }
}

void RulesParser::parse_limits(const Field& f, std::string_view owner, int64_t bucket_ms,
                               std::vector<Limit>& out) {
  if (!expect(f.value, YAML::NodeType::Sequence, f.line, f.path,
              "a list of limits, e.g. [100/1m]")) {
    return;
  }
  if (f.value.size() == 0) {
    error(f.line, f.path, "must hold at least one limit");
    return;
  }
  size_t i = 0;
  for (auto it = f.value.begin(); it != f.value.end(); ++it, ++i) {
    const std::string path = index_path(f.path, i);
    const int line = line_of(*it, f.line);
    Limit l;
    if (!parse_limit_node(*it, line, path, owner, bucket_ms, l)) continue;
    // Of two limits on one window only the stricter can ever decide: the other is a mistake.
    auto same_window = std::find_if(out.begin(), out.end(), [&](const Limit& o) {
      return o.algorithm == Algorithm::kWindow && l.algorithm == Algorithm::kWindow &&
             o.spec.window_ms == l.spec.window_ms;
    });
    if (same_window != out.end()) {
      error(line, path,
            "two limits with the window " + format_duration(l.spec.window_ms) + " (" +
                ticked(same_window->name) + " and " + ticked(l.name) + "); keep the stricter one");
      continue;
    }
    auto same_name =
        std::find_if(out.begin(), out.end(), [&](const Limit& o) { return o.name == l.name; });
    if (same_name != out.end()) {
      error(line, path, "two limits named " + ticked(l.name));
      continue;
    }
    out.push_back(std::move(l));
  }
}

bool RulesParser::parse_limit_node(const YAML::Node& n, int line, const std::string& path,
                                   std::string_view owner, int64_t bucket_ms, Limit& out) {
  if (n.IsScalar()) {
    if (Status why = parse_limit(n.Scalar(), bucket_ms, out); !why.ok()) {
      error(line, path, why.message());
      return false;
    }
    out.name = default_limit_name(owner, out);
    return true;
  }
  if (!n.IsMap()) {
    error(line, path,
          "a limit is \"N/duration\" or a map {limit: N, window: 1m}, got " +
              std::string(type_name(n)));
    return false;
  }
  const Fields fields = read_fields(n, path,
                                    {"limit", "window", "name", "granularity", "algorithm", "rate",
                                     "burst", "max_in_flight", "lease_ttl"});
  bool ok = true;
  if (const Field* a = fields.find("algorithm")) {
    if (auto v = read_choice<Algorithm>(*a, {{"window", Algorithm::kWindow},
                                             {"gcra", Algorithm::kGcra},
                                             {"concurrency", Algorithm::kConcurrency}})) {
      out.algorithm = *v;
    } else {
      return false;
    }
  }
  if (out.algorithm == Algorithm::kGcra) return parse_gcra_node(fields, line, path, owner, out);
  if (out.algorithm == Algorithm::kConcurrency) {
    return parse_concurrency_node(fields, line, path, owner, out);
  }
  for (const char* gcra_only : {"rate", "burst"}) {
    if (const Field* f = fields.find(gcra_only)) {
      error(f->line, f->path,
            "applies to `algorithm: gcra` only (a sliding-window limit takes `limit` and "
            "`window`)");
      ok = false;
    }
  }
  for (const char* concurrency_only : {"max_in_flight", "lease_ttl"}) {
    if (const Field* f = fields.find(concurrency_only)) {
      error(f->line, f->path,
            "applies to `algorithm: concurrency` only (a sliding-window limit takes `limit` and "
            "`window`)");
      ok = false;
    }
  }
  const Field* limit = fields.find("limit");
  const Field* window = fields.find("window");
  if (limit == nullptr) {
    error(line, path, "missing required field `limit`");
    ok = false;
  } else if (auto s = read_string(*limit)) {
    if (auto v = parse_count(*s)) {
      out.requests = *v;
    } else {
      error(limit->line, limit->path,
            "must be a whole number from 1 to 2^40 (1099511627776), got " + ticked(*s));
      ok = false;
    }
  } else {
    ok = false;
  }
  int64_t window_ms = 0;
  if (window == nullptr) {
    error(line, path, "missing required field `window`");
    ok = false;
  } else if (auto v = read_duration(*window)) {
    window_ms = *v;
  } else {
    ok = false;
  }
  if (const Field* g = fields.find("granularity")) {
    if (auto v = read_duration(*g)) {
      bucket_ms = *v;
    } else {
      ok = false;
    }
  }
  if (!read_limit_name(fields, out)) ok = false;
  if (!ok) return false;
  out.spec = window::make_spec(window_ms, bucket_ms);
  out.default_bucket = bucket_ms == 0;
  if (Status why = window::validate(out.spec); !why.ok()) {
    error(line, path, "window: " + why.message());
    return false;
  }
  if (out.name.empty()) out.name = default_limit_name(owner, out);
  return true;
}

bool RulesParser::parse_concurrency_node(const Fields& fields, int line, const std::string& path,
                                         std::string_view owner, Limit& out) {
  bool ok = true;
  for (const char* other : {"limit", "window", "rate", "burst"}) {
    if (const Field* f = fields.find(other)) {
      error(f->line, f->path,
            "does not apply to `algorithm: concurrency` (it takes `max_in_flight`, e.g. 20, and "
            "`lease_ttl`, e.g. 30s)");
      ok = false;
    }
  }
  uint64_t max_in_flight = 0;
  const Field* max_field = fields.find("max_in_flight");
  if (max_field == nullptr) {
    error(line, path, "missing required field `max_in_flight` (the most leases held at once)");
    ok = false;
  } else if (auto m = read_string(*max_field)) {
    if (auto v = parse_count(*m); v && *v <= UINT32_MAX) {
      max_in_flight = *v;
    } else {
      error(max_field->line, max_field->path,
            "must be a whole number from 1 to 4294967295, got " + ticked(*m));
      ok = false;
    }
  } else {
    ok = false;
  }
  int64_t ttl_ms = 0;
  const Field* ttl_field = fields.find("lease_ttl");
  if (ttl_field == nullptr) {
    error(line, path,
          "missing required field `lease_ttl` (how long an unreleased lease is held, e.g. 30s)");
    ok = false;
  } else if (auto v = read_duration(*ttl_field)) {
    ttl_ms = *v;
  } else {
    ok = false;
  }
  int64_t bucket_ms = 0;
  const Field* granularity = fields.find("granularity");
  if (granularity != nullptr) {
    if (auto v = read_duration(*granularity)) {
      bucket_ms = *v;
    } else {
      ok = false;
    }
  }
  if (!read_limit_name(fields, out)) ok = false;
  if (!ok) return false;
  if (Status why = parse_concurrency(max_in_flight, ttl_ms, bucket_ms, out); !why.ok()) {
    const Field* at = granularity != nullptr && why.message().rfind("granularity", 0) == 0
                          ? granularity
                          : ttl_field;
    error(at->line, at->path, why.message());
    return false;
  }
  if (out.name.empty()) out.name = default_limit_name(owner, out);
  return true;
}

bool RulesParser::parse_gcra_node(const Fields& fields, int line, const std::string& path,
                                  std::string_view owner, Limit& out) {
  bool ok = true;
  for (const char* window_only : {"limit", "window", "granularity", "max_in_flight", "lease_ttl"}) {
    if (const Field* f = fields.find(window_only)) {
      error(f->line, f->path,
            "does not apply to `algorithm: gcra` (it takes `rate`, e.g. 10/1s, and `burst`)");
      ok = false;
    }
  }
  std::optional<std::string> rate;
  if (const Field* f = fields.find("rate")) {
    rate = read_string(*f);
    ok = ok && rate.has_value();
  } else {
    error(line, path, "missing required field `rate` (requests per period, e.g. 10/1s)");
    ok = false;
  }
  uint64_t burst = 0;
  const Field* burst_field = fields.find("burst");
  if (burst_field == nullptr) {
    error(line, path, "missing required field `burst` (the most admitted at once, e.g. 20)");
    ok = false;
  } else if (auto b = read_string(*burst_field)) {
    if (auto v = parse_count(*b)) {
      burst = *v;
    } else {
      error(burst_field->line, burst_field->path,
            "must be a whole number from 1 to 2^40 (1099511627776), got " + ticked(*b));
      ok = false;
    }
  } else {
    ok = false;
  }
  if (!read_limit_name(fields, out)) ok = false;
  if (!ok) return false;
  if (Status why = parse_gcra(*rate, burst, out); !why.ok()) {
    const Field* at = why.message().rfind("burst", 0) == 0 ? burst_field : fields.find("rate");
    error(at->line, at->path, why.message());
    return false;
  }
  if (out.name.empty()) out.name = default_limit_name(owner, out);
  return true;
}

bool RulesParser::read_limit_name(const Fields& fields, Limit& out) {
  const Field* name = fields.find("name");
  if (name == nullptr) return true;
  auto v = read_string(*name);
  if (!v) return false;
  if (!valid_limit_name(*v)) {
    error(name->line, name->path,
          ticked(*v) +
              " is not a valid limit name (letters, digits, "
              "'_', '.', '-', ':' and '/' only)");
    return false;
  }
  out.name = *v;
  return true;
}

}  // namespace

std::string_view to_string(Mode m) {
  switch (m) {
    case Mode::kEnforce:
      return "enforce";
    case Mode::kDryRun:
      return "dry-run";
    case Mode::kShadow:
      return "shadow";
  }
  return "enforce";
}

std::optional<Mode> parse_mode(std::string_view s) {
  if (s == "enforce") return Mode::kEnforce;
  if (s == "dry-run") return Mode::kDryRun;
  if (s == "shadow") return Mode::kShadow;
  return std::nullopt;
}

std::string_view to_string(Fallback f) {
  return f == Fallback::kDeny ? "deny" : "share";
}

std::string_view to_string(Consistency c) {
  switch (c) {
    case Consistency::kGossip:
      return "gossip";
    case Consistency::kLease:
      return "lease";
    case Consistency::kOwner:
      break;
  }
  return "owner";
}

std::optional<int64_t> parse_duration_ms(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9')
    ++digits;
  if (digits == 0 || digits > 18) return std::nullopt;  // 18 digits cannot overflow int64
  const std::string_view unit = text.substr(digits);
  int64_t value = 0;
  std::from_chars(text.data(), text.data() + digits, value);
  for (const Unit& u : kUnits) {
    if (unit != u.suffix) continue;
    // Zero is rejected: a zero granularity would silently mean "the default".
    if (value == 0 || value > std::numeric_limits<int64_t>::max() / u.ms) return std::nullopt;
    return value * u.ms;
  }
  return std::nullopt;
}

std::string format_duration(int64_t ms) {
  if (ms > 0) {
    // Largest unit that divides exactly: "1m", not "60s".
    for (auto it = std::rbegin(kUnits); it != std::rend(kUnits); ++it) {
      if (ms % it->ms == 0) return std::to_string(ms / it->ms) + std::string(it->suffix);
    }
  }
  return std::to_string(ms) + "ms";
}

Status parse_limit(std::string_view text, int64_t bucket_ms, Limit& out) {
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) {
    return Status::InvalidArgument("a limit looks like N/duration (e.g. 100/1m or 10/1s), got " +
                                   ticked(text));
  }
  const auto requests = parse_count(text.substr(0, slash));
  if (!requests) {
    return Status::InvalidArgument(
        "the request count must be a whole number from 1 to 2^40 (1099511627776), got " +
        ticked(text.substr(0, slash)) + " in " + ticked(text));
  }
  const auto window_ms = parse_duration_ms(text.substr(slash + 1));
  if (!window_ms) {
    return Status::InvalidArgument("bad window " + ticked(text.substr(slash + 1)) + " in " +
                                   ticked(text) +
                                   ": use a whole number and a unit, e.g. 1s, 10m, 1h, 1d");
  }
  const window::WindowSpec spec = window::make_spec(*window_ms, bucket_ms);
  if (Status why = window::validate(spec); !why.ok())
    return Status::InvalidArgument("window: " + why.message());
  out.requests = *requests;
  out.spec = spec;
  out.default_bucket = bucket_ms == 0;
  return {};
}

Status parse_gcra(std::string_view rate, uint64_t burst, Limit& out) {
  const size_t slash = rate.find('/');
  if (slash == std::string_view::npos) {
    return Status::InvalidArgument("a rate looks like N/duration (e.g. 10/1s or 600/1m), got " +
                                   ticked(rate));
  }
  const std::string_view n = rate.substr(0, slash);
  const auto requests = parse_count(n);
  if (!requests) {
    if (n == "0")
      return Status::InvalidArgument("rate must admit at least 1 request per period, got " +
                                     ticked(rate));
    return Status::InvalidArgument(
        "the request count must be a whole number from 1 to 2^40 (1099511627776), got " +
        ticked(n) + " in " + ticked(rate));
  }
  const auto period_ms = parse_duration_ms(rate.substr(slash + 1));
  if (!period_ms) {
    return Status::InvalidArgument("bad period " + ticked(rate.substr(slash + 1)) + " in " +
                                   ticked(rate) +
                                   ": use a whole number and a unit, e.g. 1s, 10m, 1h");
  }
  StatusOr<window::GcraSpec> g = window::make_gcra(*requests, *period_ms, burst);
  if (!g.ok()) return g.status();
  out.algorithm = Algorithm::kGcra;
  out.rate_requests = *requests;
  out.rate_period_ms = *period_ms;
  out.gcra = *g;
  out.requests = burst;
  out.spec = window::gcra_window(*g);
  return {};
}

Status parse_concurrency(uint64_t max_in_flight, int64_t lease_ttl_ms, int64_t bucket_ms,
                         Limit& out) {
  // Per-bucket counts are 32 bits (window/sliding_window.h): more could not be told apart.
  if (max_in_flight == 0 || max_in_flight > UINT32_MAX) {
    return Status::InvalidArgument("max_in_flight must be a whole number from 1 to 4294967295");
  }
  if (lease_ttl_ms < window::kMinWindowMs || lease_ttl_ms > 86'400'000) {
    return Status::InvalidArgument("lease_ttl must be from 1s to 1d, got " +
                                   format_duration(lease_ttl_ms));
  }
  if (bucket_ms == 0) bucket_ms = lease_ttl_ms % 10 == 0 ? lease_ttl_ms / 10 : lease_ttl_ms;
  const window::WindowSpec spec = window::make_spec(lease_ttl_ms, bucket_ms);
  if (Status why = window::validate(spec); !why.ok())
    return Status::InvalidArgument("granularity: " + why.message());
  out.algorithm = Algorithm::kConcurrency;
  out.requests = max_in_flight;
  out.spec = spec;
  return {};
}

int64_t reported_window_ms(const Limit& l) {
  if (l.algorithm != Algorithm::kGcra) return l.spec.window_ms;
  __extension__ typedef unsigned __int128 u128;
  const u128 ns = static_cast<u128>(l.gcra.interval_ns) * l.gcra.burst;
  return static_cast<int64_t>((ns + 999'999) / 1'000'000);  // under 2^31 ms (make_gcra)
}

window::WindowSpec cell_window_spec() {
  window::WindowSpec s{window::kMinWindowMs, window::kMinWindowMs};
  s.gcra = true;
  return s;
}

std::string_view to_string(Algorithm a) {
  switch (a) {
    case Algorithm::kGcra:
      return "gcra";
    case Algorithm::kConcurrency:
      return "concurrency";
    case Algorithm::kCell:
      return "cell";
    case Algorithm::kWindow:
      break;
  }
  return "window";
}

std::string ParseError::to_string() const {
  std::string s = file;
  if (line > 0) s += ":" + std::to_string(line);
  s += ": ";
  if (!field.empty()) s += field + ": ";
  return s + message;
}

ParseResult parse_rules(std::string_view text, std::string_view file) {
  ParseResult result;
  ErrorList errors(file);
  RulesParser parser(errors);
  parse_yaml_document(text, "the rules file", errors,
                      [&](const YAML::Node& root) { parser.parse_root(root); });
  result.errors = errors.take();
  if (result.errors.empty()) result.rules = parser.take_rules();
  return result;
}

std::optional<std::string> read_text_file(const std::string& path, std::string_view what,
                                          std::vector<ParseError>& errors) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    errors.push_back(ParseError{
        path, 0, "",
        "cannot read " + std::string(what) + ": " + (ec ? ec.message() : "not a regular file")});
    return std::nullopt;
  }
  std::string text;
  std::ifstream in(path, std::ios::binary);
  char chunk[16 * 1024];
  while (in.read(chunk, sizeof(chunk)) || in.gcount() > 0) {
    text.append(chunk, static_cast<size_t>(in.gcount()));
  }
  if (!in.eof()) {  // stopped before the end: open or read failed
    errors.push_back(ParseError{path, 0, "", "cannot read " + std::string(what)});
    return std::nullopt;
  }
  return text;
}

ParseResult load_rules_file(const std::string& path) {
  ParseResult result;
  const std::optional<std::string> text = read_text_file(path, "the rules file", result.errors);
  return text ? parse_rules(*text, path) : result;
}

}  // namespace sluice::rules
