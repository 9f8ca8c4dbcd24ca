#include "wire/ratelimit_headers.h"

namespace sluice::wire {

int64_t ceil_seconds(int64_t ms) {
  return ms <= 0 ? 0 : (ms + 999) / 1000;
}

void append_sf_string(std::string& out, std::string_view s) {
  out.push_back('"');
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

RateLimitHeaders ratelimit_headers(std::span<const LimitStatus> limits, bool denied) {
  RateLimitHeaders r;
  std::string policy;
  for (const LimitStatus& l : limits) {
    if (l.mode != Mode::kEnforce) continue;
    if (!policy.empty()) policy += ", ";
    append_sf_string(policy, l.name);
    policy += ";q=" + std::to_string(l.limit);
    policy += ";w=" + std::to_string(ceil_seconds(l.window_ms));
    const LimitStatus* h = r.headline;
    if (h == nullptr) {
      r.headline = &l;
    } else if (l.exceeded != h->exceeded) {
      if (l.exceeded) r.headline = &l;
    } else if (l.exceeded) {
      if (l.retry_after_ms > h->retry_after_ms) r.headline = &l;
    } else if (l.remaining < h->remaining || (l.remaining == h->remaining && l.reset_ms > h->reset_ms)) {
      r.headline = &l;
    }
  }
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

}  // namespace sluice::wire
