// libsluice's C API (include/sluice/sluice.h): argument checks, conversion between the C structs
// and sluice::Client's types, and nothing else. Batching, failover, timeouts and the fail mode are
// the C++ Client's (client.h); this file must not grow a second copy of them.
//
// No exception leaves this file: every entry point catches and turns it into a status. Scratch
// vectors are thread_local, so a warm thread converts checks without allocating.
#include "sluice/sluice.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "client/client.h"

struct sluice_client {
  std::unique_ptr<sluice::Client> impl;
};

namespace {

using sluice::Outcome;
using sluice::Result;
using sluice::wire::Code;

// Set while a C callback runs on the client's I/O thread: a blocking check or a destroy from there
// could only deadlock (the C++ Client would throw std::logic_error or join itself).
thread_local bool t_in_callback = false;

int status_of_code(Code c) {
  switch (c) {
    case Code::kOk:
      return SLUICE_OK;
    case Code::kEmptyDomain:
      return SLUICE_ERR_EMPTY_DOMAIN;
    case Code::kUnknownDomain:
      return SLUICE_ERR_UNKNOWN_DOMAIN;
    case Code::kTooManyEntries:
      return SLUICE_ERR_TOO_MANY_ENTRIES;
    case Code::kEntryTooLong:
      return SLUICE_ERR_ENTRY_TOO_LONG;
    case Code::kEmptyEntryKey:
      return SLUICE_ERR_EMPTY_ENTRY_KEY;
    case Code::kDuplicateEntry:
      return SLUICE_ERR_DUPLICATE_ENTRY;
    case Code::kHitsTooLarge:
      return SLUICE_ERR_HITS_TOO_LARGE;
    case Code::kNegativeHits:
      return SLUICE_ERR_NEGATIVE_HITS;
    case Code::kNoRoom:
      return SLUICE_ERR_NO_ROOM;
    case Code::kTooLarge:
      return SLUICE_ERR_TOO_LARGE;
    case Code::kLeaseUnknown:
      return SLUICE_ERR_LEASE_UNKNOWN;
    case Code::kLeaseExpired:
      return SLUICE_ERR_LEASE_EXPIRED;
    case Code::kLeaseReleased:
      return SLUICE_ERR_LEASE_RELEASED;
    case Code::kMalformed:
    case Code::kTooManyChecks:
    case Code::kUnsupportedVersion:
      return SLUICE_ERR_REFUSED;
  }
  return SLUICE_ERR_REFUSED;
}

int status_of(const Result& r) {
  switch (r.outcome) {
    case Outcome::kDecided:
      return status_of_code(r.code);
    case Outcome::kRefused:
      return SLUICE_ERR_REFUSED;
    case Outcome::kInvalid:
      return r.code == Code::kOk ? SLUICE_ERR_INVALID_ARGUMENT : status_of_code(r.code);
    case Outcome::kUnavailable:
      return SLUICE_ERR_UNAVAILABLE;
  }
  return SLUICE_ERR_UNAVAILABLE;
}

// sluice_result's versions, by size: version 0 ends with `limits`; version 1 (sizeof) appends
// `lease`. A result of either is filled as far as its size goes, and no further (docs/client.md,
// "ABI"): a program built before leases passes version-0 results.
constexpr size_t kResultV0Bytes = offsetof(sluice_result, lease);
static_assert(sizeof(void*) != 8 || kResultV0Bytes == 1192, "sluice_result version 0 moved");

bool result_usable(const sluice_result* r) {
  return r != nullptr &&
         (r->struct_size == sizeof(sluice_result) || r->struct_size == kResultV0Bytes);
}

bool has_lease_field(const sluice_result* r) {
  return r->struct_size >= offsetof(sluice_result, lease) + sizeof r->lease;
}

// `out` is result_usable: its struct_size bytes are the caller's.
void clear_result(sluice_result* out, int status) {
  const size_t size = out->struct_size;
  std::memset(out, 0, size);
  out->struct_size = size;
  out->status = status;
  out->outcome = SLUICE_INVALID;
  out->allowed = 0;
}

void fill_result(const Result& r, sluice_result* out) {
  clear_result(out, status_of(r));
  out->outcome = static_cast<int>(r.outcome);
  out->allowed = r.allowed ? 1 : 0;
  out->would_deny = r.would_deny ? 1 : 0;
  out->shadow = r.shadow ? 1 : 0;
  out->allowlisted = r.allowlisted ? 1 : 0;
  out->truncated = r.truncated || r.limits.size() > SLUICE_MAX_LIMITS ? 1 : 0;
  const size_t n = std::min<size_t>(r.limits.size(), SLUICE_MAX_LIMITS);
  out->num_limits = static_cast<uint32_t>(n);
  for (size_t i = 0; i < n; ++i) {
    const sluice::LimitStatus& l = r.limits[i];
    sluice_limit& o = out->limits[i];
    const size_t len = std::min(l.name.size(), sizeof o.name - 1);
    std::memcpy(o.name, l.name.data(), len);
    o.name[len] = '\0';
    o.limit = l.limit;
    o.window_ms = l.window_ms;
    o.remaining = l.remaining;
    o.reset_ms = l.reset_ms;
    o.retry_after_ms = l.retry_after_ms;
    o.mode = static_cast<int>(l.mode);
    o.exceeded = l.exceeded ? 1 : 0;
  }
  if (has_lease_field(out)) out->lease = r.lease;
}

// A string's length, or SIZE_MAX when it is NULL or longer than SLUICE_MAX_STRING_BYTES (read no
// further than that: an unterminated buffer is not scanned to its end).
size_t bounded_length(const char* s) {
  if (s == nullptr) return SIZE_MAX;
  const size_t n = strnlen(s, SLUICE_MAX_STRING_BYTES + 1);
  return n > SLUICE_MAX_STRING_BYTES ? SIZE_MAX - 1 : n;
}

int length_status(size_t n) {
  if (n == SIZE_MAX) return SLUICE_ERR_INVALID_ARGUMENT;
  if (n == SIZE_MAX - 1) return SLUICE_ERR_TOO_LARGE;
  return SLUICE_OK;
}

// Checks a C check and appends its entries as views to `entries` (which must not reallocate
// while earlier checks point into it: the caller reserves). SLUICE_OK or the argument's error.
int convert(const sluice_check* c, std::vector<sluice::Entry>& entries, sluice::Check& out) {
  if (c == nullptr) return SLUICE_ERR_INVALID_ARGUMENT;
  if (c->num_entries > SLUICE_MAX_ENTRIES) return SLUICE_ERR_TOO_MANY_ENTRIES;
  if (c->num_entries > 0 && c->entries == nullptr) return SLUICE_ERR_INVALID_ARGUMENT;
  const size_t dlen = bounded_length(c->domain);
  if (int s = length_status(dlen); s != SLUICE_OK) return s;
  if (dlen == 0) return SLUICE_ERR_EMPTY_DOMAIN;
  if (c->hits < 0) return SLUICE_ERR_NEGATIVE_HITS;
  const size_t first = entries.size();
  for (size_t i = 0; i < c->num_entries; ++i) {
    const size_t klen = bounded_length(c->entries[i].key);
    const size_t vlen = bounded_length(c->entries[i].value);
    int s = length_status(klen);
    if (s == SLUICE_OK) s = length_status(vlen);
    if (s != SLUICE_OK) {
      entries.resize(first);
      return s;
    }
    entries.push_back({{c->entries[i].key, klen}, {c->entries[i].value, vlen}});
  }
  out.domain = {c->domain, dlen};
  out.entries = std::span<const sluice::Entry>(entries.data() + first, c->num_entries);
  out.hits = c->hits;
  return SLUICE_OK;
}

void write_error(char* error, size_t size, const char* text) {
  if (error != nullptr && size > 0) std::snprintf(error, size, "%s", text);
}

// n results of one version, `stride` bytes apart (the caller's sizeof(sluice_result)).
struct ResultArray {
  sluice_result* first;
  size_t stride;
  sluice_result& operator[](size_t i) const {
    return *reinterpret_cast<sluice_result*>(reinterpret_cast<char*>(first) + i * stride);
  }
};

struct BatchScratch {
  std::vector<sluice::Entry> entries;
  std::vector<sluice::Check> checks;
  std::vector<size_t> index;  // checks[k] answers results[index[k]]
  std::vector<Result> results;
};

}  // namespace

extern "C" {

const char* sluice_strerror(int status) {
  switch (status) {
    case SLUICE_OK:
      return "ok";
    case SLUICE_ERR_INVALID_ARGUMENT:
      return "invalid argument (a NULL pointer, a bad option or struct_size)";
    case SLUICE_ERR_NO_MEMORY:
      return "out of memory (or another resource: a thread)";
    case SLUICE_ERR_BAD_NODE:
      return "a node is not host:port or does not resolve";
    case SLUICE_ERR_IN_CALLBACK:
      return "not allowed from a callback (it runs on the client's I/O thread)";
    case SLUICE_ERR_UNAVAILABLE:
      return "no node answered in time; the fail mode decided";
    case SLUICE_ERR_REFUSED:
      return "a node refused the request; the fail mode decided";
    case SLUICE_ERR_EMPTY_DOMAIN:
      return "empty domain";
    case SLUICE_ERR_UNKNOWN_DOMAIN:
      return "unknown domain";
    case SLUICE_ERR_TOO_MANY_ENTRIES:
      return "too many entries";
    case SLUICE_ERR_ENTRY_TOO_LONG:
      return "an entry is longer than the node allows";
    case SLUICE_ERR_EMPTY_ENTRY_KEY:
      return "an entry has an empty key";
    case SLUICE_ERR_DUPLICATE_ENTRY:
      return "an entry key appears twice";
    case SLUICE_ERR_HITS_TOO_LARGE:
      return "hits too large";
    case SLUICE_ERR_NEGATIVE_HITS:
      return "negative hits";
    case SLUICE_ERR_NO_ROOM:
      return "the node has no room for more counters";
    case SLUICE_ERR_TOO_LARGE:
      return "a string or the check is too large";
    case SLUICE_ERR_LEASE_UNKNOWN:
      return "no such lease for this domain and these entries";
    case SLUICE_ERR_LEASE_EXPIRED:
      return "the lease had expired";
    case SLUICE_ERR_LEASE_RELEASED:
      return "the lease was released before";
    default:
      return "unknown status";
  }
}

void sluice_options_init(sluice_options* options) {
  if (options == nullptr) return;
  const sluice::ClientOptions d;
  std::memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->transport = SLUICE_UDP;
  options->fail_mode = SLUICE_FAIL_OPEN;
  options->timeout_us = static_cast<uint32_t>(d.timeout.count());
  options->attempts = d.attempts;
  options->batch_window_us = static_cast<uint32_t>(d.batch_window.count());
  options->max_checks_per_request = d.max_checks_per_request;
  options->udp_answer_room_per_check = d.udp_answer_room_per_check;
  options->backoff_min_ms = static_cast<uint32_t>(d.backoff_min.count());
  options->backoff_max_ms = static_cast<uint32_t>(d.backoff_max.count());
  options->connect_timeout_ms = static_cast<uint32_t>(d.connect_timeout.count());
}

// The current version (sluice_result_init@@SLUICE_1 by sluice.map): the whole struct.
void sluice_result_init(sluice_result* result) {
  if (result == nullptr) return;
  std::memset(result, 0, sizeof *result);
  result->struct_size = sizeof *result;
}

// What programs linked before leases call (sluice_result_init@SLUICE_0): their results are
// version 0, so nothing past `limits` may be written. Exported only under that name (sluice.map).
__attribute__((symver("sluice_result_init@SLUICE_0"))) SLUICE_API void sluice_result_init_v0(
    sluice_result* result) {
  if (result == nullptr) return;
  std::memset(result, 0, kResultV0Bytes);
  result->struct_size = kResultV0Bytes;
}

int sluice_client_create(const sluice_options* options, sluice_client** client, char* error,
                         size_t error_size) {
  if (client == nullptr) {
    write_error(error, error_size, "client is NULL");
    return SLUICE_ERR_INVALID_ARGUMENT;
  }
  *client = nullptr;
  if (options == nullptr || options->struct_size != sizeof(sluice_options)) {
    write_error(error, error_size,
                options == nullptr ? "options is NULL"
                                   : "options.struct_size is not sizeof(sluice_options) (use "
                                     "sluice_options_init)");
    return SLUICE_ERR_INVALID_ARGUMENT;
  }
  if (options->num_nodes > 0 && options->nodes == nullptr) {
    write_error(error, error_size, "nodes is NULL");
    return SLUICE_ERR_INVALID_ARGUMENT;
  }
  if (options->transport != SLUICE_UDP && options->transport != SLUICE_TCP) {
    write_error(error, error_size, "transport must be SLUICE_UDP or SLUICE_TCP");
    return SLUICE_ERR_INVALID_ARGUMENT;
  }
  if (options->fail_mode != SLUICE_FAIL_OPEN && options->fail_mode != SLUICE_FAIL_CLOSED) {
    write_error(error, error_size, "fail_mode must be SLUICE_FAIL_OPEN or SLUICE_FAIL_CLOSED");
    return SLUICE_ERR_INVALID_ARGUMENT;
  }
  try {
    sluice::ClientOptions o;
    for (size_t i = 0; i < options->num_nodes; ++i) {
      const size_t n = bounded_length(options->nodes[i]);
      if (length_status(n) != SLUICE_OK) {
        write_error(error, error_size, "a node is NULL or too long");
        return SLUICE_ERR_INVALID_ARGUMENT;
      }
      o.nodes.emplace_back(options->nodes[i], n);
    }
    o.transport =
        options->transport == SLUICE_TCP ? sluice::Transport::kTcp : sluice::Transport::kUdp;
    o.fail_mode = options->fail_mode == SLUICE_FAIL_CLOSED ? sluice::FailMode::kClosed
                                                           : sluice::FailMode::kOpen;
    o.timeout = std::chrono::microseconds(options->timeout_us);
    o.attempts = options->attempts;
    o.batch_window = std::chrono::microseconds(options->batch_window_us);
    o.max_checks_per_request = options->max_checks_per_request;
    o.udp_answer_room_per_check = options->udp_answer_room_per_check;
    o.backoff_min = std::chrono::milliseconds(options->backoff_min_ms);
    o.backoff_max = std::chrono::milliseconds(options->backoff_max_ms);
    o.connect_timeout = std::chrono::milliseconds(options->connect_timeout_ms);
    std::string why;
    std::unique_ptr<sluice::Client> impl = sluice::Client::create(std::move(o), &why);
    if (!impl) {
      write_error(error, error_size, why.c_str());
      // Client::create names the node in every message about one ("node '...': ...").
      return why.rfind("node '", 0) == 0 ? SLUICE_ERR_BAD_NODE : SLUICE_ERR_INVALID_ARGUMENT;
    }
    *client = new sluice_client{std::move(impl)};
    write_error(error, error_size, "");
    return SLUICE_OK;
  } catch (const std::bad_alloc&) {
    write_error(error, error_size, "out of memory");
    return SLUICE_ERR_NO_MEMORY;
  } catch (const std::exception& e) {  // the I/O thread could not start, ...
    write_error(error, error_size, e.what());
    return SLUICE_ERR_NO_MEMORY;
  } catch (...) {
    write_error(error, error_size, "unknown exception");
    return SLUICE_ERR_NO_MEMORY;
  }
}

int sluice_client_destroy(sluice_client** client) {
  if (client == nullptr || *client == nullptr) return SLUICE_OK;
  if (t_in_callback) return SLUICE_ERR_IN_CALLBACK;
  delete *client;  // ~Client completes pending checks, so every callback runs once
  *client = nullptr;
  return SLUICE_OK;
}

int sluice_check_one(sluice_client* client, const sluice_check* check, sluice_result* result) {
  if (!result_usable(result)) return SLUICE_ERR_INVALID_ARGUMENT;
  if (client == nullptr) {
    clear_result(result, SLUICE_ERR_INVALID_ARGUMENT);
    return SLUICE_ERR_INVALID_ARGUMENT;
  }
  if (t_in_callback) {
    clear_result(result, SLUICE_ERR_IN_CALLBACK);
    return SLUICE_ERR_IN_CALLBACK;
  }
  try {
    thread_local std::vector<sluice::Entry> entries;
    entries.clear();
    entries.reserve(SLUICE_MAX_ENTRIES);
    sluice::Check c;
    if (int s = convert(check, entries, c); s != SLUICE_OK) {
      clear_result(result, s);
      return s;
    }
    fill_result(client->impl->check(c), result);
    return result->status;
  } catch (...) {  // std::bad_alloc; nothing else is thrown on this path
    clear_result(result, SLUICE_ERR_NO_MEMORY);
    return SLUICE_ERR_NO_MEMORY;
  }
}

int sluice_check_batch(sluice_client* client, const sluice_check* checks, size_t n,
                       sluice_result* results_in) {
  if (n == 0) return SLUICE_OK;
  if (results_in == nullptr || n > SLUICE_MAX_BATCH) return SLUICE_ERR_INVALID_ARGUMENT;
  if (!result_usable(results_in)) return SLUICE_ERR_INVALID_ARGUMENT;
  // The caller's array of its own version: its stride is that version's size, not ours.
  const ResultArray results{results_in, results_in->struct_size};
  for (size_t i = 1; i < n; ++i) {
    if (!result_usable(&results[i]) || results[i].struct_size != results_in->struct_size) {
      return SLUICE_ERR_INVALID_ARGUMENT;
    }
  }
  int refuse = SLUICE_OK;
  if (client == nullptr || checks == nullptr) refuse = SLUICE_ERR_INVALID_ARGUMENT;
  if (t_in_callback) refuse = SLUICE_ERR_IN_CALLBACK;
  if (refuse != SLUICE_OK) {
    for (size_t i = 0; i < n; ++i)
      clear_result(&results[i], refuse);
    return refuse;
  }
  try {
    thread_local BatchScratch s;
    s.entries.clear();
    s.checks.clear();
    s.index.clear();
    // Reserve first: the checks' entry spans point into this vector.
    size_t total = 0;
    for (size_t i = 0; i < n; ++i)
      total += std::min<size_t>(checks[i].num_entries, SLUICE_MAX_ENTRIES);
    s.entries.reserve(total);
    for (size_t i = 0; i < n; ++i) {
      sluice::Check c;
      if (int st = convert(&checks[i], s.entries, c); st != SLUICE_OK) {
        clear_result(&results[i], st);  // not sent; the others still are
        continue;
      }
      s.checks.push_back(c);
      s.index.push_back(i);
    }
    if (!s.checks.empty()) client->impl->check_batch(s.checks, s.results);
    for (size_t k = 0; k < s.checks.size(); ++k)
      fill_result(s.results[k], &results[s.index[k]]);
    return SLUICE_OK;
  } catch (...) {  // std::bad_alloc; nothing else is thrown on this path
    for (size_t i = 0; i < n; ++i)
      clear_result(&results[i], SLUICE_ERR_NO_MEMORY);
    return SLUICE_ERR_NO_MEMORY;
  }
}

int sluice_check_async(sluice_client* client, const sluice_check* check, sluice_callback done,
                       void* user_data) {
  if (client == nullptr || done == nullptr) return SLUICE_ERR_INVALID_ARGUMENT;
  try {
    thread_local std::vector<sluice::Entry> entries;
    entries.clear();
    entries.reserve(SLUICE_MAX_ENTRIES);
    sluice::Check c;
    if (int s = convert(check, entries, c); s != SLUICE_OK) return s;
    // Two pointers: std::function keeps them without a heap allocation.
    client->impl->async_check(c, [done, user_data](Result r) {
      sluice_result out;
      sluice_result_init(&out);
      fill_result(r, &out);
      struct InCallback {  // reset even if a C++ caller's callback throws (the Client counts it)
        InCallback() { t_in_callback = true; }
        ~InCallback() { t_in_callback = false; }
      } in_callback;
      done(&out, user_data);
    });
    return SLUICE_OK;
  } catch (...) {  // std::bad_alloc; nothing else is thrown on this path
    return SLUICE_ERR_NO_MEMORY;
  }
}

int sluice_release(sluice_client* client, const sluice_check* check, uint64_t lease) {
  if (client == nullptr || lease == 0) return SLUICE_ERR_INVALID_ARGUMENT;
  if (t_in_callback) return SLUICE_ERR_IN_CALLBACK;
  try {
    thread_local std::vector<sluice::Entry> entries;
    entries.clear();
    entries.reserve(SLUICE_MAX_ENTRIES);
    sluice::Check c;
    if (check == nullptr) return SLUICE_ERR_INVALID_ARGUMENT;
    sluice_check no_cost = *check;  // a release's hits are ignored: a negative one is no error
    no_cost.hits = 0;
    if (int s = convert(&no_cost, entries, c); s != SLUICE_OK) return s;
    const sluice::ReleaseResult r = client->impl->release(c.domain, c.entries, lease);
    switch (r.outcome) {
      case Outcome::kDecided:
      case Outcome::kInvalid:
        return status_of_code(r.code);
      case Outcome::kRefused:
        return SLUICE_ERR_REFUSED;
      case Outcome::kUnavailable:
        return SLUICE_ERR_UNAVAILABLE;
    }
    return SLUICE_ERR_UNAVAILABLE;
  } catch (...) {  // std::bad_alloc; nothing else is thrown on this path
    return SLUICE_ERR_NO_MEMORY;
  }
}

int sluice_client_stats(const sluice_client* client, sluice_stats* stats) {
  if (client == nullptr || stats == nullptr || stats->struct_size != sizeof(sluice_stats)) {
    return SLUICE_ERR_INVALID_ARGUMENT;
  }
  const sluice::ClientStats s = client->impl->stats();
  stats->checks = s.checks;
  stats->requests = s.requests;
  stats->retries = s.retries;
  stats->answers = s.answers;
  stats->dropped_answers = s.dropped_answers;
  stats->unavailable = s.unavailable;
  stats->link_failures = s.link_failures;
  stats->callback_exceptions = s.callback_exceptions;
  return SLUICE_OK;
}

}  // extern "C"
