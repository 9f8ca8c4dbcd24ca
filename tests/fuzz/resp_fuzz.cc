// libFuzzer target for the RESP door's protocol half (lib/front/resp): the bytes a Redis client
// sends, through the parser and the session, with a backend that answers now or later and out
// of order.
//
// Input: [mode][bytes...]. Mode bits: 0-2 the read size (1, 2, 3, 7, 16, 61, 512, all at once);
// bit 3 a password is set; bit 4 the backend defers its answers and gives them in reverse.
//
// Properties beyond "no crash, no sanitizer report":
//  - the parser gives the same commands, and the same error, whatever the read size, and no
//    argument or command over its limits;
//  - the session answers the same bytes whatever the read size (backend answering at once);
//  - what the caller keeps unconsumed stays under kMaxCommandBytes plus one read;
//  - once every deferred answer is given, nothing is awaited, and a closing session is
//    finished.
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "front/resp/resp_session.h"
#include "fuzz_util.h"

namespace {

using namespace sluice::front::resp;

constexpr size_t kReadSizes[] = {1, 2, 3, 7, 16, 61, 512, SIZE_MAX};

struct Parsed {
  std::vector<std::vector<std::string>> commands;
  ProtocolError error = ProtocolError::kNone;
  bool operator==(const Parsed&) const = default;
};

Parsed parse(std::string_view input, size_t read_size) {
  Parsed out;
  RespParser parser;
  std::string buffer;
  for (size_t at = 0; at < input.size(); at += read_size) {
    buffer.append(input.substr(at, read_size));
    while (true) {
      size_t consumed = 0;
      const auto status = parser.next(buffer, consumed);
      if (status == RespParser::Status::kError) {
        out.error = parser.error();
        return out;
      }
      if (status == RespParser::Status::kCommand) {
        FUZZ_REQUIRE(!parser.args().empty() && parser.args().size() <= kMaxArgs);
        auto& c = out.commands.emplace_back();
        for (const std::string_view a : parser.args()) {
          FUZZ_REQUIRE(a.size() <= kMaxInlineBytes && a.size() <= kMaxArgBytes);
          c.emplace_back(a);
        }
      }
      buffer.erase(0, consumed);
      if (status == RespParser::Status::kNeedMore) break;
    }
    FUZZ_REQUIRE(buffer.size() <= kMaxCommandBytes + 1);
    if (read_size == SIZE_MAX) break;
  }
  return out;
}

struct FakeBackend : Backend {
  bool defer = false;
  std::deque<Answer<ThrottleAnswer>> throttles;
  std::deque<Answer<int64_t>> dels;
  std::deque<Answer<CheckAnswer>> checks;
  std::deque<Answer<LeaseAnswer>> acquires;
  std::deque<Answer<bool>> releases;

  void throttle(const ThrottleRequest& r, Answer<ThrottleAnswer> a) override {
    FUZZ_REQUIRE(r.key.size() <= kMaxArgBytes && r.db >= 0 && r.db < kDatabases);
    if (defer) return throttles.push_back(std::move(a));
    a.ok({0, 1, 1, -1, 0});
  }
  void del(const DelRequest& r, Answer<int64_t> a) override {
    FUZZ_REQUIRE(!r.keys.empty());
    if (defer) return dels.push_back(std::move(a));
    a.ok(static_cast<int64_t>(r.keys.size()));
  }
  void check(const CheckRequest& r, Answer<CheckAnswer> a) override {
    FUZZ_REQUIRE(r.entries.size() % 2 == 0 && !r.entries.empty());
    if (defer) return checks.push_back(std::move(a));
    a.fail("ERR unknown domain");
  }
  void acquire(const CheckRequest& r, Answer<LeaseAnswer> a) override {
    FUZZ_REQUIRE(r.entries.size() % 2 == 0 && !r.entries.empty());
    if (defer) return acquires.push_back(std::move(a));
    a.ok({{true, 1, 0, 0, 0}, 1});
  }
  void release(const ReleaseRequest& r, Answer<bool> a) override {
    FUZZ_REQUIRE(r.lease != 0 && r.entries.size() % 2 == 0);
    if (defer) return releases.push_back(std::move(a));
    a.ok(false);
  }
  // The deferred answers, latest first.
  void answer_all() {
    for (auto it = throttles.rbegin(); it != throttles.rend(); ++it)
      it->ok({1, 1, 0, 1, 1});
    for (auto it = checks.rbegin(); it != checks.rend(); ++it)
      it->ok({});
    for (auto it = acquires.rbegin(); it != acquires.rend(); ++it)
      it->fail("ERR no room");
    releases.clear();  // dropped: answered as errors
    for (auto it = dels.rbegin(); it != dels.rend(); ++it)
      it->ok(0);
  }
};

std::string serve(std::string_view input, size_t read_size, bool password, bool defer) {
  const Config config{password ? "pw" : "", "0.0.0"};
  FakeBackend backend;
  backend.defer = defer;
  RespCounters counters;
  std::string out, pending;
  {
    RespSession session(config, backend, counters, 1, [] {});
    for (size_t at = 0; at < input.size() && !session.closing(); at += read_size) {
      pending.append(input.substr(at, read_size));
      pending.erase(0, session.feed(pending));
      FUZZ_REQUIRE(session.closing() || pending.size() <= kMaxCommandBytes + 1);
      out += session.output();
      session.output().clear();
      if (read_size == SIZE_MAX) break;
    }
    backend.answer_all();
    out += session.output();
    FUZZ_REQUIRE(session.awaited() == 0);
    FUZZ_REQUIRE(!session.closing() || session.finished());
  }
  return out;
}

void fuzz_resp(std::span<const uint8_t> in) {
  if (in.empty()) return;
  const uint8_t mode = in[0];
  const std::string_view input(reinterpret_cast<const char*>(in.data() + 1), in.size() - 1);
  const size_t read_size = kReadSizes[mode & 7];
  FUZZ_REQUIRE(parse(input, read_size) == parse(input, SIZE_MAX));
  const bool password = (mode & 8) != 0;
  const bool defer = (mode & 16) != 0;
  const std::string out = serve(input, read_size, password, defer);
  if (!defer) FUZZ_REQUIRE(out == serve(input, SIZE_MAX, password, false));
}

void write_seeds(const std::string& dir) {
  using sluice::fuzz::write_seed;
  const auto seed = [&](const std::string& name, uint8_t mode, std::string_view text) {
    std::string bytes(1, static_cast<char>(mode));
    bytes += text;
    write_seed(dir, name, bytes);
  };
  seed("hello3-throttle", 0,
       "*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n*5\r\n$11\r\nCL.THROTTLE\r\n$7\r\nuser123\r\n$2\r\n15\r\n"
       "$2\r\n30\r\n$2\r\n60\r\n");
  seed("multi-exec-deferred", 16 | 2,
       "*1\r\n$5\r\nMULTI\r\n*2\r\n$3\r\nDEL\r\n$1\r\nk\r\n*4\r\n$12\r\nSLUICE.CHECK\r\n$"
       "3\r\napi\r\n"
       "$4\r\nuser\r\n$2\r\n42\r\n*1\r\n$4\r\nEXEC\r\n");
  seed("inline", 1, "PING\r\necho \"a\\x41\" 'b'\r\nCOMMAND INFO cl.throttle\r\nQUIT\r\n");
  seed("auth", 8 | 3, "PING\r\nAUTH wrong\r\nHELLO 3 AUTH default pw\r\nCLIENT SETNAME x\r\n");
  seed(
      "acquire-release", 5,
      "SLUICE.ACQUIRE jobs tenant t1 HITS 2\r\nSLUICE.RELEASE jobs 00c0ffee12345678 tenant t1\r\n");
  seed("nested", 0, "*2\r\n*1\r\n$1\r\na\r\n");
}

}  // namespace

SLUICE_FUZZ_TARGET(fuzz_resp, write_seeds)
