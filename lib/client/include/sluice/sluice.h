/* libsluice's C API: ask Sluice nodes "may this request go ahead?" from C, or from any language
 * that can call C (clients/python, clients/go).
 *
 * A thin layer over the C++ sluice::Client (lib/client/client.h): batching, failover, timeouts and
 * the fail mode are that client's, not a second implementation. docs/client.md is the guide
 * (every language side by side, and the ABI rules); this header is the contract.
 *
 *   sluice_options o;
 *   sluice_options_init(&o);
 *   const char* nodes[] = {"127.0.0.1:7350"};
 *   o.nodes = nodes;
 *   o.num_nodes = 1;
 *   sluice_client* c = NULL;
 *   char why[256];
 *   if (sluice_client_create(&o, &c, why, sizeof why) != SLUICE_OK) die(why);
 *
 *   sluice_entry e[] = {{"user", "42"}};
 *   sluice_check chk = {"api", e, 1, 1};
 *   sluice_result r;
 *   sluice_result_init(&r);
 *   sluice_check_one(c, &chk, &r);     // r.allowed is always set; the status says how
 *   if (!r.allowed) reply_429(&r);
 *   if (r.lease) sluice_release(c, &chk, r.lease);   // a concurrency limit's slot, given back
 *   sluice_client_destroy(&c);         // c is NULL afterwards
 *
 * Threads: every function may be called from any number of threads at once, except
 * sluice_client_destroy (call it once, when no other thread uses the client). Callbacks of
 * sluice_check_async run on the client's I/O thread: keep them short; a blocking check or a
 * destroy from a callback is refused with SLUICE_ERR_IN_CALLBACK.
 *
 * Strings are NUL-terminated UTF-8 (or any bytes but NUL), at most SLUICE_MAX_STRING_BYTES bytes
 * each; they are copied before a call returns, so they only need to live for the call.
 *
 * ABI: the SONAME is libsluice.so.SLUICE_ABI_VERSION. Structs the caller fills or receives start
 * with `struct_size` (set by the *_init functions); new fields are only ever appended, so a newer
 * library reads and writes only what the caller's struct_size covers. sluice_result_init is
 * versioned (lib/client/sluice.map): programs linked before sluice_result had `lease` keep the
 * one that writes version 0 only. docs/client.md, "ABI".
 */
#ifndef SLUICE_SLUICE_H
#define SLUICE_SLUICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SLUICE_API __attribute__((visibility("default")))
#else
#define SLUICE_API
#endif

#define SLUICE_ABI_VERSION 0

#define SLUICE_MAX_STRING_BYTES 4096 /* a domain, key or value; longer: SLUICE_ERR_TOO_LARGE */
#define SLUICE_MAX_ENTRIES 64        /* entries per check */
#define SLUICE_MAX_BATCH 65536       /* checks per sluice_check_batch call */
#define SLUICE_MAX_LIMITS 8          /* limit details kept per result (more: `truncated`) */
#define SLUICE_MAX_NAME_BYTES 96     /* a limit's name, NUL included (longer: cut) */

/* What a call returned. A check's status is also in its result (`status`). */
typedef enum sluice_status {
  SLUICE_OK = 0, /* a node decided: see `allowed` */
  /* The call itself. */
  SLUICE_ERR_INVALID_ARGUMENT = 1, /* a NULL pointer, a bad option, a bad struct_size */
  SLUICE_ERR_NO_MEMORY = 2,
  SLUICE_ERR_BAD_NODE = 3,    /* a node that is not host:port, or does not resolve */
  SLUICE_ERR_IN_CALLBACK = 4, /* a blocking check or destroy from a callback */
  /* No node decided: the fail mode set `allowed`. */
  SLUICE_ERR_UNAVAILABLE = 5, /* no node answered in time (a garbage answer is none) */
  SLUICE_ERR_REFUSED = 6,     /* a node refused the whole request (malformed, version) */
  /* The check itself (from the client before sending, or from the node): never allowed. */
  SLUICE_ERR_EMPTY_DOMAIN = 7,
  SLUICE_ERR_UNKNOWN_DOMAIN = 8, /* answered by the node */
  SLUICE_ERR_TOO_MANY_ENTRIES = 9,
  SLUICE_ERR_ENTRY_TOO_LONG = 10, /* longer than the node's max_entry_bytes */
  SLUICE_ERR_EMPTY_ENTRY_KEY = 11,
  SLUICE_ERR_DUPLICATE_ENTRY = 12,
  SLUICE_ERR_HITS_TOO_LARGE = 13,
  SLUICE_ERR_NEGATIVE_HITS = 14,
  SLUICE_ERR_NO_ROOM = 15,   /* the node's counter table is full */
  SLUICE_ERR_TOO_LARGE = 16, /* a string over SLUICE_MAX_STRING_BYTES, or a check too big */
  /* sluice_release: a node answered, and nothing changed. */
  SLUICE_ERR_LEASE_UNKNOWN = 17, /* no such lease for this domain and these entries */
  SLUICE_ERR_LEASE_EXPIRED = 18, /* its lease_ttl was over: its slots were freed then */
  SLUICE_ERR_LEASE_RELEASED = 19 /* released before (or by this call's own lost first attempt) */
} sluice_status;

/* A static English text for a status ("no node answered in time"); never NULL. */
SLUICE_API const char* sluice_strerror(int status);

typedef enum sluice_transport { SLUICE_UDP = 0, SLUICE_TCP = 1 } sluice_transport;

typedef enum sluice_fail_mode {
  SLUICE_FAIL_OPEN = 0,  /* no node decides: allowed (the usual choice) */
  SLUICE_FAIL_CLOSED = 1 /* no node decides: denied (login, OTP, token minting, ...) */
} sluice_fail_mode;

typedef enum sluice_outcome {
  SLUICE_DECIDED = 0,    /* a node decided */
  SLUICE_REFUSED = 1,    /* a node refused the request; the fail mode decided */
  SLUICE_INVALID = 2,    /* the client would not send the check; denied */
  SLUICE_UNAVAILABLE = 3 /* no node answered in time; the fail mode decided */
} sluice_outcome;

/* Options of a client. sluice_options_init sets struct_size and every default (the C++
 * ClientOptions' defaults); then set `nodes`. Times are in microseconds or milliseconds as named.
 */
typedef struct sluice_options {
  size_t struct_size;
  const char* const* nodes; /* "host:port", "[::1]:port", in order of preference */
  size_t num_nodes;
  int transport;                      /* sluice_transport, default SLUICE_UDP */
  int fail_mode;                      /* sluice_fail_mode, default SLUICE_FAIL_OPEN */
  uint32_t timeout_us;                /* a check's whole budget, retries included; 20000 */
  uint32_t attempts;                  /* sends per check at most, >= 1; 2 */
  uint32_t batch_window_us;           /* how long a first check waits for company; 0 */
  uint32_t max_checks_per_request;    /* 1..1024; 64 */
  uint32_t udp_answer_room_per_check; /* bytes of UDP padding per check; 288 */
  uint32_t backoff_min_ms;            /* a failed node is skipped this long, doubling; 10 */
  uint32_t backoff_max_ms;            /* 1000 */
  uint32_t connect_timeout_ms;        /* TCP; 1000 */
} sluice_options;

SLUICE_API void sluice_options_init(sluice_options* options);

typedef struct sluice_entry {
  const char* key;   /* e.g. "user" */
  const char* value; /* e.g. "42" */
} sluice_entry;

typedef struct sluice_check {
  const char* domain;
  const sluice_entry* entries; /* may be NULL when num_entries is 0 */
  size_t num_entries;
  int64_t hits; /* the cost, usually 1; 0 asks without counting */
} sluice_check;

/* One limit that applied to a check, as the C++ LimitStatus has it. */
typedef struct sluice_limit {
  char name[SLUICE_MAX_NAME_BYTES]; /* NUL-terminated */
  uint64_t limit;
  int64_t window_ms;
  uint64_t remaining;
  int64_t reset_ms;
  int64_t retry_after_ms; /* -1: the cost never fits */
  int mode;               /* 0 enforce, 1 dry-run, 2 shadow */
  int exceeded;
} sluice_limit;

/* Version 1 (this header) appended `lease`. The library also accepts version 0 (struct_size up to
 * `limits`, no `lease`: programs built before leases) and then writes only those fields. */
typedef struct sluice_result {
  size_t struct_size;  /* set by sluice_result_init (the caller's sizeof) */
  int status;          /* sluice_status of this check */
  int outcome;         /* sluice_outcome */
  int allowed;         /* go ahead or not; always set */
  int would_deny;      /* a dry-run rule would have denied it */
  int shadow;          /* denied by shadow rules only */
  int allowlisted;     /* an allowlist entry matched */
  int truncated;       /* limit details were dropped (by the node, or past SLUICE_MAX_LIMITS) */
  uint32_t num_limits; /* filled entries of `limits` */
  sluice_limit limits[SLUICE_MAX_LIMITS];
  /* Version 1. Granted by the check's concurrency limits when they admitted it; 0 = none.
   * Give it back with sluice_release and the same check, or it is held until its lease_ttl. */
  uint64_t lease;
} sluice_result;

SLUICE_API void sluice_result_init(sluice_result* result);

typedef struct sluice_client sluice_client; /* opaque */

/* Resolves the nodes and starts the client's I/O thread. On failure *client stays NULL and, when
 * `error` is not NULL, the reason is written there (NUL-terminated, cut to error_size). */
SLUICE_API int sluice_client_create(const sluice_options* options, sluice_client** client,
                                    char* error, size_t error_size);

/* Completes every pending async check with SLUICE_ERR_UNAVAILABLE (each callback runs once),
 * stops the I/O thread, frees the client and sets *client to NULL. NULL or *client NULL: nothing.
 * Other copies of the pointer dangle afterwards, as after free(). */
SLUICE_API int sluice_client_destroy(sluice_client** client);

/* A blocking check: returns within the timeout plus a few milliseconds. Returns the result's
 * status; `result` (struct_size set) is filled whenever result is not NULL and struct_size is
 * valid, argument errors included (then allowed = 0). */
SLUICE_API int sluice_check_one(sluice_client* client, const sluice_check* check,
                                sluice_result* result);

/* `n` checks sharing requests; results[i] for checks[i], each with its own status. Every
 * results[i].struct_size must be set, all to the same size (the array's stride: a program built
 * before `lease` passes an array of version-0 results). Returns SLUICE_OK when the call was
 * valid (look at each status), else the argument error (results filled with it when they can
 * be). */
SLUICE_API int sluice_check_batch(sluice_client* client, const sluice_check* checks, size_t n,
                                  sluice_result* results);

/* Runs once per accepted check, on the client's I/O thread; `result` is valid during the call. */
typedef void (*sluice_callback)(const sluice_result* result, void* user_data);

/* Queues the check and returns at once. SLUICE_OK: `done` will run exactly once (at the latest
 * within the timeout, or at destroy). Any other return: `done` never runs. */
SLUICE_API int sluice_check_async(sluice_client* client, const sluice_check* check,
                                  sluice_callback done, void* user_data);

/* Gives back `lease` (a result's `lease`), blocking like sluice_check_one. `check` must name the
 * domain and entries of the check that was granted it (its `hits` is ignored). Returns SLUICE_OK
 * when the lease's slots were freed; SLUICE_ERR_LEASE_RELEASED, _EXPIRED or _UNKNOWN when a node
 * answered and nothing changed (a release is idempotent); SLUICE_ERR_UNAVAILABLE or
 * SLUICE_ERR_REFUSED when no node decided (the lease is held until its lease_ttl is over; try
 * again, or let it expire); SLUICE_ERR_INVALID_ARGUMENT for lease 0; a check's errors as
 * sluice_check_one. Since version SLUICE_1 of the library (sluice.map). */
SLUICE_API int sluice_release(sluice_client* client, const sluice_check* check, uint64_t lease);

/* Counters since create, as the C++ ClientStats. */
typedef struct sluice_stats {
  size_t struct_size;
  uint64_t checks;
  uint64_t requests;
  uint64_t retries;
  uint64_t answers;
  uint64_t dropped_answers; /* malformed, unknown id, wrong node, wrong shape */
  uint64_t unavailable;
  uint64_t link_failures;
  uint64_t callback_exceptions;
} sluice_stats;

/* stats->struct_size must be set to sizeof(sluice_stats) by the caller. */
SLUICE_API int sluice_client_stats(const sluice_client* client, sluice_stats* stats);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_SLUICE_H */
