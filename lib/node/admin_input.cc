// The admin port's parsers of client and operator input (admin_input.h).
#include "node/admin_input.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>

#include "rules/rules.h"

namespace sluice::node {
namespace {

using Json = nlohmann::json;

// A TTL past ten years is ten years (an override that long is "until deleted" in practice).
constexpr int64_t kMaxTtlMs = int64_t{3'650} * 86'400'000;

struct TooDeep {};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool iequals_prefix(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    const auto a = static_cast<unsigned char>(s[i]);
    const auto b = static_cast<unsigned char>(prefix[i]);
    if (std::tolower(a) != std::tolower(b)) return false;
  }
  return true;
}

}  // namespace

// The domain and descriptors every operator body names.
Status parse_target(const Json& j, std::string& domain, Entries& entries) {
  if (!j.contains("domain") || !j["domain"].is_string())
    return Status::InvalidArgument("domain (a string) is required");
  domain = j["domain"].get<std::string>();
  if (!j.contains("descriptors"))
    return Status::InvalidArgument("descriptors (an object of strings) is required");
  if (Status err = parse_descriptors(j["descriptors"], entries); !err.ok()) return err;
  if (entries.empty()) return Status::InvalidArgument("descriptors must name at least one entry");
  return {};
}

Status check_fields(const Json& j, std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : j.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return Status::InvalidArgument("unknown field \"" + key + "\"");
    }
  }
  return {};
}

// "ttl": "24h" | "90s" | seconds as a number; 0 or absent = no expiry.
Status parse_ttl(const Json& j, int64_t now_ms, int64_t& expires_at_ms) {
  expires_at_ms = 0;
  if (!j.contains("ttl") || j["ttl"].is_null()) return {};
  const Json& t = j["ttl"];
  int64_t ms = 0;
  if (t.is_number_unsigned()) {
    ms = static_cast<int64_t>(std::min<uint64_t>(t.get<uint64_t>(), kMaxTtlMs / 1000)) * 1000;
  } else if (t.is_string()) {
    const auto d = rules::parse_duration_ms(t.get<std::string>());
    if (!d || *d < 0)
      return Status::InvalidArgument("ttl must be a duration such as 90s, 30m, 24h or 7d");
    ms = std::min(*d, kMaxTtlMs);
  } else {
    return Status::InvalidArgument("ttl must be a duration such as 90s, 30m, 24h or 7d");
  }
  if (ms > 0) expires_at_ms = now_ms + ms;
  return {};
}

bool percent_decode(std::string_view in, std::string& out) {
  out.clear();
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = hex_value(in[i + 1]);
      const int lo = hex_value(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (c == '+') {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return true;
}

bool parse_query(std::string_view query, Entries& out) {
  std::string key, value;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    const std::string_view k = part.substr(0, eq);
    const std::string_view v =
        eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1);
    if (!percent_decode(k, key) || !percent_decode(v, value)) return false;
    out.emplace_back(key, value);
  }
  return true;
}

Status parse_json_object(std::string_view body, Json& out) {
  try {
    out = Json::parse(body, [](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth) throw TooDeep{};
      return true;
    });
  } catch (const Json::parse_error& e) {
    return Status::InvalidArgument("malformed JSON at byte " + std::to_string(e.byte));
  } catch (const Json::out_of_range&) {  // a number past double's range (1e999)
    return Status::InvalidArgument("malformed JSON: a number out of range");
  } catch (const Json::exception& e) {
    return Status::InvalidArgument(std::string("malformed JSON: ") + e.what());
  } catch (const TooDeep&) {
    return Status::InvalidArgument("JSON nested deeper than " + std::to_string(kMaxJsonDepth));
  }
  if (!out.is_object()) return Status::InvalidArgument("the body must be a JSON object");
  return {};
}

Status parse_descriptors(const Json& value, Entries& entries) {
  if (!value.is_object())
    return Status::InvalidArgument("descriptors must be an object of strings");
  for (const auto& [k, v] : value.items()) {
    if (!v.is_string()) return Status::InvalidArgument("descriptors." + k + " must be a string");
    entries.emplace_back(k, v.get<std::string>());
  }
  return {};
}

// Parses "hits" given as text (query parameter or header).
Status parse_hits_text(std::string_view s, uint64_t& out) {
  if (!s.empty() && s.front() == '-') return Status::InvalidArgument("hits must not be negative");
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec == std::errc::invalid_argument || end != s.data() + s.size()) {
    return Status::InvalidArgument("hits must be an integer");
  }
  if (ec == std::errc::result_out_of_range || v > kMaxHits) {
    return Status::InvalidArgument("hits must be at most " + std::to_string(kMaxHits));
  }
  out = v;
  return {};
}

// Parses the /v1/check body; the error is for a 400 answer.
Status parse_check_body(std::string_view body, CheckInput& in) {
  Json j;
  if (Status err = parse_json_object(body, j); !err.ok()) return err;
  for (const auto& [key, value] : j.items()) {
    if (key == "domain") {
      if (!value.is_string()) return Status::InvalidArgument("domain must be a string");
      in.domain = value.get<std::string>();
      in.has_domain = true;
    } else if (key == "descriptors") {
      if (Status err = parse_descriptors(value, in.entries); !err.ok()) return err;
    } else if (key == "hits") {
      if (value.is_number_unsigned()) {
        const uint64_t v = value.get<uint64_t>();
        if (v > kMaxHits)
          return Status::InvalidArgument("hits must be at most " + std::to_string(kMaxHits));
        in.hits = v;
      } else if (value.is_number_integer()) {  // signed: negative, or -0
        if (value.get<int64_t>() < 0) return Status::InvalidArgument("hits must not be negative");
        in.hits = 0;
      } else {
        return Status::InvalidArgument("hits must be an integer");
      }
    } else {
      return Status::InvalidArgument("unknown field \"" + key + "\"");
    }
  }
  if (!in.has_domain) return Status::InvalidArgument("domain is required");
  return {};
}

std::string format_lease(uint64_t lease) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, lease >>= 4)
    out[static_cast<size_t>(i)] = kDigits[lease & 0xf];
  return out;
}

Status parse_lease(const Json& value, uint64_t& out) {
  constexpr const char* kForm =
      "lease must be a string of 16 lowercase hex digits, as /v1/check answered it (e.g. "
      "\"00c0ffee12345678\")";
  if (!value.is_string()) return Status::InvalidArgument(kForm);
  const std::string& s = value.get_ref<const std::string&>();
  if (s.size() != 16) return Status::InvalidArgument(kForm);
  uint64_t v = 0;
  for (const char c : s) {
    // Uppercase is refused too: one spelling per lease, so logs and caches can compare them.
    const int d = c >= 'A' && c <= 'F' ? -1 : hex_value(c);
    if (d < 0) return Status::InvalidArgument(kForm);
    v = v << 4 | static_cast<uint64_t>(d);
  }
  if (v == 0)
    return Status::InvalidArgument("lease 0000000000000000 is no lease (0 means none was granted)");
  out = v;
  return {};
}

Status parse_release_body(std::string_view body, CheckInput& in) {
  Json j;
  if (Status err = parse_json_object(body, j); !err.ok()) return err;
  bool has_lease = false;
  for (const auto& [key, value] : j.items()) {
    if (key == "domain") {
      if (!value.is_string()) return Status::InvalidArgument("domain must be a string");
      in.domain = value.get<std::string>();
      in.has_domain = true;
    } else if (key == "descriptors") {
      if (Status err = parse_descriptors(value, in.entries); !err.ok()) return err;
    } else if (key == "lease") {
      if (Status err = parse_lease(value, in.release); !err.ok()) return err;
      has_lease = true;
    } else if (key == "hits") {
      return Status::InvalidArgument(
          "hits does not apply to a release (it frees what the lease holds)");
    } else {
      return Status::InvalidArgument("unknown field \"" + key + "\"");
    }
  }
  if (!in.has_domain) return Status::InvalidArgument("domain is required");
  if (!has_lease) return Status::InvalidArgument("lease is required");
  in.hits = 0;  // ignored by the engine; 0 so that no cost limit can refuse a release
  return {};
}

// Collects /v1/auth input from the query and X-Sluice-* headers.
Status parse_auth_input(std::string_view query,
                        std::span<const std::pair<std::string_view, std::string_view>> headers,
                        CheckInput& in) {
  bool has_hits = false;
  const auto take = [&](std::string key, std::string value) -> Status {
    if (key == "domain") {
      if (in.has_domain) return Status::InvalidArgument("domain given twice");
      in.domain = std::move(value);
      in.has_domain = true;
    } else if (key == "hits") {
      if (has_hits) return Status::InvalidArgument("hits given twice");
      has_hits = true;
      return parse_hits_text(value, in.hits);
    } else {
      in.entries.emplace_back(std::move(key), std::move(value));
    }
    return {};
  };
  Entries params;
  if (!parse_query(query, params))
    return Status::InvalidArgument("malformed percent-escape in the query string");
  for (auto& [k, v] : params) {
    if (Status err = take(std::move(k), std::move(v)); !err.ok()) return err;
  }
  constexpr std::string_view kPrefix = "X-Sluice-";
  for (const auto& [name, value] : headers) {
    if (!iequals_prefix(name, kPrefix)) continue;
    std::string k(name.substr(kPrefix.size()));
    for (char& c : k) {
      c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    if (Status err = take(std::move(k), std::string(value)); !err.ok()) return err;
  }
  if (!in.has_domain)
    return Status::InvalidArgument("domain is required (?domain= or X-Sluice-Domain)");
  return {};
}

Status parse_override_body(const Json& j, bool plan_only, int64_t now_ms, rules::Override& o) {
  if (Status err = plan_only ? check_fields(j, {"domain", "descriptors", "plan", "ttl"})
                             : check_fields(j, {"domain", "descriptors", "limits", "granularity",
                                                "mode", "ttl", "plan"});
      !err.ok()) {
    return err;
  }
  o = rules::Override{};
  if (Status err = parse_target(j, o.domain, o.entries); !err.ok()) return err;
  // Without a granularity an override's limits count in the rule's buckets (bucket_ms 0), so one
  // with the window of a rule's limit keeps its counter (rules.h, Override::limits).
  int64_t bucket_ms = 0;
  if (j.contains("granularity")) {
    const auto g = j["granularity"].is_string()
                       ? rules::parse_duration_ms(j["granularity"].get<std::string>())
                       : std::nullopt;
    if (!g)
      return Status::InvalidArgument("granularity must be a duration such as \"1s\" or \"10s\"");
    bucket_ms = *g;
  }
  if (j.contains("limits")) {
    if (!j["limits"].is_array())
      return Status::InvalidArgument("limits must be an array such as [\"500/1m\"]");
    if (j["limits"].size() > kMaxLimitsPerOverride) {
      return Status::InvalidArgument("at most " + std::to_string(kMaxLimitsPerOverride) +
                                     " limits");
    }
    for (const Json& l : j["limits"]) {
      if (!l.is_string())
        return Status::InvalidArgument("each limit must be a string such as \"500/1m\"");
      rules::Limit lim;
      if (Status why = rules::parse_limit(l.get<std::string>(), bucket_ms, lim); !why.ok()) {
        return Status::InvalidArgument("limit \"" + l.get<std::string>() + "\": " + why.message());
      }
      if (bucket_ms == 0) lim.spec.bucket_ms = 0;  // the rule's
      o.limits.push_back(std::move(lim));
    }
  }
  if (j.contains("mode") && !j["mode"].is_null()) {
    if (!j["mode"].is_string())
      return Status::InvalidArgument("mode must be enforce, dry-run or shadow");
    o.mode = rules::parse_mode(j["mode"].get<std::string>());
    if (!o.mode) return Status::InvalidArgument("mode must be enforce, dry-run or shadow");
  }
  if (j.contains("plan")) {
    if (!j["plan"].is_string()) return Status::InvalidArgument("plan must be a string");
    o.plan = j["plan"].get<std::string>();
  }
  if (plan_only && o.plan.empty()) return Status::InvalidArgument("plan (a plan name) is required");
  if (Status err = parse_ttl(j, now_ms, o.expires_at_ms); !err.ok()) {
    return err;
  }
  return {};
}

}  // namespace sluice::node
