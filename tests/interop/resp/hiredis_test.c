/* The RESP door of a real sluiced called by hiredis (Debian's libhiredis-dev, RESP2) with its
 * default settings: CL.THROTTLE single and pipelined (redisAppendCommand, then the replies in
 * order), MULTI/EXEC, DEL, AUTH, and SLUICE.CHECK against the rules. tests/interop/resp/run.sh
 * starts sluiced and sets SLUICE_RESP_PORT, SLUICE_RESP_AUTH_PORT and SLUICE_RESP_PASSWORD. Every
 * read has a 5 s timeout; the exit code is 1 when any check failed, each named on stderr. */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static int failures = 0;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      ++failures;                                                     \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fputc('\n', stderr);                                            \
    }                                                                 \
  } while (0)

static int env_port(const char* name) {
  const char* v = getenv(name);
  if (!v || !*v) {
    fprintf(stderr, "FAIL: %s is not set (run by tests/interop/resp/run.sh hiredis)\n", name);
    exit(1);
  }
  return atoi(v);
}

static redisContext* connect_to(int port) {
  struct timeval timeout = {5, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, timeout);
  if (!c || c->err) {
    fprintf(stderr, "FAIL: cannot connect to 127.0.0.1:%d: %s\n", port,
            c ? c->errstr : "no memory");
    exit(1);
  }
  redisSetTimeout(c, timeout);
  return c;
}

/* Whether `r` is an array of `n` integers equal to `want` (a negative n checks only the first
 * -n). */
static int ints_are(const redisReply* r, const long long* want, int n) {
  int check = n < 0 ? -n : n;
  if (!r || r->type != REDIS_REPLY_ARRAY) return 0;
  if (n >= 0 && r->elements != (size_t)n) return 0;
  if (r->elements < (size_t)check) return 0;
  for (int i = 0; i < check; ++i) {
    if (r->element[i]->type != REDIS_REPLY_INTEGER || r->element[i]->integer != want[i]) return 0;
  }
  return 1;
}

static void print_reply(const redisReply* r) {
  if (!r) {
    fprintf(stderr, "(no reply)\n");
    return;
  }
  if (r->type == REDIS_REPLY_ARRAY) {
    fprintf(stderr, "[");
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      if (e->type == REDIS_REPLY_INTEGER)
        fprintf(stderr, "%s%lld", i ? "," : "", e->integer);
      else
        fprintf(stderr, "%s(type %d)", i ? "," : "", e->type);
    }
    fprintf(stderr, "]\n");
  } else if (r->type == REDIS_REPLY_INTEGER) {
    fprintf(stderr, "%lld\n", r->integer);
  } else {
    fprintf(stderr, "type %d: %s\n", r->type, r->str ? r->str : "");
  }
}

static const long long kFresh[5] = {0, 16, 15, -1, 2}; /* redis-cell's README example */
static const long long kSecond[4] = {0, 16, 14, -1};

static redisReply* throttle(redisContext* c, const char* key) {
  return redisCommand(c, "CL.THROTTLE %s 15 30 60", key);
}

static void test_single(void) {
  redisContext* c = connect_to(env_port("SLUICE_RESP_PORT"));
  redisReply* r = redisCommand(c, "PING");
  CHECK(r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0, "PING");
  freeReplyObject(r);
  r = throttle(c, "c-user123");
  CHECK(ints_are(r, kFresh, 5), "a fresh key: [0,16,15,-1,2]");
  if (!ints_are(r, kFresh, 5)) print_reply(r);
  freeReplyObject(r);
  r = throttle(c, "c-user123");
  CHECK(ints_are(r, kSecond, -4), "the second: [0,16,14,-1,...]");
  freeReplyObject(r);
  redisFree(c);
}

static void test_pipelined(void) {
  redisContext* c = connect_to(env_port("SLUICE_RESP_PORT"));
  for (int i = 0; i < 5; ++i)
    redisAppendCommand(c, "CL.THROTTLE c-pipe 15 30 60");
  for (int i = 0; i < 5; ++i) {
    redisReply* r = NULL;
    CHECK(redisGetReply(c, (void**)&r) == REDIS_OK, "pipelined reply %d: %s", i, c->errstr);
    long long want[4] = {0, 16, 15 - i, -1};
    CHECK(ints_are(r, want, -4), "pipelined reply %d has remaining %d", i, 15 - i);
    if (r) freeReplyObject(r);
  }
  redisFree(c);
}

static void test_multi_exec(void) {
  redisContext* c = connect_to(env_port("SLUICE_RESP_PORT"));
  redisReply* r = redisCommand(c, "MULTI");
  CHECK(r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0, "MULTI: +OK");
  freeReplyObject(r);
  for (int i = 0; i < 2; ++i) {
    r = throttle(c, "c-multi");
    CHECK(r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "QUEUED") == 0, "queued: +QUEUED");
    freeReplyObject(r);
  }
  r = redisCommand(c, "EXEC");
  CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements == 2, "EXEC: an array of 2");
  if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
    CHECK(ints_are(r->element[0], kFresh, 5), "EXEC's first: [0,16,15,-1,2]");
    CHECK(ints_are(r->element[1], kSecond, -4), "EXEC's second: [0,16,14,-1,...]");
  }
  freeReplyObject(r);
  redisFree(c);
}

static void test_del(void) {
  redisContext* c = connect_to(env_port("SLUICE_RESP_PORT"));
  freeReplyObject(throttle(c, "c-del"));
  freeReplyObject(throttle(c, "c-del"));
  redisReply* r = redisCommand(c, "DEL c-del c-never-seen");
  CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1, "DEL: 1 existed");
  freeReplyObject(r);
  r = throttle(c, "c-del");
  CHECK(ints_are(r, kFresh, 5), "after DEL the key starts fresh");
  freeReplyObject(r);
  redisFree(c);
}

static void test_auth(void) {
  redisContext* c = connect_to(env_port("SLUICE_RESP_AUTH_PORT"));
  const char* password = getenv("SLUICE_RESP_PASSWORD");
  redisReply* r = throttle(c, "c-auth");
  CHECK(r && r->type == REDIS_REPLY_ERROR && strcmp(r->str, "NOAUTH Authentication required.") == 0,
        "NOAUTH before AUTH");
  freeReplyObject(r);
  r = redisCommand(c, "AUTH %s", "not-the-password");
  CHECK(r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "WRONGPASS ", 10) == 0,
        "a wrong password: WRONGPASS");
  freeReplyObject(r);
  r = redisCommand(c, "AUTH %s", password ? password : "");
  CHECK(r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0, "the right password: +OK");
  freeReplyObject(r);
  r = throttle(c, "c-auth");
  CHECK(ints_are(r, kFresh, 5), "after AUTH: [0,16,15,-1,2]");
  freeReplyObject(r);
  redisFree(c);
}

static void test_sluice_check(void) {
  redisContext* c = connect_to(env_port("SLUICE_RESP_PORT"));
  /* allowed, limit, remaining */
  const long long want[4][3] = {{1, 3, 2}, {1, 3, 1}, {1, 3, 0}, {0, 3, 0}};
  for (int i = 0; i < 4; ++i) {
    redisReply* r = redisCommand(c, "SLUICE.CHECK api user c-ann");
    CHECK(ints_are(r, want[i], -3) && r->elements == 7, "SLUICE.CHECK %d", i);
    if (i == 3 && r && r->type == REDIS_REPLY_ARRAY && r->elements == 7)
      CHECK(r->element[3]->integer > 0, "a denied check has a retry after");
    freeReplyObject(r);
  }
  redisFree(c);
}

int main(void) {
  test_single();
  test_pipelined();
  test_multi_exec();
  test_del();
  test_auth();
  test_sluice_check();
  if (failures) {
    fprintf(stderr, "hiredis: %d check(s) failed\n", failures);
    return 1;
  }
  printf("hiredis %d.%d.%d: all checks passed\n", HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH);
  return 0;
}
