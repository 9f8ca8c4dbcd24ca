// RuleSet -> Sluice's rules-file YAML (`sluicectl rules convert`, docs/envoy-config.md).
//
// Native domains print as they are. Envoy domains print one rule per limited descriptor node,
// keyed by the path's entries and matching the path's fixed values; the output says in comments
// what Sluice's format cannot say: upstream applies exactly one node (a value beats the key-only
// default, the request's depth must equal the node's), Sluice applies every rule that matches.
#include <algorithm>

#include "rules/rules.h"

namespace sluice::rules {
namespace {

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

// Rule names allow letters, digits, '_', '.', '-': anything else becomes '-'.
std::string sluice_name(std::string_view s) {
  std::string out(s);
  std::replace_if(
      out.begin(), out.end(), [](char c) { return !name_char(c); }, '-');
  return out.empty() ? "rule" : out;
}

// One limit as a flow map: {limit, window[, granularity]}, {algorithm: gcra, rate, burst} or
// {algorithm: concurrency, max_in_flight, lease_ttl[, granularity]}.
std::string limit_yaml(const Limit& l) {
  std::string out;
  if (l.algorithm == Algorithm::kGcra) {
    out = "{algorithm: gcra, rate: " + std::to_string(l.rate_requests) + "/" +
          format_duration(l.rate_period_ms) + ", burst: " + std::to_string(l.requests);
  } else if (l.algorithm == Algorithm::kConcurrency) {
    out = "{algorithm: concurrency, max_in_flight: " + std::to_string(l.requests) +
          ", lease_ttl: " + format_duration(l.spec.window_ms);
    const int64_t w = l.spec.window_ms;
    if (l.spec.bucket_ms != (w % 10 == 0 ? w / 10 : w)) {
      out += ", granularity: " + format_duration(l.spec.bucket_ms);
    }
  } else {
    out =
        "{limit: " + std::to_string(l.requests) + ", window: " + format_duration(l.spec.window_ms);
    if (l.spec.bucket_ms != window::default_bucket_ms(l.spec.window_ms)) {
      out += ", granularity: " + format_duration(l.spec.bucket_ms);
    }
  }
  if (!l.name.empty()) out += ", name: " + quoted(l.name);
  return out + "}";
}

void print_limits(const std::vector<Limit>& limits, std::string& out) {
  out += "        limits:\n";
  for (const Limit& l : limits)
    out += "          - " + limit_yaml(l) + "\n";
}

void print_rule_tail(const Rule& r, std::string& out) {
  if (r.mode != Mode::kEnforce) out += "        mode: " + std::string(to_string(r.mode)) + "\n";
  if (r.count_denied) out += "        count_denied: true\n";
  if (r.estimator != window::Estimator::kWeighted)
    out += "        estimator: " + std::string(window::to_string(r.estimator)) + "\n";
  if (r.consistency != Consistency::kOwner)
    out += "        consistency: " + std::string(to_string(r.consistency)) + "\n";
}

// One envoy node and its subtree. `match` holds the fixed values of the path so far.
void print_envoy(const Domain& d, const EnvoyNode& n, std::vector<std::string>& keys,
                 std::vector<std::pair<std::string, std::string>>& match, std::string& out) {
  const bool wildcard = n.value.find('*') != std::string::npos;
  keys.push_back(n.key);
  const bool fixed = !n.value.empty() && !wildcard;
  if (fixed) match.emplace_back(n.key, n.value);
  std::string path;
  for (size_t i = 0; i < keys.size(); ++i)
    path += (i ? ", " : "") + keys[i];
  if (n.unlimited) {
    out += "      # line " + std::to_string(n.line) + ": entries [" + path +
           "] are unlimited upstream; Sluice's allowlist exempts a whole request by one entry, so "
           "no rule is written (requests reaching it are allowlisted on import)\n";
  } else if (n.rule >= 0) {
    const Rule& r = d.rules[static_cast<size_t>(n.rule)];
    out += "      # line " + std::to_string(n.line) +
           ": applies upstream only to requests of exactly " + std::to_string(keys.size()) +
           (keys.size() == 1 ? " entry" : " entries");
    if (n.value.empty()) out += ", and only when no sibling matches the value of `" + n.key + "`";
    out += "\n";
    if (wildcard) {
      out += "      # value pattern " + quoted(n.value) +
             " cannot be expressed: this rule matches any value of `" + n.key + "`\n";
    }
    if (!r.replaces.empty() || r.quota_mode) {
      out += "      # replaces / quota_mode of " + quoted(r.name) +
             " are handled by the gRPC front only\n";
    }
    if (r.limits[0].requests == 0) {
      out +=
          "      # requests_per_unit 0 (deny all) cannot be written: Sluice limits start at 1;"
          " rule " +
          quoted(r.name) + " is left out\n";
    } else {
      out += "      - name: " + quoted(sluice_name(r.name)) + "\n";
      if (!match.empty()) {
        out += "        match: {";
        for (size_t i = 0; i < match.size(); ++i)
          out += (i ? ", " : "") + quoted(match[i].first) + ": " + quoted(match[i].second);
        out += "}\n";
      }
      out += "        key: [";
      for (size_t i = 0; i < keys.size(); ++i)
        out += (i ? ", " : "") + quoted(keys[i]);
      out += "]\n";
      print_limits(r.limits, out);
      print_rule_tail(r, out);
    }
  }
  for (const EnvoyNode& c : n.children)
    print_envoy(d, c, keys, match, out);
  keys.pop_back();
  if (fixed) match.pop_back();
}

}  // namespace

std::string to_rules_yaml(const RuleSet& rules) {
  std::string out = "domains:\n";
  for (const Domain& d : rules.domains) {
    out += "  - name: " + quoted(d.name) + "\n";
    if (d.envoy) {
      out += "    # converted from " + d.source +
             " (envoyproxy/ratelimit). Sluice applies every rule whose match and key hold, "
             "upstream exactly one descriptor node: a key+value node beats the key-only one, and "
             "a node applies only at the request's depth. Load the file with --envoy-rules to "
             "keep upstream's walk.\n";
    }
    if (!d.allowlist.empty()) {
      out += "    allowlist:\n";
      for (const AllowEntry& a : d.allowlist)
        out += "      - {" + quoted(a.key) + ": " + quoted(a.value) + "}\n";
    }
    if (!d.plans.empty()) {
      out += "    plans:\n";
      for (const Plan& p : d.plans) {
        out += "      " + p.name + ":\n";
        for (const Limit& l : p.limits)
          out += "        - " + limit_yaml(l) + "\n";
      }
    }
    if (d.envoy) {
      std::vector<std::string> keys;
      std::vector<std::pair<std::string, std::string>> match;
      std::string body;
      for (const EnvoyNode& n : d.envoy_tree)
        print_envoy(d, n, keys, match, body);
      // A domain with nothing to write still parses: an empty list.
      out += body.find("      - name:") == std::string::npos ? "    rules: []\n" : "    rules:\n";
      out += body;
      continue;
    }
    out += "    rules:\n";
    for (const Rule& r : d.rules) {
      out += "      - name: " + quoted(r.name) + "\n";
      if (!r.match.empty()) {
        out += "        match: {";
        for (size_t i = 0; i < r.match.size(); ++i)
          out += (i ? ", " : "") + quoted(r.match[i].key) + ": " + quoted(r.match[i].value);
        out += "}\n";
      }
      out += "        key: [";
      for (size_t i = 0; i < r.key.size(); ++i)
        out += (i ? ", " : "") + quoted(r.key[i]);
      out += "]\n";
      if (r.plan_from.empty()) {
        print_limits(r.limits, out);
      } else {
        out += "        plan: {from: " + quoted(r.plan_from) +
               ", default: " + quoted(r.default_plan) + "}\n";
      }
      print_rule_tail(r, out);
    }
  }
  return out;
}

}  // namespace sluice::rules
