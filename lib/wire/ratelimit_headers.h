// The rate-limit response headers of one decided request (docs/http.md, "Headers"), shared by the
// fronts that speak HTTP to callers: the admin port's /v1/check and /v1/auth, and the gRPC front's
// response_headers_to_add (docs/envoy.md).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "wire/protocol.h"

namespace sluice::wire {

// Milliseconds rounded up to whole seconds (0 for 0 or less).
int64_t ceil_seconds(int64_t ms);

// Appends a Structured Fields sf-string (RFC 8941 3.3.3): printable ASCII with '"' and '\'
// escaped; bytes an sf-string cannot hold (controls, non-ASCII) become '?'.
void append_sf_string(std::string& out, std::string_view s);

struct RateLimitHeaders {
  // The enforcing limit the headers describe: an exceeded one with the longest wait, else the one
  // with the fewest remaining (ties: the later reset); null when no enforcing limit applied.
  const LimitStatus* headline = nullptr;
  bool retry = false;  // denied by an enforcing limit that a wait can admit: Retry-After is set
  std::vector<std::pair<std::string, std::string>> headers;  // empty when headline is null
};

// The headers for `limits` (every limit that applied to the request, of one check or several).
// Dry-run and shadow limits are left out: a dry-run limit must not slow callers down, and a
// shadow limit must stay invisible to the caller it silently denies. `denied`: an enforcing
// limit denied the request. On a denial, Retry-After and the reset the headers announce are the
// binding limit's wait (draft-ietf-httpapi-ratelimit-headers-11 section 6; -06 section 5 for
// RateLimit-Reset), so a client never reads two different waits.
RateLimitHeaders ratelimit_headers(std::span<const LimitStatus> limits, bool denied);

// The same headers as HTTP/1.1 header lines ("Name: value\r\n" each) appended to `out`, without
// allocating beyond `out` (the admin port's check answers).
void append_ratelimit_headers(std::span<const LimitStatus> limits, bool denied, std::string& out);

}  // namespace sluice::wire
