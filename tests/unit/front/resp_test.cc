// The RESP door's protocol half without a socket: the parser across every split of a pipelined
// stream and against hostile bytes, the session's replies in Redis's exact bytes (RESP2 and
// RESP3), MULTI/EXEC and pipelines in order while a fake backend answers out of order, and
// authentication.
#include "front/resp/resp_session.h"

#include <doctest/doctest.h>

#include <deque>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace sluice::front::resp;
using Command = std::vector<std::string>;

// A caller's buffer: bytes appended per chunk, consumed bytes dropped, the tail kept.
struct Stream {
  RespParser parser;
  std::string buffer;
  std::vector<Command> commands;
  RespParser::Status last = RespParser::Status::kNeedMore;

  void push(std::string_view chunk, bool authenticated = true) {
    buffer.append(chunk);
    while (true) {
      size_t consumed = 0;
      last = parser.next(buffer, consumed, authenticated);
      if (last == RespParser::Status::kCommand) {
        Command c;
        for (const std::string_view a : parser.args())
          c.emplace_back(a);
        commands.push_back(std::move(c));
      }
      buffer.erase(0, consumed);
      if (last != RespParser::Status::kCommand) return;
    }
  }
};

const std::string kPipeline =
    "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n"
    "PING\r\n"
    "*0\r\n"
    "*-1\r\n"
    "\r\n"
    "*1\r\n$0\r\n\r\n"
    "  echo  \"a b\\x41\\n\" 'it\\'s' \r\n"
    "*6\r\n$11\r\nCL.THROTTLE\r\n$7\r\nuser123\r\n$2\r\n15\r\n$2\r\n30\r\n$2\r\n60\r\n$1\r\n1\r\n"
    "*2\r\n$4\r\nECHO\r\n$4\r\n\r\n\r\n\r\n"
    "quit\n";

const std::vector<Command> kPipelineCommands = {
    {"SET", "k", "hello"},
    {"PING"},
    {""},
    {"echo", "a bA\n", "it's"},
    {"CL.THROTTLE", "user123", "15", "30", "60", "1"},
    {"ECHO", "\r\n\r\n"},
    {"quit"},
};

TEST_CASE(
    "resp parser: a pipelined stream gives the same commands whole, byte by byte, and in "
    "random chunks") {
  Stream whole;
  whole.push(kPipeline);
  CHECK(whole.commands == kPipelineCommands);
  CHECK(whole.buffer.empty());

  Stream bytes;
  for (const char c : kPipeline)
    bytes.push(std::string_view(&c, 1));
  CHECK(bytes.commands == kPipelineCommands);
  CHECK(bytes.buffer.empty());

  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    Stream chunks;
    size_t at = 0;
    while (at < kPipeline.size()) {
      const size_t n = std::uniform_int_distribution<size_t>(1, 40)(rng);
      chunks.push(std::string_view(kPipeline).substr(at, n));
      at += n;
    }
    REQUIRE(chunks.commands == kPipelineCommands);
  }
}

TEST_CASE("resp parser: every split point of the stream into two reads gives the same commands") {
  for (size_t split = 0; split <= kPipeline.size(); ++split) {
    Stream s;
    s.push(std::string_view(kPipeline).substr(0, split));
    s.push(std::string_view(kPipeline).substr(split));
    REQUIRE(s.commands == kPipelineCommands);
  }
}

TEST_CASE("resp parser: an unfinished command keeps only its own bytes") {
  Stream s;
  s.push("PING\r\n*2\r\n$4\r\nECHO\r\n$3\r\nab");
  CHECK(s.commands == std::vector<Command>{{"PING"}});
  CHECK(s.last == RespParser::Status::kNeedMore);
  CHECK(s.buffer == "*2\r\n$4\r\nECHO\r\n$3\r\nab");
  s.push("c\r\n");
  CHECK(s.commands.back() == Command{"ECHO", "abc"});
  CHECK(s.buffer.empty());
}

struct Hostile {
  std::string input;
  ProtocolError error;
  std::string text;
};

TEST_CASE("resp parser: hostile input is a protocol error with Redis's text") {
  const std::string big_bulks = [] {
    std::string s = "*20\r\n";
    for (int i = 0; i < 16; ++i)
      s += "$4096\r\n" + std::string(4096, 'x') + "\r\n";
    return s;
  }();
  const std::vector<Hostile> cases = {
      {"*abc\r\n", ProtocolError::kMultibulkLength, "ERR Protocol error: invalid multibulk length"},
      {"*-5\r\n", ProtocolError::kMultibulkLength, "ERR Protocol error: invalid multibulk length"},
      {"*01\r\n", ProtocolError::kMultibulkLength, "ERR Protocol error: invalid multibulk length"},
      {"*1025\r\n", ProtocolError::kMultibulkLength,
       "ERR Protocol error: invalid multibulk length"},
      {"*1\rX", ProtocolError::kMultibulkLength, "ERR Protocol error: invalid multibulk length"},
      {"*1\r\n$-1\r\n", ProtocolError::kBulkLength, "ERR Protocol error: invalid bulk length"},
      {"*1\r\n$abc\r\n", ProtocolError::kBulkLength, "ERR Protocol error: invalid bulk length"},
      {"*1\r\n$4097\r\n", ProtocolError::kBulkLength, "ERR Protocol error: invalid bulk length"},
      {"*1\r\n$ 3\r\n", ProtocolError::kBulkLength, "ERR Protocol error: invalid bulk length"},
      {"*2\r\n*1\r\n$1\r\na\r\n", ProtocolError::kExpectedDollar,
       "ERR Protocol error: expected '$', got '*'"},
      {"*1\r\n:1\r\n", ProtocolError::kExpectedDollar, "ERR Protocol error: expected '$', got ':'"},
      {"*1\r\n$3\r\nabcXY", ProtocolError::kBulkTerminator,
       "ERR Protocol error: invalid bulk terminator"},
      {"*" + std::string(40, '1'), ProtocolError::kMultibulkLineTooBig,
       "ERR Protocol error: too big mbulk count string"},
      {"*1\r\n$" + std::string(40, '1'), ProtocolError::kBulkLineTooBig,
       "ERR Protocol error: too big bulk count string"},
      {std::string(5000, 'A'), ProtocolError::kInlineTooBig,
       "ERR Protocol error: too big inline request"},
      {std::string(5000, 'A') + "\r\n", ProtocolError::kInlineTooBig,
       "ERR Protocol error: too big inline request"},
      {std::string(2000, 'a') + std::string(2000, ' ') + "\n", ProtocolError::kNone, ""},
      {"GET \"abc\r\n", ProtocolError::kUnbalancedQuotes,
       "ERR Protocol error: unbalanced quotes in request"},
      {"GET \"a\"b\r\n", ProtocolError::kUnbalancedQuotes,
       "ERR Protocol error: unbalanced quotes in request"},
      {"GET 'a\r\n", ProtocolError::kUnbalancedQuotes,
       "ERR Protocol error: unbalanced quotes in request"},
      {big_bulks, ProtocolError::kCommandTooBig, "ERR Protocol error: command over 65536 bytes"},
  };
  for (const Hostile& h : cases) {
    CAPTURE(h.input.substr(0, 40));
    Stream s;
    s.push(h.input);
    if (h.error == ProtocolError::kNone) {
      CHECK(s.last != RespParser::Status::kError);
      continue;
    }
    REQUIRE(s.last == RespParser::Status::kError);
    CHECK(s.parser.error() == h.error);
    std::string text;
    error_text(s.parser.error(), s.parser.error_byte(), text);
    CHECK(text == h.text);
    // Stuck in the error: nothing more is parsed.
    s.push("PING\r\n");
    CHECK(s.last == RespParser::Status::kError);
  }
}

TEST_CASE("resp parser: before AUTH an array holds at most 10 elements, as Redis") {
  Stream s;
  s.push("*11\r\n", false);
  REQUIRE(s.last == RespParser::Status::kError);
  CHECK(s.parser.error() == ProtocolError::kUnauthMultibulk);
  Stream ok;
  ok.push("*10\r\n", false);
  CHECK(ok.last == RespParser::Status::kNeedMore);
}

TEST_CASE("resp parser: random bytes never exceed the limits") {
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    Stream s;
    std::string junk(std::uniform_int_distribution<size_t>(1, 20000)(rng), '\0');
    for (char& c : junk)
      c = rng() % 8 == 0 ? "*$\r\n 0123"[rng() % 10] : static_cast<char>(rng());
    for (size_t at = 0; at < junk.size() && s.last != RespParser::Status::kError; at += 700)
      s.push(std::string_view(junk).substr(at, 700));
    CHECK(s.buffer.size() <= kMaxCommandBytes);
    for (const Command& c : s.commands) {
      REQUIRE(c.size() <= kMaxArgs);
      for (const std::string& a : c)
        REQUIRE(a.size() <= kMaxInlineBytes);
    }
  }
}

// A backend that answers at once, or keeps the Answers for a test to answer in any order.
struct FakeBackend : Backend {
  bool defer = false;
  std::vector<std::string> calls;
  std::deque<Answer<ThrottleAnswer>> throttles;
  std::deque<Answer<int64_t>> dels;
  std::deque<Answer<CheckAnswer>> checks;
  std::deque<Answer<LeaseAnswer>> acquires;
  std::deque<Answer<bool>> releases;

  void throttle(const ThrottleRequest& r, Answer<ThrottleAnswer> a) override {
    calls.push_back("throttle " + std::string(r.key) + " " + std::to_string(r.max_burst) + " " +
                    std::to_string(r.count_per_period) + " " + std::to_string(r.period_s) + " " +
                    std::to_string(r.quantity) + " db" + std::to_string(r.db));
    if (defer) return throttles.push_back(std::move(a));
    a.ok({0, r.max_burst + 1, r.max_burst, -1, 2});
  }
  void del(const DelRequest& r, Answer<int64_t> a) override {
    calls.push_back("del " + std::to_string(r.keys.size()));
    if (defer) return dels.push_back(std::move(a));
    a.ok(static_cast<int64_t>(r.keys.size()));
  }
  void check(const CheckRequest& r, Answer<CheckAnswer> a) override {
    std::string c = "check " + std::string(r.domain);
    for (const std::string_view e : r.entries)
      c += " " + std::string(e);
    calls.push_back(c + " hits" + std::to_string(r.hits));
    if (defer) return checks.push_back(std::move(a));
    a.ok({false, 10, 0, 3, 7, /*shadow=*/true, /*would_deny=*/false});
  }
  void acquire(const CheckRequest& r, Answer<LeaseAnswer> a) override {
    calls.push_back("acquire " + std::string(r.domain));
    if (defer) return acquires.push_back(std::move(a));
    a.ok({{true, 5, 4, 0, 0, false, /*would_deny=*/true}, 0x00c0ffee12345678});
  }
  void release(const ReleaseRequest& r, Answer<bool> a) override {
    calls.push_back("release " + std::string(r.domain) + " " + std::to_string(r.lease));
    if (defer) return releases.push_back(std::move(a));
    a.ok(true);
  }
};

struct Harness {
  explicit Harness(std::string password = "") : config{std::move(password)} {}
  Config config;
  FakeBackend backend;
  RespCounters counters;
  int wakes = 0;
  RespSession session{config, backend, counters, 7, [this] { ++wakes; }};
  std::string pending;

  // Feeds `input`, returns what the session answered.
  std::string run(std::string_view input) {
    pending.append(input);
    pending.erase(0, session.feed(pending));
    return take();
  }
  std::string take() {
    std::string out = std::move(session.output());
    session.output().clear();
    return out;
  }
};

std::string cmd(std::initializer_list<std::string_view> args) {
  std::string s = "*" + std::to_string(args.size()) + "\r\n";
  for (const std::string_view a : args)
    s += "$" + std::to_string(a.size()) + "\r\n" + std::string(a) + "\r\n";
  return s;
}

const std::string kHello3 =
    "%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.0\r\n$5\r\nproto\r\n:3\r\n"
    "$2\r\nid\r\n:7\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"
    "$7\r\nmodules\r\n*0\r\n";
const std::string kHello2 =
    "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.0\r\n$5\r\nproto\r\n:2\r\n"
    "$2\r\nid\r\n:7\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"
    "$7\r\nmodules\r\n*0\r\n";

TEST_CASE("resp session: HELLO answers Redis's map in RESP3 and a flat array in RESP2") {
  Harness h;
  CHECK(h.run(cmd({"HELLO", "3"})) == kHello3);
  CHECK(h.session.protocol() == Protocol::kResp3);
  CHECK(h.run(cmd({"hello"})) == kHello3);
  CHECK(h.run(cmd({"HELLO", "2", "SETNAME", "app"})) == kHello2);
  CHECK(h.run(cmd({"CLIENT", "GETNAME"})) == "$3\r\napp\r\n");
  CHECK(h.run(cmd({"HELLO", "4"})) == "-NOPROTO unsupported protocol version\r\n");
  CHECK(h.run(cmd({"HELLO", "three"})) ==
        "-ERR Protocol version is not an integer or out of range\r\n");
  CHECK(h.run(cmd({"HELLO", "3", "BOGUS"})) == "-ERR Syntax error in HELLO option 'BOGUS'\r\n");
  CHECK(h.run(cmd({"HELLO", "3", "AUTH", "default", "anything"})) == kHello3);
  CHECK(h.run(cmd({"HELLO", "3", "AUTH", "someone", "x"})) ==
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
}

TEST_CASE("resp session: PING, ECHO, SELECT and CLIENT in Redis's words") {
  Harness h;
  CHECK(h.run("PING\r\n") == "+PONG\r\n");
  CHECK(h.run(cmd({"ping", "hi"})) == "$2\r\nhi\r\n");
  CHECK(h.run(cmd({"PING", "a", "b"})) == "-ERR wrong number of arguments for 'ping' command\r\n");
  CHECK(h.run(cmd({"ECHO"})) == "-ERR wrong number of arguments for 'echo' command\r\n");
  CHECK(h.run(cmd({"ECHO", "x y"})) == "$3\r\nx y\r\n");
  CHECK(h.run(cmd({"SELECT", "15"})) == "+OK\r\n");
  CHECK(h.run(cmd({"SELECT", "16"})) == "-ERR DB index is out of range\r\n");
  CHECK(h.run(cmd({"SELECT", "-1"})) == "-ERR DB index is out of range\r\n");
  CHECK(h.run(cmd({"SELECT", "x"})) == "-ERR value is not an integer or out of range\r\n");
  CHECK(h.run(cmd({"CLIENT", "GETNAME"})) == "$-1\r\n");
  CHECK(h.run(cmd({"CLIENT", "SETNAME", "a b"})) ==
        "-ERR Client names cannot contain spaces, newlines or special characters.\r\n");
  CHECK(h.run(cmd({"client", "setname", "w1"})) == "+OK\r\n");
  CHECK(h.run(cmd({"CLIENT", "GETNAME"})) == "$2\r\nw1\r\n");
  CHECK(h.run(cmd({"CLIENT", "ID"})) == ":7\r\n");
  CHECK(h.run(cmd({"CLIENT", "SETINFO", "LIB-NAME", "redis-py"})) == "+OK\r\n");
  CHECK(h.run(cmd({"CLIENT", "SETINFO", "lib-color", "x"})) ==
        "-ERR Unrecognized option 'lib-color'\r\n");
  CHECK(h.run(cmd({"CLIENT", "MAINT_NOTIFICATIONS", "on"})) ==
        "-ERR unknown subcommand 'MAINT_NOTIFICATIONS'. Try CLIENT HELP.\r\n");
  CHECK(h.run(cmd({"CLIENT"})) == "-ERR wrong number of arguments for 'client' command\r\n");
  CHECK(h.run(cmd({"CLIENT", "SETNAME"})) ==
        "-ERR wrong number of arguments for 'client|setname' command\r\n");
  CHECK(h.run(cmd({"HELLO", "3"})) == kHello3);
  CHECK(h.run(cmd({"CLIENT", "GETNAME"})) == "$2\r\nw1\r\n");
  CHECK(h.run(cmd({"HELLO", "3", "SETNAME", ""})) == kHello3);
  CHECK(h.run(cmd({"CLIENT", "GETNAME"})) == "_\r\n");
}

TEST_CASE("resp session: QUIT answers +OK, then reads nothing more") {
  Harness h;
  CHECK(h.run("PING\r\nQUIT\r\nPING\r\n") == "+PONG\r\n+OK\r\n");
  CHECK(h.session.closing());
  CHECK(h.session.finished());
  CHECK(h.pending == "PING\r\n");
}

TEST_CASE("resp session: INFO is a bulk (RESP3 verbatim) with loading:0") {
  Harness h;
  const std::string info = h.run(cmd({"INFO"}));
  CHECK(info.rfind("$", 0) == 0);
  CHECK(info.find("# Server\r\nredis_version:7.2.0\r\n") != std::string::npos);
  CHECK(info.find("\r\n\r\n# Persistence\r\nloading:0\r\n") != std::string::npos);
  CHECK(h.run(cmd({"INFO", "replication"})) ==
        "$48\r\n# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\r\n");
  CHECK(h.run(cmd({"INFO", "nothing"})) == "$0\r\n\r\n");
  h.run(cmd({"HELLO", "3"}));
  CHECK(h.run(cmd({"INFO", "persistence"})) ==
        "=47\r\ntxt:# Persistence\r\nloading:0\r\nasync_loading:0\r\n\r\n");
}

TEST_CASE("resp session: COMMAND INFO describes cl.throttle as Redis 7 does, nil for others") {
  Harness h;
  const std::string entry2 =
      "*10\r\n$11\r\ncl.throttle\r\n:-5\r\n*3\r\n+write\r\n+denyoom\r\n+fast\r\n:1\r\n:1\r\n:1\r\n"
      "*2\r\n+@write\r\n+@fast\r\n*0\r\n*0\r\n*0\r\n";
  CHECK(h.run(cmd({"COMMAND", "INFO", "CL.THROTTLE", "nope"})) == "*2\r\n" + entry2 + "$-1\r\n");
  h.run(cmd({"HELLO", "3"}));
  const std::string entry3 =
      "*10\r\n$11\r\ncl.throttle\r\n:-5\r\n~3\r\n+write\r\n+denyoom\r\n+fast\r\n:1\r\n:1\r\n:1\r\n"
      "~2\r\n+@write\r\n+@fast\r\n*0\r\n*0\r\n*0\r\n";
  CHECK(h.run(cmd({"command", "info", "cl.throttle", "nope"})) == "*2\r\n" + entry3 + "_\r\n");
  CHECK(h.run(cmd({"COMMAND", "COUNT"})) == ":18\r\n");
  const std::string all = h.run(cmd({"COMMAND"}));
  CHECK(all.rfind("*18\r\n", 0) == 0);
  CHECK(all.find(entry3) != std::string::npos);
  CHECK(h.run(cmd({"COMMAND", "DOCS"})) == "-ERR unknown subcommand 'DOCS'. Try COMMAND HELP.\r\n");
}

TEST_CASE("resp session: CONFIG GET answers save and appendonly for redis-benchmark") {
  Harness h;
  CHECK(h.run(cmd({"CONFIG", "GET", "save"})) == "*2\r\n$4\r\nsave\r\n$0\r\n\r\n");
  CHECK(h.run(cmd({"CONFIG", "GET", "appendonly", "maxmemory"})) ==
        "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n");
  h.run(cmd({"HELLO", "3"}));
  CHECK(h.run(cmd({"CONFIG", "GET", "nothing"})) == "%0\r\n");
  CHECK(h.run(cmd({"CONFIG", "SET", "save", ""})) ==
        "-ERR unknown subcommand 'SET'. Try CONFIG HELP.\r\n");
}

TEST_CASE("resp session: an unknown command gets Redis's text, arguments cut at 128 bytes") {
  Harness h;
  CHECK(h.run(cmd({"FOO", "a", "b"})) ==
        "-ERR unknown command 'FOO', with args beginning with: 'a' 'b' \r\n");
  CHECK(h.run(cmd({"GET"})) == "-ERR unknown command 'GET', with args beginning with: \r\n");
  const std::string x(100, 'x');
  CHECK(h.run(cmd({"SET", x, x, x})) == "-ERR unknown command 'SET', with args beginning with: '" +
                                            x + "' '" + std::string(25, 'x') + "' \r\n");
  CHECK(h.run(cmd({"A\r\nB"})) == "-ERR unknown command 'A  B', with args beginning with: \r\n");
  CHECK(h.counters.unknown_commands.load() == 4);
}

TEST_CASE(
    "resp session: CL.THROTTLE checks arity and integers as redis-cell, then asks the "
    "backend") {
  Harness h;
  CHECK(h.run(cmd({"CL.THROTTLE", "user123", "15", "30", "60"})) ==
        "*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n");
  CHECK(h.run(cmd({"SELECT", "3"})) == "+OK\r\n");
  CHECK(h.run(cmd({"cl.throttle", "k", "+1", "007", "-60", "-2"})) ==
        "*5\r\n:0\r\n:2\r\n:1\r\n:-1\r\n:2\r\n");
  CHECK(h.backend.calls ==
        std::vector<std::string>{"throttle user123 15 30 60 1 db0", "throttle k 1 7 -60 -2 db3"});
  const std::string usage =
      "-Cell error: Store error: Usage: cl.throttle <key> <max_burst> <count per period> "
      "<period> [<quantity>]\r\n";
  CHECK(h.run(cmd({"CL.THROTTLE", "k", "1", "2"})) == usage);
  CHECK(h.run(cmd({"CL.THROTTLE", "k", "1", "2", "3", "4", "5"})) == usage);
  CHECK(h.run(cmd({"CL.THROTTLE", "k", "1", "x2", "3"})) ==
        "-Cell error: Store error: Couldn't parse as integer: x2\r\n");
  CHECK(h.run(cmd({"CL.THROTTLE", "k", "1", "2", "9223372036854775808"})) ==
        "-Cell error: Store error: Couldn't parse as integer: 9223372036854775808\r\n");
  CHECK(h.backend.calls.size() == 2);
  CHECK(h.run(cmd({"DEL", "a", "b", "c"})) == ":3\r\n");
}

TEST_CASE(
    "resp session: SLUICE.CHECK and SLUICE.ACQUIRE answer an array in RESP2, a map in "
    "RESP3") {
  Harness h;
  CHECK(h.run(cmd({"SLUICE.CHECK", "api", "user", "42", "path", "/a", "HITS", "3"})) ==
        "*7\r\n:0\r\n:10\r\n:0\r\n:3\r\n:7\r\n:1\r\n:0\r\n");
  CHECK(h.run(cmd({"SLUICE.CHECK", "api", "hits", "2"})) ==
        "*7\r\n:0\r\n:10\r\n:0\r\n:3\r\n:7\r\n:1\r\n:0\r\n");
  CHECK(h.backend.calls ==
        std::vector<std::string>{"check api user 42 path /a hits3", "check api hits 2 hits1"});
  CHECK(h.run(cmd({"SLUICE.CHECK", "api", "user"})) ==
        "-ERR wrong number of arguments for 'sluice.check' command\r\n");
  CHECK(h.run(cmd({"SLUICE.CHECK", "api", "user", "1", "HITS", "-1"})) ==
        "-ERR value is not an integer or out of range\r\n");
  h.run(cmd({"HELLO", "3"}));
  CHECK(h.run(cmd({"SLUICE.CHECK", "api", "user", "42"})) ==
        "%7\r\n$7\r\nallowed\r\n:0\r\n$5\r\nlimit\r\n:10\r\n$9\r\nremaining\r\n:0\r\n"
        "$13\r\nretry_after_s\r\n:3\r\n$7\r\nreset_s\r\n:7\r\n$6\r\nshadow\r\n:1\r\n"
        "$10\r\nwould_deny\r\n:0\r\n");
  CHECK(h.run(cmd({"SLUICE.ACQUIRE", "jobs", "tenant", "t1"})) ==
        "%8\r\n$7\r\nallowed\r\n:1\r\n$5\r\nlimit\r\n:5\r\n$9\r\nremaining\r\n:4\r\n"
        "$13\r\nretry_after_s\r\n:0\r\n$7\r\nreset_s\r\n:0\r\n$6\r\nshadow\r\n:0\r\n"
        "$10\r\nwould_deny\r\n:1\r\n$5\r\nlease\r\n$16\r\n00c0ffee12345678\r\n");
  CHECK(h.run(cmd({"SLUICE.RELEASE", "jobs", "00c0ffee12345678", "tenant", "t1"})) == ":1\r\n");
  CHECK(h.backend.calls.back() == "release jobs " + std::to_string(0x00c0ffee12345678ull));
  CHECK(h.run(cmd({"SLUICE.RELEASE", "jobs", "00C0FFEE12345678", "tenant", "t1"})) ==
        "-ERR invalid lease: 16 lowercase hex digits expected\r\n");
  CHECK(h.run(cmd({"SLUICE.RELEASE", "jobs", "00c0ffee12345678", "tenant"})) ==
        "-ERR wrong number of arguments for 'sluice.release' command\r\n");
}

TEST_CASE(
    "resp session: pipelined replies go out in request order when the backend answers "
    "out of order") {
  Harness h;
  h.backend.defer = true;
  CHECK(h.run(cmd({"CL.THROTTLE", "a", "1", "1", "1"}) + "PING\r\n" + cmd({"DEL", "a"}) +
              cmd({"ECHO", "e"})) == "");
  CHECK(h.session.awaited() == 2);
  h.backend.dels[0].ok(1);
  CHECK(h.take() == "");
  CHECK(h.wakes == 0);
  h.backend.throttles[0].ok({1, 2, 0, 5, 6});
  CHECK(h.wakes == 1);
  CHECK(h.take() == "*5\r\n:1\r\n:2\r\n:0\r\n:5\r\n:6\r\n+PONG\r\n:1\r\n$1\r\ne\r\n");
  CHECK(h.session.awaited() == 0);
}

TEST_CASE(
    "resp session: EXEC's array holds the queued replies in order, answered late and out "
    "of order") {
  Harness h;
  h.backend.defer = true;
  CHECK(h.run(cmd({"MULTI"}) + cmd({"CL.THROTTLE", "a", "1", "1", "1"}) + cmd({"PING"}) +
              cmd({"SLUICE.CHECK", "d", "k", "v"}) + cmd({"CL.THROTTLE", "b", "1", "1", "1"})) ==
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n");
  CHECK(h.backend.calls.empty());
  CHECK(h.run(cmd({"EXEC"}) + cmd({"ECHO", "after"})) == "*4\r\n");
  h.backend.throttles[1].ok({1, 2, 0, 1, 1});
  h.backend.checks[0].fail("ERR unknown domain 'd'");
  CHECK(h.take() == "");
  h.backend.throttles[0].ok({0, 2, 1, -1, 1});
  CHECK(h.take() ==
        "*5\r\n:0\r\n:2\r\n:1\r\n:-1\r\n:1\r\n+PONG\r\n-ERR unknown domain 'd'\r\n"
        "*5\r\n:1\r\n:2\r\n:0\r\n:1\r\n:1\r\n$5\r\nafter\r\n");
}

TEST_CASE(
    "resp session: MULTI's errors as Redis: nesting, EXEC and DISCARD without MULTI, "
    "EXECABORT after a wrong arity") {
  Harness h;
  CHECK(h.run(cmd({"EXEC"})) == "-ERR EXEC without MULTI\r\n");
  CHECK(h.run(cmd({"DISCARD"})) == "-ERR DISCARD without MULTI\r\n");
  CHECK(h.run(cmd({"MULTI"}) + cmd({"MULTI"}) + cmd({"PING"}) + cmd({"EXEC"})) ==
        "+OK\r\n-ERR MULTI calls can not be nested\r\n+QUEUED\r\n*1\r\n+PONG\r\n");
  CHECK(h.run(cmd({"MULTI"}) + cmd({"CL.THROTTLE", "a", "1"}) + cmd({"PING"}) + cmd({"EXEC"})) ==
        "+OK\r\n-Cell error: Store error: Usage: cl.throttle <key> <max_burst> <count per period> "
        "<period> [<quantity>]\r\n+QUEUED\r\n"
        "-EXECABORT Transaction discarded because of previous errors.\r\n");
  CHECK(h.run(cmd({"MULTI"}) + cmd({"NOPE"}) + cmd({"EXEC"})) ==
        "+OK\r\n-ERR unknown command 'NOPE', with args beginning with: \r\n"
        "-EXECABORT Transaction discarded because of previous errors.\r\n");
  CHECK(h.run(cmd({"MULTI"}) + cmd({"EXEC", "x"})) ==
        "+OK\r\n-EXECABORT Transaction discarded because of: wrong number of arguments for "
        "'exec' command\r\n");
  CHECK(h.run(cmd({"MULTI"}) + cmd({"PING"}) + cmd({"DISCARD"}) + cmd({"EXEC"})) ==
        "+OK\r\n+QUEUED\r\n+OK\r\n-ERR EXEC without MULTI\r\n");
  // A value that does not parse is the command's own error, inside the array.
  CHECK(h.run(cmd({"MULTI"}) + cmd({"CL.THROTTLE", "a", "x", "1", "1"}) + cmd({"EXEC"})) ==
        "+OK\r\n+QUEUED\r\n*1\r\n-Cell error: Store error: Couldn't parse as integer: x\r\n");
  CHECK(h.backend.calls.empty());
}

TEST_CASE("resp session: with a password only HELLO AUTH, AUTH, PING and QUIT pass before AUTH") {
  Harness h("s3cret");
  CHECK(h.run(cmd({"PING"})) == "+PONG\r\n");  // health probes need no password
  CHECK(h.run(cmd({"ECHO", "x"})) == "-NOAUTH Authentication required.\r\n");
  CHECK(h.run(cmd({"CL.THROTTLE", "a", "1", "1", "1"})) == "-NOAUTH Authentication required.\r\n");
  CHECK(h.run(cmd({"HELLO", "3"})) ==
        "-NOAUTH HELLO must be called with the client already authenticated, otherwise the "
        "HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and "
        "select the RESP protocol version at the same time\r\n");
  CHECK(h.run(cmd({"MULTI"}) + cmd({"EXEC"})) ==
        "-NOAUTH Authentication required.\r\n"
        "-EXECABORT Transaction discarded because of: NOAUTH Authentication required.\r\n");
  CHECK(h.run(cmd({"AUTH", "wrong"})) ==
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
  CHECK(h.run(cmd({"AUTH", "a", "b", "c"})) == "-ERR syntax error\r\n");
  CHECK(h.counters.auth_failures.load() == 1);
  CHECK(h.backend.calls.empty());
  CHECK(h.run(cmd({"AUTH", "s3cret"})) == "+OK\r\n");
  CHECK(h.run(cmd({"PING"})) == "+PONG\r\n");

  Harness hello("s3cret");
  CHECK(hello.run(cmd({"HELLO", "3", "AUTH", "default", "s3cret2"})) ==
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
  CHECK(hello.run(cmd({"HELLO", "3", "AUTH", "default", "s3cret"})) == kHello3);
  CHECK(hello.run(cmd({"AUTH", "default", "s3cret"})) == "+OK\r\n");

  Harness big("s3cret");
  const std::string eleven = cmd({"A", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"});
  CHECK(big.run(eleven) == "-ERR Protocol error: unauthenticated multibulk length\r\n");
  CHECK(big.session.finished());
}

TEST_CASE("resp session: AUTH without a password configured is Redis's error") {
  Harness h;
  CHECK(h.run(cmd({"AUTH", "x"})) ==
        "-ERR AUTH <password> called without any password configured for the default user. "
        "Are you sure your configuration is correct?\r\n");
  CHECK(h.run(cmd({"AUTH", "default", "x"})) == "+OK\r\n");
}

TEST_CASE(
    "resp session: a protocol error is answered after what came before, counted, and "
    "ends the session") {
  Harness h;
  h.backend.defer = true;
  CHECK(h.run(cmd({"DEL", "a"}) + "PING\r\n*1\r\n$-7\r\nPING\r\n") == "");
  CHECK(h.session.closing());
  CHECK_FALSE(h.session.finished());
  h.backend.dels[0].ok(0);
  CHECK(h.take() == ":0\r\n+PONG\r\n-ERR Protocol error: invalid bulk length\r\n");
  CHECK(h.session.finished());
  CHECK(h.counters.protocol_errors[static_cast<size_t>(ProtocolError::kBulkLength)].load() == 1);
  CHECK(reason_name(ProtocolError::kBulkLength) == "invalid_bulk_length");
}

TEST_CASE("resp session: an HTTP request is closed without a reply") {
  Harness h;
  CHECK(h.run("POST / HTTP/1.1\r\nHost: x\r\n\r\n") == "");
  CHECK(h.session.finished());
  CHECK(h.counters.protocol_errors[static_cast<size_t>(ProtocolError::kCrossProtocol)].load() == 1);
}

TEST_CASE(
    "resp session: a dropped Answer is an error in its place, and one that outlives the "
    "session does nothing") {
  Harness h;
  h.backend.defer = true;
  CHECK(h.run(cmd({"DEL", "a"}) + cmd({"PING"})) == "");
  h.backend.dels.clear();
  CHECK(h.take() == "-ERR no answer from the rate limiter\r\n+PONG\r\n");

  std::deque<Answer<int64_t>> kept;
  {
    Harness gone;
    gone.backend.defer = true;
    gone.run(cmd({"DEL", "a"}));
    kept = std::move(gone.backend.dels);
  }
  kept[0].ok(1);  // the session is gone: ignored
  CHECK(kept.size() == 1);
}

TEST_CASE("resp session: a pipeline in any split answers the same bytes") {
  const std::string stream = cmd({"HELLO", "3"}) + "PING\r\n" +
                             cmd({"CLIENT", "SETINFO", "LIB-NAME", "x"}) +
                             cmd({"CL.THROTTLE", "k", "1", "2", "3"}) + cmd({"MULTI"}) +
                             cmd({"DEL", "k"}) + cmd({"EXEC"}) + cmd({"NOPE"});
  Harness whole;
  const std::string expected = whole.run(stream);
  CHECK(expected.find("-ERR unknown command 'NOPE'") != std::string::npos);
  for (size_t split = 0; split <= stream.size(); ++split) {
    Harness h;
    std::string out = h.run(std::string_view(stream).substr(0, split));
    out += h.run(std::string_view(stream).substr(split));
    REQUIRE(out == expected);
  }
}

}  // namespace
