#include "wire/ratelimit_headers.h"

#include <algorithm>
#include <charconv>

namespace sluice::wire {

int64_t ceil_seconds(int64_t ms) {
  return ms <= 0 ? 0 : (ms + 999) / 1000;
}

void append_sf_string(std::string& out, std::string_view s) {
  out.push_back('"');
  // The usual name needs nothing escaped: one append.
  if (std::all_of(s.begin(), s.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u >= 0x20 && u <= 0x7e && c != '"' && c != '\\';
      })) {
    out.append(s);
    out.push_back('"');
    return;
  }
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20 || u > 0x7e) {
      out.push_back('?');
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

namespace {

void append_int(std::string& out, int64_t n) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, n);
  out.append(buf, static_cast<size_t>(r.ptr - buf));
}
void append_uint(std::string& out, uint64_t n) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, n);
  out.append(buf, static_cast<size_t>(r.ptr - buf));
}

// The headline (RateLimitHeaders::headline), with RateLimit-Policy's value appended to `policy`.
const LimitStatus* headline_and_policy(std::span<const LimitStatus> limits, std::string& policy) {
  const LimitStatus* h = nullptr;
  bool first = true;
  for (const LimitStatus& l : limits) {
    if (l.mode != Mode::kEnforce) continue;
    if (!first) policy += ", ";
    first = false;
    append_sf_string(policy, l.name);
    policy += ";q=";
    append_uint(policy, l.limit);
    policy += ";w=";
    append_int(policy, ceil_seconds(l.window_ms));
    if (h == nullptr) {
      h = &l;
    } else if (l.exceeded != h->exceeded) {
      if (l.exceeded) h = &l;
    } else if (l.exceeded) {
      if (l.retry_after_ms > h->retry_after_ms) h = &l;
    } else if (l.remaining < h->remaining ||
               (l.remaining == h->remaining && l.reset_ms > h->reset_ms)) {
      h = &l;
    }
  }
  return h;
}

}  // namespace

RateLimitHeaders ratelimit_headers(std::span<const LimitStatus> limits, bool denied) {
  RateLimitHeaders r;
  std::string policy;
  r.headline = headline_and_policy(limits, policy);
  const LimitStatus* h = r.headline;
  if (h == nullptr) return r;
  r.retry = denied && h->retry_after_ms >= 0;
  const int64_t reset_s = r.retry ? ceil_seconds(h->retry_after_ms) : ceil_seconds(h->reset_ms);
  std::string ratelimit;
  append_sf_string(ratelimit, h->name);
  ratelimit += ";r=" + std::to_string(h->remaining);
  ratelimit += ";t=" + std::to_string(reset_s);
  r.headers.emplace_back("RateLimit-Policy", std::move(policy));
  r.headers.emplace_back("RateLimit", std::move(ratelimit));
  r.headers.emplace_back("RateLimit-Limit", std::to_string(h->limit));
  r.headers.emplace_back("RateLimit-Remaining", std::to_string(h->remaining));
  r.headers.emplace_back("RateLimit-Reset", std::to_string(reset_s));
  if (r.retry) r.headers.emplace_back("Retry-After", std::to_string(reset_s));
  return r;
}

void append_ratelimit_headers(std::span<const LimitStatus> limits, bool denied, std::string& out) {
  const size_t start = out.size();
  out += "RateLimit-Policy: ";
  const LimitStatus* h = headline_and_policy(limits, out);
  if (h == nullptr) {
    out.resize(start);
    return;
  }
  const bool retry = denied && h->retry_after_ms >= 0;
  const int64_t reset_s = retry ? ceil_seconds(h->retry_after_ms) : ceil_seconds(h->reset_ms);
  out += "\r\nRateLimit: ";
  append_sf_string(out, h->name);
  out += ";r=";
  append_uint(out, h->remaining);
  out += ";t=";
  append_int(out, reset_s);
  out += "\r\nRateLimit-Limit: ";
  append_uint(out, h->limit);
  out += "\r\nRateLimit-Remaining: ";
  append_uint(out, h->remaining);
  out += "\r\nRateLimit-Reset: ";
  append_int(out, reset_s);
  out += "\r\n";
  if (retry) {
    out += "Retry-After: ";
    append_int(out, reset_s);
    out += "\r\n";
  }
}

}  // namespace sluice::wire
