/* The C API (lib/client/include/sluice/sluice.h) against a real sluiced, compiled as C99.
 *
 *   c_api_test CASE      runs one case (tests/CMakeLists.txt registers each as a CTest test)
 *
 * Each case that needs a node starts sluiced (SLUICED_BIN) on a free loopback port with the rules
 * below, waits (at most 10 s) until it answers, and kills it at the end. Every loop is bounded in
 * count and in time; the program exits 0 when every expectation held, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sluice/sluice.h"

#ifndef SLUICED_BIN
#error "define SLUICED_BIN, the path of the sluiced binary (tests/CMakeLists.txt)"
#endif

static int failures = 0;

#define EXPECT(cond)                                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                         \
    }                                                                     \
  } while (0)

#define EXPECT_STATUS(got, want)                                                                  \
  do {                                                                                            \
    int got_ = (got);                                                                             \
    if (got_ != (want)) {                                                                         \
      fprintf(stderr, "%s:%d: %s: status %d (%s), expected %s\n", __FILE__, __LINE__, #got, got_, \
              sluice_strerror(got_), #want);                                                      \
      ++failures;                                                                                 \
    }                                                                                             \
  } while (0)

/* Limits of the rules file: 3 per minute per user (1-second buckets keep the count exact); in
 * domain "c", at most 2 leases held per user (a concurrency limit). */
#define LIMIT 3
#define IN_FLIGHT 2
static const char* const RULES =
    "domains:\n"
    "  - name: t\n"
    "    rules:\n"
    "      - name: per-user\n"
    "        key: [user]\n"
    "        limits:\n"
    "          - {limit: 3, window: 1m, name: per-user, granularity: 1s}\n"
    "  - name: c\n"
    "    rules:\n"
    "      - name: in-flight\n"
    "        key: [user]\n"
    "        limits:\n"
    "          - {algorithm: concurrency, max_in_flight: 2, lease_ttl: 30s}\n";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

/* A port free for both UDP and TCP on 127.0.0.1 right now. */
static int free_port(void) {
  int attempt;
  for (attempt = 0; attempt < 50; ++attempt) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int t = socket(AF_INET, SOCK_STREAM, 0), u, ok;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (t < 0) continue;
    if (bind(t, (struct sockaddr*)&a, sizeof a) != 0 ||
        getsockname(t, (struct sockaddr*)&a, &len) != 0) {
      close(t);
      continue;
    }
    u = socket(AF_INET, SOCK_DGRAM, 0);
    ok = u >= 0 && bind(u, (struct sockaddr*)&a, sizeof a) == 0;
    if (u >= 0) close(u);
    close(t);
    if (ok) return ntohs(a.sin_port);
  }
  fprintf(stderr, "no free port\n");
  exit(1);
}

/* A UDP socket bound to a free loopback port; its port in *port. */
static int udp_socket(int* port) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  int s = socket(AF_INET, SOCK_DGRAM, 0);
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (s < 0 || bind(s, (struct sockaddr*)&a, sizeof a) != 0 ||
      getsockname(s, (struct sockaddr*)&a, &len) != 0) {
    fprintf(stderr, "udp socket: %s\n", strerror(errno));
    exit(1);
  }
  *port = ntohs(a.sin_port);
  return s;
}

typedef struct node {
  pid_t pid;
  int port;
  char addr[64];
  char dir[64];
} node;

static sluice_client* make_client(const char* const* nodes, size_t n, int transport, int fail_mode,
                                  uint32_t timeout_us) {
  sluice_options o;
  sluice_client* c = NULL;
  char why[256];
  int st;
  sluice_options_init(&o);
  o.nodes = nodes;
  o.num_nodes = n;
  o.transport = transport;
  o.fail_mode = fail_mode;
  o.timeout_us = timeout_us;
  st = sluice_client_create(&o, &c, why, sizeof why);
  if (st != SLUICE_OK) {
    fprintf(stderr, "sluice_client_create: %s: %s\n", sluice_strerror(st), why);
    exit(1);
  }
  return c;
}

static sluice_check user_check(const char* domain, sluice_entry* e, const char* user,
                               int64_t hits) {
  sluice_check c;
  e->key = "user";
  e->value = user;
  c.domain = domain;
  c.entries = e;
  c.num_entries = 1;
  c.hits = hits;
  return c;
}

/* Starts sluiced on a free port with RULES; returns once it answers (at most 10 s). */
static void start_node(node* n) {
  char rules[128], log[128], udp[64];
  FILE* f;
  const char* addr;
  sluice_client* probe;
  int i;
  strcpy(n->dir, "/tmp/sluice-c-api-XXXXXX");
  if (mkdtemp(n->dir) == NULL) {
    perror("mkdtemp");
    exit(1);
  }
  snprintf(rules, sizeof rules, "%s/rules.yaml", n->dir);
  snprintf(log, sizeof log, "%s/sluiced.log", n->dir);
  f = fopen(rules, "w");
  if (f == NULL || fputs(RULES, f) < 0 || fclose(f) != 0) {
    perror("rules");
    exit(1);
  }
  n->port = free_port();
  snprintf(n->addr, sizeof n->addr, "127.0.0.1:%d", n->port);
  snprintf(udp, sizeof udp, "127.0.0.1:%d", n->port);
  n->pid = fork();
  if (n->pid == 0) {
    FILE* out = freopen(log, "w", stdout);
    if (out == NULL || dup2(fileno(stdout), 2) < 0) _exit(126);
    execl(SLUICED_BIN, SLUICED_BIN, "--udp", udp, "--tcp", udp, "--admin", "", "--grpc", "", "--resp", "",
          "--data-dir", "", "--rules", rules, "--threads", "1", "--log-level", "warn", (char*)NULL);
    _exit(127);
  }
  if (n->pid < 0) {
    perror("fork");
    exit(1);
  }
  addr = n->addr;
  probe = make_client(&addr, 1, SLUICE_UDP, SLUICE_FAIL_CLOSED, 100000);
  for (i = 0; i < 100; ++i) { /* 100 x (<= 100 ms + 50 ms) */
    sluice_entry e;
    sluice_check c = user_check("t", &e, "probe", 0);
    sluice_result r;
    int status;
    sluice_result_init(&r);
    if (sluice_check_one(probe, &c, &r) == SLUICE_OK) break;
    if (waitpid(n->pid, &status, WNOHANG) == n->pid) {
      fprintf(stderr, "sluiced exited at start (status %d); log in %s\n", status, log);
      exit(1);
    }
    sleep_ms(50);
  }
  sluice_client_destroy(&probe);
  if (i == 100) {
    fprintf(stderr, "sluiced did not answer within 10 s; log in %s\n", log);
    exit(1);
  }
}

static void stop_node(node* n) {
  char cmd[128];
  if (n->pid > 0) {
    kill(n->pid, SIGKILL);
    waitpid(n->pid, NULL, 0);
    n->pid = -1;
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", n->dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", n->dir);
}

/* ---- cases ---------------------------------------------------------------------------------- */

static void allowed_then_denied(int transport) {
  node n;
  const char* addr;
  sluice_client* c;
  int i;
  start_node(&n);
  addr = n.addr;
  c = make_client(&addr, 1, transport, SLUICE_FAIL_OPEN, 500000);
  for (i = 0; i < LIMIT + 2; ++i) {
    sluice_entry e;
    sluice_check chk = user_check("t", &e, "alice", 1);
    sluice_result r;
    sluice_result_init(&r);
    EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_OK);
    EXPECT(r.status == SLUICE_OK);
    EXPECT(r.outcome == SLUICE_DECIDED);
    EXPECT(r.num_limits == 1);
    EXPECT(strcmp(r.limits[0].name, "per-user") == 0);
    EXPECT(r.limits[0].limit == LIMIT);
    EXPECT(r.limits[0].window_ms == 60000);
    if (i < LIMIT) {
      EXPECT(r.allowed == 1);
      EXPECT(r.limits[0].remaining == (uint64_t)(LIMIT - 1 - i));
      EXPECT(r.limits[0].exceeded == 0);
    } else {
      EXPECT(r.allowed == 0);
      EXPECT(r.limits[0].remaining == 0);
      EXPECT(r.limits[0].exceeded == 1);
      EXPECT(r.limits[0].retry_after_ms > 0);
    }
  }
  /* Another user has a budget of its own. */
  {
    sluice_entry e;
    sluice_check chk = user_check("t", &e, "bob", 1);
    sluice_result r;
    sluice_result_init(&r);
    EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_OK);
    EXPECT(r.allowed == 1);
  }
  sluice_client_destroy(&c);
  stop_node(&n);
}

static void case_check_udp(void) {
  allowed_then_denied(SLUICE_UDP);
}
static void case_check_tcp(void) {
  allowed_then_denied(SLUICE_TCP);
}

static void case_batch(void) {
  node n;
  const char* addr;
  sluice_client* c;
  sluice_entry e[8];
  sluice_check checks[8];
  sluice_result results[8];
  int i, allowed = 0;
  start_node(&n);
  addr = n.addr;
  c = make_client(&addr, 1, SLUICE_UDP, SLUICE_FAIL_OPEN, 500000);
  for (i = 0; i < 5; ++i)
    checks[i] = user_check("t", &e[i], "carol", 1);
  checks[5] = user_check("", &e[5], "carol", 1);        /* refused by the client */
  checks[6] = user_check("nowhere", &e[6], "carol", 1); /* answered: unknown domain */
  checks[7] = user_check("t", &e[7], "dave", 2);
  for (i = 0; i < 8; ++i)
    sluice_result_init(&results[i]);
  EXPECT_STATUS(sluice_check_batch(c, checks, 8, results), SLUICE_OK);
  for (i = 0; i < 5; ++i) {
    EXPECT_STATUS(results[i].status, SLUICE_OK);
    allowed += results[i].allowed;
  }
  EXPECT(allowed == LIMIT); /* 5 checks of one user against a limit of 3 */
  EXPECT_STATUS(results[5].status, SLUICE_ERR_EMPTY_DOMAIN);
  EXPECT(results[5].outcome == SLUICE_INVALID && results[5].allowed == 0);
  EXPECT_STATUS(results[6].status, SLUICE_ERR_UNKNOWN_DOMAIN);
  EXPECT(results[6].outcome == SLUICE_DECIDED);
  EXPECT_STATUS(results[7].status, SLUICE_OK);
  EXPECT(results[7].allowed == 1 && results[7].limits[0].remaining == LIMIT - 2);
  /* An empty batch is a no-op. */
  EXPECT_STATUS(sluice_check_batch(c, checks, 0, results), SLUICE_OK);
  sluice_client_destroy(&c);
  stop_node(&n);
}

/* ---- async ---------------------------------------------------------------------------------- */

typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int calls;
  int allowed;
  int bad_status;
  int nested_blocking; /* what a blocking check from the callback returned */
  int nested_destroy;  /* what a destroy from the callback returned */
  sluice_client* client;
} waiter;

static void on_result(const sluice_result* r, void* user) {
  waiter* w = (waiter*)user;
  sluice_entry e;
  sluice_check chk = user_check("t", &e, "nested", 1);
  sluice_result nested;
  sluice_client* c = w->client;
  sluice_result_init(&nested);
  pthread_mutex_lock(&w->mu);
  ++w->calls;
  w->allowed += r->allowed;
  if (r->status != SLUICE_OK || r->struct_size != sizeof(sluice_result)) ++w->bad_status;
  if (w->calls == 1) {
    w->nested_blocking = sluice_check_one(c, &chk, &nested);
    w->nested_destroy = sluice_client_destroy(&c);
  }
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void case_async(void) {
  node n;
  const char* addr;
  waiter w;
  int i, sent = 0;
  double until;
  start_node(&n);
  addr = n.addr;
  memset(&w, 0, sizeof w);
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  w.nested_blocking = -1;
  w.nested_destroy = -1;
  w.client = make_client(&addr, 1, SLUICE_UDP, SLUICE_FAIL_OPEN, 500000);
  for (i = 0; i < 10; ++i) {
    sluice_entry e;
    sluice_check chk = user_check("t", &e, "erin", 1);
    if (sluice_check_async(w.client, &chk, on_result, &w) == SLUICE_OK) ++sent;
  }
  EXPECT(sent == 10);
  until = now_s() + 5.0;
  pthread_mutex_lock(&w.mu);
  while (w.calls < sent && now_s() < until) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec += 1;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&w.cv, &w.mu, &ts);
  }
  EXPECT(w.calls == 10);
  EXPECT(w.allowed == LIMIT);
  EXPECT(w.bad_status == 0);
  EXPECT_STATUS(w.nested_blocking, SLUICE_ERR_IN_CALLBACK);
  EXPECT_STATUS(w.nested_destroy, SLUICE_ERR_IN_CALLBACK);
  pthread_mutex_unlock(&w.mu);
  /* Bad arguments are refused at once and their callback never runs. */
  {
    sluice_entry e;
    sluice_check chk = user_check("", &e, "erin", 1);
    EXPECT_STATUS(sluice_check_async(w.client, &chk, on_result, &w), SLUICE_ERR_EMPTY_DOMAIN);
    chk = user_check("t", &e, "erin", 1);
    EXPECT_STATUS(sluice_check_async(w.client, &chk, NULL, &w), SLUICE_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(sluice_check_async(NULL, &chk, on_result, &w), SLUICE_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(sluice_check_async(w.client, NULL, on_result, &w), SLUICE_ERR_INVALID_ARGUMENT);
  }
  sluice_client_destroy(&w.client);
  EXPECT(w.client == NULL);
  EXPECT(w.calls == 10);
  pthread_mutex_destroy(&w.mu);
  pthread_cond_destroy(&w.cv);
  stop_node(&n);
}

/* Pending async checks at destroy: each callback runs once, as unavailable. */
static void on_count(const sluice_result* r, void* user) {
  int* counts = (int*)user;
  ++counts[0];
  if (r->status == SLUICE_ERR_UNAVAILABLE && r->allowed == 0) ++counts[1];
}

static void case_async_destroy_pending(void) {
  int silent_port, silent = udp_socket(&silent_port), i;
  char addr_buf[64];
  const char* addr = addr_buf;
  int counts[2] = {0, 0};
  sluice_client* c;
  snprintf(addr_buf, sizeof addr_buf, "127.0.0.1:%d", silent_port);
  c = make_client(&addr, 1, SLUICE_UDP, SLUICE_FAIL_CLOSED, 2000000); /* 2 s: still pending */
  for (i = 0; i < 5; ++i) {
    sluice_entry e;
    sluice_check chk = user_check("t", &e, "frank", 1);
    EXPECT_STATUS(sluice_check_async(c, &chk, on_count, counts), SLUICE_OK);
  }
  EXPECT_STATUS(sluice_client_destroy(&c), SLUICE_OK); /* callbacks ran before it returned */
  EXPECT(counts[0] == 5);
  EXPECT(counts[1] == 5);
  close(silent);
}

/* ---- failover, fail modes, garbage ---------------------------------------------------------- */

static void case_failover(void) {
  node n;
  char dead[64];
  const char* nodes[2];
  int t;
  start_node(&n);
  snprintf(dead, sizeof dead, "127.0.0.1:%d", free_port()); /* nothing listens there */
  nodes[0] = dead;
  nodes[1] = n.addr;
  for (t = 0; t < 2; ++t) {
    sluice_client* c =
        make_client(nodes, 2, t == 0 ? SLUICE_UDP : SLUICE_TCP, SLUICE_FAIL_CLOSED, 500000);
    sluice_entry e;
    sluice_check chk = user_check("t", &e, t == 0 ? "gina-udp" : "gina-tcp", 1);
    sluice_result r;
    sluice_stats s;
    sluice_result_init(&r);
    EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_OK);
    EXPECT(r.outcome == SLUICE_DECIDED && r.allowed == 1);
    EXPECT(r.num_limits == 1 && r.limits[0].remaining == LIMIT - 1);
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    EXPECT_STATUS(sluice_client_stats(c, &s), SLUICE_OK);
    EXPECT(s.checks >= 1 && s.answers >= 1);
    sluice_client_destroy(&c);
  }
  stop_node(&n);
}

static void fail_mode_case(int fail_mode) {
  char dead[64], silent_addr[64];
  const char* nodes[2];
  int silent_port, silent = udp_socket(&silent_port), t;
  snprintf(dead, sizeof dead, "127.0.0.1:%d", free_port());
  snprintf(silent_addr, sizeof silent_addr, "127.0.0.1:%d", silent_port);
  nodes[0] = dead;        /* refuses: ICMP port unreachable / connection refused */
  nodes[1] = silent_addr; /* takes datagrams, never answers */
  for (t = 0; t < 2; ++t) {
    sluice_client* c = make_client(nodes, 2, t == 0 ? SLUICE_UDP : SLUICE_TCP, fail_mode, 100000);
    sluice_entry e;
    sluice_check chk = user_check("t", &e, "hank", 1);
    sluice_result r;
    double start = now_s(), took;
    sluice_result_init(&r);
    EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_UNAVAILABLE);
    took = now_s() - start;
    EXPECT(took < 1.0); /* 100 ms budget, plus slack for a loaded machine */
    EXPECT(r.outcome == SLUICE_UNAVAILABLE);
    EXPECT(r.allowed == (fail_mode == SLUICE_FAIL_OPEN ? 1 : 0));
    EXPECT(r.num_limits == 0);
    sluice_client_destroy(&c);
  }
  close(silent);
}

static void case_fail_open(void) {
  fail_mode_case(SLUICE_FAIL_OPEN);
}
static void case_fail_closed(void) {
  fail_mode_case(SLUICE_FAIL_CLOSED);
}

typedef struct garbage_server {
  int sock;
  int answered;
  double until;
} garbage_server;

/* Answers every datagram with bytes that are no answer, until `until`. */
static void* garbage_loop(void* arg) {
  garbage_server* g = (garbage_server*)arg;
  static const char junk[] = "\x01\x02this is not a Cap'n Proto answer\xff\xfe";
  int i;
  for (i = 0; i < 1000 && now_s() < g->until; ++i) {
    struct pollfd p;
    char buf[70000];
    struct sockaddr_in from;
    socklen_t len = sizeof from;
    ssize_t got;
    p.fd = g->sock;
    p.events = POLLIN;
    p.revents = 0;
    if (poll(&p, 1, 50) != 1) continue;
    got = recvfrom(g->sock, buf, sizeof buf, 0, (struct sockaddr*)&from, &len);
    if (got < 0) continue;
    if (sendto(g->sock, junk, sizeof junk, 0, (struct sockaddr*)&from, len) > 0) ++g->answered;
  }
  return NULL;
}

static void case_garbage_answer(void) {
  node n;
  garbage_server g;
  pthread_t thread;
  int port;
  char addr_buf[64];
  const char* only[1];
  const char* both[2];
  sluice_client* c;
  sluice_entry e;
  sluice_check chk;
  sluice_result r;
  sluice_stats s;
  start_node(&n);
  g.sock = udp_socket(&port);
  g.answered = 0;
  g.until = now_s() + 10.0;
  snprintf(addr_buf, sizeof addr_buf, "127.0.0.1:%d", port);
  if (pthread_create(&thread, NULL, garbage_loop, &g) != 0) {
    fprintf(stderr, "pthread_create failed\n");
    exit(1);
  }
  /* Only the garbage node: that call fails with the fail mode; the client is still fine. */
  only[0] = addr_buf;
  c = make_client(only, 1, SLUICE_UDP, SLUICE_FAIL_CLOSED, 500000);
  chk = user_check("t", &e, "ivan", 1);
  sluice_result_init(&r);
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_UNAVAILABLE);
  EXPECT(r.allowed == 0);
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  EXPECT_STATUS(sluice_client_stats(c, &s), SLUICE_OK);
  EXPECT(s.dropped_answers >= 1);
  sluice_client_destroy(&c);
  /* Garbage first, a real node second: the check still gets its decision. */
  both[0] = addr_buf;
  both[1] = n.addr;
  c = make_client(both, 2, SLUICE_UDP, SLUICE_FAIL_CLOSED, 500000);
  sluice_result_init(&r);
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_OK);
  EXPECT(r.allowed == 1 && r.outcome == SLUICE_DECIDED);
  sluice_result_init(&r);
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_OK); /* and the next call too */
  sluice_client_destroy(&c);
  g.until = 0;
  pthread_join(thread, NULL);
  EXPECT(g.answered >= 2);
  close(g.sock);
  stop_node(&n);
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void case_bad_input(void) {
  node n;
  const char* addr;
  sluice_client* c;
  sluice_options o;
  sluice_result r;
  sluice_entry e, many[SLUICE_MAX_ENTRIES + 1];
  sluice_check chk;
  char why[256];
  char* huge;
  char long_key[301];
  int i;
  start_node(&n);
  addr = n.addr;

  /* create */
  EXPECT_STATUS(sluice_client_create(NULL, &c, why, sizeof why), SLUICE_ERR_INVALID_ARGUMENT);
  sluice_options_init(&o);
  EXPECT_STATUS(sluice_client_create(&o, NULL, why, sizeof why), SLUICE_ERR_INVALID_ARGUMENT);
  c = (sluice_client*)&o; /* garbage in: create must reset it */
  EXPECT_STATUS(sluice_client_create(&o, &c, why, sizeof why), SLUICE_ERR_INVALID_ARGUMENT);
  EXPECT(c == NULL);
  EXPECT(strcmp(why, "no nodes") == 0);
  o.num_nodes = 1; /* nodes NULL */
  EXPECT_STATUS(sluice_client_create(&o, &c, why, sizeof why), SLUICE_ERR_INVALID_ARGUMENT);
  {
    const char* bad[] = {"nonsense"};
    const char* v6[] = {"::1:7350"};
    const char* null_node[] = {NULL};
    o.nodes = bad;
    EXPECT_STATUS(sluice_client_create(&o, &c, why, sizeof why), SLUICE_ERR_BAD_NODE);
    o.nodes = v6;
    EXPECT_STATUS(sluice_client_create(&o, &c, why, sizeof why), SLUICE_ERR_BAD_NODE);
    EXPECT(strstr(why, "brackets") != NULL);
    o.nodes = null_node;
    EXPECT_STATUS(sluice_client_create(&o, &c, why, sizeof why), SLUICE_ERR_INVALID_ARGUMENT);
  }
  o.nodes = &addr;
  o.transport = 7;
  EXPECT_STATUS(sluice_client_create(&o, &c, NULL, 0), SLUICE_ERR_INVALID_ARGUMENT);
  o.transport = SLUICE_UDP;
  o.attempts = 0;
  EXPECT_STATUS(sluice_client_create(&o, &c, why, 8), SLUICE_ERR_INVALID_ARGUMENT);
  EXPECT(strlen(why) == 7); /* cut to the buffer */
  o.attempts = 2;
  o.timeout_us = 0;
  EXPECT_STATUS(sluice_client_create(&o, &c, why, sizeof why), SLUICE_ERR_INVALID_ARGUMENT);
  o.timeout_us = 500000;
  o.struct_size = sizeof o - 1;
  EXPECT_STATUS(sluice_client_create(&o, &c, why, sizeof why), SLUICE_ERR_INVALID_ARGUMENT);
  o.struct_size = sizeof o;
  EXPECT_STATUS(sluice_client_create(&o, &c, why, sizeof why), SLUICE_OK);
  EXPECT(c != NULL);

  /* checks */
  sluice_result_init(&r);
  chk = user_check("t", &e, "judy", 1);
  EXPECT_STATUS(sluice_check_one(NULL, &chk, &r), SLUICE_ERR_INVALID_ARGUMENT);
  EXPECT(r.allowed == 0);
  EXPECT_STATUS(sluice_check_one(c, NULL, &r), SLUICE_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(sluice_check_one(c, &chk, NULL), SLUICE_ERR_INVALID_ARGUMENT);
  r.struct_size = 3;
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_INVALID_ARGUMENT);
  sluice_result_init(&r);
  chk = user_check("", &e, "judy", 1);
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_EMPTY_DOMAIN);
  EXPECT(r.status == SLUICE_ERR_EMPTY_DOMAIN && r.allowed == 0);
  chk = user_check(NULL, &e, "judy", 1);
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_INVALID_ARGUMENT);
  chk = user_check("t", &e, "judy", 1);
  e.key = NULL;
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_INVALID_ARGUMENT);
  e.key = "user";
  e.value = NULL;
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_INVALID_ARGUMENT);
  chk = user_check("t", &e, "judy", 1);
  chk.entries = NULL;
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_INVALID_ARGUMENT);
  chk = user_check("t", &e, "judy", -1);
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_NEGATIVE_HITS);
  for (i = 0; i <= SLUICE_MAX_ENTRIES; ++i) {
    many[i].key = "k";
    many[i].value = "v";
  }
  chk.entries = many;
  chk.num_entries = SLUICE_MAX_ENTRIES + 1;
  chk.hits = 1;
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_TOO_MANY_ENTRIES);
  chk.num_entries = (size_t)-1; /* never read: refused by its count */
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_TOO_MANY_ENTRIES);
  /* An oversized key: refused by the client (over SLUICE_MAX_STRING_BYTES)... */
  huge = (char*)malloc(SLUICE_MAX_STRING_BYTES + 2);
  EXPECT(huge != NULL);
  memset(huge, 'k', SLUICE_MAX_STRING_BYTES + 1);
  huge[SLUICE_MAX_STRING_BYTES + 1] = '\0';
  chk = user_check("t", &e, "judy", 1);
  e.key = huge;
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_TOO_LARGE);
  e.key = "user";
  e.value = huge;
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_TOO_LARGE);
  chk.domain = huge;
  e.value = "judy";
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_TOO_LARGE);
  free(huge);
  /* ...and one over the node's max_entry_bytes (256): the node's answer. */
  memset(long_key, 'k', 300);
  long_key[300] = '\0';
  chk = user_check("t", &e, long_key, 1);
  sluice_result_init(&r);
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_ENTRY_TOO_LONG);
  EXPECT(r.outcome == SLUICE_DECIDED && r.allowed == 0);
  /* Duplicate and empty keys: the node's answers. */
  {
    sluice_entry two[2] = {{"user", "a"}, {"user", "b"}};
    sluice_entry empty_key[1] = {{"", "a"}};
    chk.entries = two;
    chk.num_entries = 2;
    EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_DUPLICATE_ENTRY);
    chk.entries = empty_key;
    chk.num_entries = 1;
    EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_EMPTY_ENTRY_KEY);
  }
  /* batch */
  {
    sluice_result rs[2];
    sluice_check cs[2];
    sluice_entry es[2];
    cs[0] = user_check("t", &es[0], "kim", 1);
    cs[1] = user_check("t", &es[1], "kim", 1);
    sluice_result_init(&rs[0]);
    sluice_result_init(&rs[1]);
    EXPECT_STATUS(sluice_check_batch(c, NULL, 2, rs), SLUICE_ERR_INVALID_ARGUMENT);
    EXPECT(rs[0].status == SLUICE_ERR_INVALID_ARGUMENT && rs[1].allowed == 0);
    EXPECT_STATUS(sluice_check_batch(c, cs, 2, NULL), SLUICE_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(sluice_check_batch(NULL, cs, 2, rs), SLUICE_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(sluice_check_batch(c, cs, (size_t)SLUICE_MAX_BATCH + 1, rs),
                  SLUICE_ERR_INVALID_ARGUMENT);
    rs[1].struct_size = 0;
    EXPECT_STATUS(sluice_check_batch(c, cs, 2, rs), SLUICE_ERR_INVALID_ARGUMENT);
    sluice_result_init(&rs[1]);
    EXPECT_STATUS(sluice_check_batch(c, cs, 2, rs), SLUICE_OK);
    EXPECT(rs[0].status == SLUICE_OK && rs[1].status == SLUICE_OK);
  }
  /* stats */
  {
    sluice_stats s;
    memset(&s, 0, sizeof s);
    EXPECT_STATUS(sluice_client_stats(c, &s), SLUICE_ERR_INVALID_ARGUMENT); /* no struct_size */
    s.struct_size = sizeof s;
    EXPECT_STATUS(sluice_client_stats(NULL, &s), SLUICE_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(sluice_client_stats(c, NULL), SLUICE_ERR_INVALID_ARGUMENT);
  }
  /* destroy: the handle is NULLed, a second destroy and later calls fail cleanly */
  EXPECT_STATUS(sluice_client_destroy(&c), SLUICE_OK);
  EXPECT(c == NULL);
  EXPECT_STATUS(sluice_client_destroy(&c), SLUICE_OK);
  EXPECT_STATUS(sluice_client_destroy(NULL), SLUICE_OK);
  chk = user_check("t", &e, "judy", 1);
  sluice_result_init(&r);
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_INVALID_ARGUMENT);
  /* every status has a text */
  for (i = 0; i <= SLUICE_ERR_LEASE_RELEASED; ++i) {
    EXPECT(sluice_strerror(i) != NULL);
    EXPECT(strcmp(sluice_strerror(i), "unknown status") != 0);
  }
  EXPECT(strcmp(sluice_strerror(-1), "unknown status") == 0);
  EXPECT(strcmp(sluice_strerror(1000), "unknown status") == 0);
  sluice_options_init(NULL); /* no-ops, no crash */
  sluice_result_init(NULL);
  stop_node(&n);
}

/* Concurrency leases: granted in the result, given back with sluice_release. */
static void case_lease(void) {
  node n;
  const char* addr;
  sluice_client* c;
  sluice_entry e;
  sluice_check chk;
  sluice_result r;
  uint64_t held[IN_FLIGHT];
  int i;
  start_node(&n);
  addr = n.addr;
  c = make_client(&addr, 1, SLUICE_UDP, SLUICE_FAIL_CLOSED, 500000);
  chk = user_check("c", &e, "alice", 1);
  for (i = 0; i < IN_FLIGHT; ++i) {
    sluice_result_init(&r);
    r.lease = 12345; /* overwritten: every result says whether it carries a lease */
    EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_OK);
    EXPECT(r.allowed == 1);
    EXPECT(r.lease != 0);
    held[i] = r.lease;
  }
  EXPECT(held[0] != held[1]);
  sluice_result_init(&r);
  r.lease = 12345;
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_OK);
  EXPECT(r.allowed == 0); /* both slots held */
  EXPECT(r.lease == 0);

  EXPECT_STATUS(sluice_release(c, &chk, held[0]), SLUICE_OK);
  EXPECT_STATUS(sluice_release(c, &chk, held[0]), SLUICE_ERR_LEASE_RELEASED);
  sluice_result_init(&r);
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_OK);
  EXPECT(r.allowed == 1); /* the released slot */
  EXPECT(r.lease != 0);
  {
    /* Another user's entries, a lease never granted: unknown, nothing changes. */
    sluice_entry other;
    sluice_check bob = user_check("c", &other, "bob", 1);
    EXPECT_STATUS(sluice_release(c, &bob, held[1]), SLUICE_ERR_LEASE_UNKNOWN);
    /* Never granted: the high half (its expiry time) kept, so it is not taken for expired. */
    EXPECT_STATUS(sluice_release(c, &chk, held[1] ^ 0x5a5a5a5aULL), SLUICE_ERR_LEASE_UNKNOWN);
    EXPECT_STATUS(sluice_release(c, &chk, 0xffULL), SLUICE_ERR_LEASE_EXPIRED); /* 1970 */
  }
  chk.hits = -1; /* ignored by a release */
  EXPECT_STATUS(sluice_release(c, &chk, held[1]), SLUICE_OK);
  EXPECT_STATUS(sluice_release(c, &chk, r.lease), SLUICE_OK);
  /* Bad arguments. */
  EXPECT_STATUS(sluice_release(c, &chk, 0), SLUICE_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(sluice_release(NULL, &chk, 1), SLUICE_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(sluice_release(c, NULL, 1), SLUICE_ERR_INVALID_ARGUMENT);
  chk = user_check("", &e, "alice", 1);
  EXPECT_STATUS(sluice_release(c, &chk, 1), SLUICE_ERR_EMPTY_DOMAIN);
  chk = user_check("nope", &e, "alice", 1);
  EXPECT_STATUS(sluice_release(c, &chk, 1), SLUICE_ERR_UNKNOWN_DOMAIN);
  EXPECT(strcmp(sluice_strerror(SLUICE_ERR_LEASE_EXPIRED), "unknown status") != 0);
  sluice_client_destroy(&c);
  stop_node(&n);
}

/* A program linked before leases: its results are version 0 (no `lease`), and it calls
 * sluice_result_init@SLUICE_0, which must not write past them. */
__asm__(".symver sluice_result_init_linked_before_leases, sluice_result_init@SLUICE_0");
void sluice_result_init_linked_before_leases(sluice_result* result);

static void case_result_v0(void) {
  const size_t v0 = offsetof(sluice_result, lease);
  node n;
  const char* addr;
  sluice_client* c;
  sluice_entry e;
  sluice_check chk;
  sluice_result r;
  unsigned char past[sizeof r.lease];
  memset(&r, 0xab, sizeof r);
  memset(past, 0xab, sizeof past);
  sluice_result_init_linked_before_leases(&r);
  EXPECT(r.struct_size == v0);
  EXPECT(r.status == 0 && r.num_limits == 0);
  EXPECT(memcmp(&r.lease, past, sizeof past) == 0); /* untouched */
  start_node(&n);
  addr = n.addr;
  c = make_client(&addr, 1, SLUICE_UDP, SLUICE_FAIL_CLOSED, 500000);
  chk = user_check("c", &e, "old", 1); /* a lease is granted, and not written */
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_OK);
  EXPECT(r.allowed == 1);
  EXPECT(memcmp(&r.lease, past, sizeof past) == 0);
  chk.domain = ""; /* an error result is cleared, as far as version 0 goes */
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_EMPTY_DOMAIN);
  EXPECT(memcmp(&r.lease, past, sizeof past) == 0);
  {
    /* A version-0 caller's batch: an array whose stride is the version-0 size, with 8 more
     * bytes after it that nothing may touch. */
    uint64_t words[(2 * 1192 + 8) / 8];
    unsigned char* bytes = (unsigned char*)words;
    sluice_result* r0 = (sluice_result*)bytes;
    sluice_result* r1 = (sluice_result*)(bytes + v0);
    sluice_check cs[2];
    sluice_entry es[2];
    EXPECT(sizeof words >= 2 * v0 + sizeof past);
    memset(words, 0xab, sizeof words);
    r0->struct_size = v0;
    r1->struct_size = v0;
    cs[0] = user_check("c", &es[0], "old2", 1);
    cs[1] = user_check("c", &es[1], "old3", 1);
    EXPECT_STATUS(sluice_check_batch(c, cs, 2, r0), SLUICE_OK);
    EXPECT(r0->status == SLUICE_OK && r0->allowed == 1);
    EXPECT(r1->struct_size == v0); /* where r0's lease would be: untouched */
    EXPECT(r1->status == SLUICE_OK && r1->allowed == 1);
    EXPECT(memcmp(bytes + 2 * v0, past, sizeof past) == 0);
    /* One array has one version: sizes that differ are refused. */
    r1->struct_size = sizeof(sluice_result);
    EXPECT_STATUS(sluice_check_batch(c, cs, 2, r0), SLUICE_ERR_INVALID_ARGUMENT);
  }
  r.struct_size = v0 + 4; /* neither version */
  EXPECT_STATUS(sluice_check_one(c, &chk, &r), SLUICE_ERR_INVALID_ARGUMENT);
  sluice_client_destroy(&c);
  stop_node(&n);
}

typedef struct test_case {
  const char* name;
  void (*run)(void);
} test_case;

static const test_case cases[] = {
    {"check_udp", case_check_udp},
    {"check_tcp", case_check_tcp},
    {"batch", case_batch},
    {"async", case_async},
    {"async_destroy_pending", case_async_destroy_pending},
    {"failover", case_failover},
    {"fail_open", case_fail_open},
    {"fail_closed", case_fail_closed},
    {"garbage_answer", case_garbage_answer},
    {"bad_input", case_bad_input},
    {"lease", case_lease},
    {"result_v0", case_result_v0},
};

int main(int argc, char** argv) {
  size_t i;
  signal(SIGPIPE, SIG_IGN);
  if (argc != 2) {
    fprintf(stderr, "usage: c_api_test CASE (or --list)\n");
    return 2;
  }
  for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    if (strcmp(argv[1], "--list") == 0) {
      printf("%s\n", cases[i].name);
    } else if (strcmp(argv[1], cases[i].name) == 0) {
      cases[i].run();
      if (failures != 0) {
        fprintf(stderr, "%s: %d expectation(s) failed\n", cases[i].name, failures);
        return 1;
      }
      printf("%s: ok\n", cases[i].name);
      return 0;
    }
  }
  if (strcmp(argv[1], "--list") == 0) return 0;
  fprintf(stderr, "no case named %s\n", argv[1]);
  return 2;
}
