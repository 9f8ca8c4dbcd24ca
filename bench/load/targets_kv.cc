// The targets sluiced is compared against: Redis (a RESP client: INCR, the Lua sliding log,
// Figma's hash of minute counters, GCRA in Lua, and CL.THROTTLE, which also drives sluiced's
// Redis-protocol door) and memcached (the memcached sliding window's two counters), with their
// factories, probes and preloads.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "load/stream_conn.h"
#include "load/targets.h"

namespace sluice::bench {

namespace {

using detail::parse_int;

// ---- RESP -------------------------------------------------------------------------------------

struct RespReply {
  char type = 0;                        // '+', '-', ':', '$', '*'
  int64_t integer = 0;                  // ':' (and '*': the element count)
  std::string_view text;                // '+', '-', ':', '$' (empty for a null bulk)
  std::vector<std::string_view> elems;  // '*': the elements' text (bulk, simple or integer)
};

// One reply from the front of `in`: bytes consumed, 0 when incomplete, -1 when malformed or
// nested deeper than one array (no command used here answers that way).
long parse_resp(std::string_view in, RespReply& r) {
  size_t pos = 0;
  // The element at pos: its type, its text, and the number on its line (':', '$', '*'). 1 when
  // whole, 0 when incomplete, -1 when malformed.
  auto element = [&](char& type, std::string_view& text, int64_t& n) -> int {
    const size_t cr = in.find('\r', pos);
    if (cr == std::string_view::npos || cr + 1 >= in.size()) return 0;
    if (cr == pos || in[cr + 1] != '\n') return -1;
    type = in[pos];
    text = in.substr(pos + 1, cr - pos - 1);
    pos = cr + 2;
    if (type == '+' || type == '-') return 1;
    if (!parse_int(text, n)) return -1;
    if (type == ':' || type == '*') return 1;
    if (type != '$') return -1;
    text = {};
    if (n < 0) return 1;  // null bulk
    if (in.size() - pos < static_cast<size_t>(n) + 2) return 0;
    text = in.substr(pos, static_cast<size_t>(n));
    pos += static_cast<size_t>(n) + 2;
    return 1;
  };
  r.elems.clear();
  if (const int s = element(r.type, r.text, r.integer); s <= 0) return s;
  for (int64_t i = 0; r.type == '*' && i < r.integer; ++i) {
    char type = 0;
    std::string_view text;
    int64_t n = 0;
    if (const int s = element(type, text, n); s <= 0 || type == '*') return s <= 0 ? s : -1;
    r.elems.push_back(text);
  }
  return static_cast<long>(pos);
}

void append_bulk(std::string& out, std::string_view s) {
  out.append("$").append(std::to_string(s.size())).append("\r\n").append(s).append("\r\n");
}

void append_array_header(std::string& out, size_t n) {
  out.append("*").append(std::to_string(n)).append("\r\n");
}

void append_command(std::string& out, std::initializer_list<std::string_view> args) {
  append_array_header(out, args.size());
  for (std::string_view a : args)
    append_bulk(out, a);
}

}  // namespace

const char* const kLuaSlidingLogScript = R"lua(local key = KEYS[1] -- unique key per user
local limit = tonumber(ARGV[1]) -- allowed number of requests within the window
local windowSize = tonumber(ARGV[2]) -- window size in milliseconds, e.g 60000 (for 1 minute)
local currentTime = tonumber(ARGV[3]) -- current epoch milli

-- Remove expired elements from the sorted set
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. currentTime - windowSize)

-- Get the current count from the sorted set
local currentCount = redis.call('ZCARD', key)

if currentCount >= limit then
	return currentCount
end

local member = currentTime .. '-' .. redis.call('INCR', key .. ':counter')

redis.call('ZADD', key, currentTime, member)
redis.call('PEXPIRE', key .. ':counter', windowSize)

return currentCount+1
)lua";

// Times in microseconds (Lua numbers are doubles: exact to 2^53, past any epoch in us). The TAT
// is written with %.0f because Lua's own number-to-string keeps 14 digits, which rounds an epoch
// in microseconds to the nearest 100.
const char* const kGcraScript = R"lua(local burst = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local quantity = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = period * 1000000 / count
local limit = burst + 1
local tolerance = interval * limit
local increment = interval * quantity
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + increment
local allow_at = new_tat - tolerance
local limited, retry_after, ttl = 0, -1, 0
if now < allow_at then
  limited = 1
  if increment <= tolerance then retry_after = allow_at - now end
  ttl = tat - now
else
  ttl = new_tat - now
  redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.max(1, math.ceil(ttl / 1000)))
end
local remaining = 0
local next = tolerance - ttl
if next > -interval then remaining = math.floor(next / interval) end
local function seconds(us)
  if us < 0 then return -1 end
  return math.ceil(math.floor(us / 1000) / 1000)
end
return {limited, limit, remaining, seconds(retry_after), seconds(ttl)}
)lua";

namespace {

// Figma's hash of minute counters, as written: an hourly limit counted in a hash of per-minute
// counters.
//   per check:  HINCRBY <key> <unix minute> 1    count this request in the current minute
//               EXPIRE  <key> 3600               "it also sets the hash to expire an hour later"
//               HGETALL <key>                    the client sums the fields in the window
// The three commands need nothing from each other's replies, so they are written together (one
// round trip), without MULTI and without Lua (the design chose not to add Lua). The window is the
// design's harsher variant: the last hour and one minute (61 fields) unless the current second is
// a whole minute, then the last 60. Denied when the sum (this request included) exceeds the
// limit. Cleanup: when a reply holds more than kStaleFieldsBeforeCleanup fields older than the
// window, an HDEL of those fields rides along with the connection's next request ("we regularly
// remove these counters when there are a considerable number of them"). The field is the unix
// minute (seconds / 60).
constexpr int64_t kHashWindowMinutes = 60;
constexpr size_t kStaleFieldsBeforeCleanup = 8;

class RedisConn final : public detail::StreamConn {
 public:
  RedisConn(int fd, const RedisConnOptions& o, ThreadContext& ctx)
      : StreamConn(fd, ctx),
        o_(o),
        units_(o.window),
        per_check_(o.scheme == RedisScheme::kHashMinutes ? 3 : 1),
        limit_text_(std::to_string(o.limit)),
        burst_text_(std::to_string(o.gcra_burst)),
        count_text_(std::to_string(o.gcra_count)),
        period_text_(std::to_string(o.gcra_period_s)) {}
  bool has_room() const override { return !units_.full(); }
  void send(int64_t start) override {
    Unit& u = units_.push();
    u.start = start;
    u.replies_total = o_.batch * per_check_;
    u.replies_seen = 0;
    u.keys.resize(o_.batch);
    const int64_t now_ms = epoch_ms();
    const std::string now_text = std::to_string(now_ms);  // short: no allocation
    for (uint32_t i = 0; i < o_.batch; ++i) {
      u.keys[i] = keys_.next();
      const std::string& name = o_.keys->names[u.keys[i]];
      switch (o_.scheme) {
        case RedisScheme::kIncr:
          append_command(out_, {"INCR", name});
          break;
        case RedisScheme::kLuaLog:
          key_.assign(name).append("-rate-limit-v1");  // the Lua sliding log's key
          append_command(out_, {"EVALSHA", o_.lua_sha, "1", key_, limit_text_, "60000", now_text});
          break;
        case RedisScheme::kHashMinutes:
          key_.assign("rl:").append(name);
          append_command(out_, {"HINCRBY", key_, std::to_string(now_ms / 60'000), "1"});
          append_command(out_, {"EXPIRE", key_, "3600"});
          append_command(out_, {"HGETALL", key_});
          break;
        case RedisScheme::kLuaGcra:
          append_command(out_, {"EVALSHA", o_.lua_sha, "1", name, burst_text_, count_text_,
                                period_text_, "1"});
          break;
        case RedisScheme::kClThrottle:
          append_command(out_, {"CL.THROTTLE", name, burst_text_, count_text_, period_text_, "1"});
          break;
      }
    }
    if (!cleanup_.empty()) {
      out_ += cleanup_;
      cleanup_.clear();
      ++u.replies_total;  // the HDEL's reply comes after this unit's own
    }
  }

 private:
  struct Unit {
    int64_t start = 0;
    uint32_t replies_total = 0;
    uint32_t replies_seen = 0;
    std::vector<uint32_t> keys;  // the key of each check, in order
  };

  size_t parse(std::string_view in, int64_t now) override {
    const long used = parse_resp(in, reply_);
    if (used < 0) {
      stats_->note_error("malformed RESP reply");
      fail();
    }
    if (used <= 0) return 0;
    if (units_.empty()) {
      stats_->note_error("RESP reply with nothing in flight");
      return static_cast<size_t>(used);
    }
    Unit& u = units_.front();
    const uint32_t idx = u.replies_seen++;
    if (reply_.type == '-') {
      stats_->note_error("redis: " + std::string(reply_.text));
    } else if (idx < o_.batch * per_check_) {
      judge(idx % per_check_, u.keys[idx / per_check_]);
    }
    if (u.replies_seen == u.replies_total) {
      rec_.complete(u.start, now, o_.batch);
      units_.pop();
    }
    return static_cast<size_t>(used);
  }

  void judge(uint32_t cmd, uint32_t key) {
    switch (o_.scheme) {
      case RedisScheme::kIncr:
        if (reply_.type != ':') return stats_->note_error("INCR: unexpected reply");
        if (static_cast<uint64_t>(reply_.integer) > o_.limit) ++stats_->denied;
        return;
      case RedisScheme::kLuaLog:
        // The Lua sliding log's caller: denied when requestsInWindow >= limit.
        if (reply_.type != ':') return stats_->note_error("EVALSHA: unexpected reply");
        if (static_cast<uint64_t>(reply_.integer) >= o_.limit) ++stats_->denied;
        return;
      case RedisScheme::kHashMinutes:
        if (cmd < 2) {
          if (reply_.type != ':') stats_->note_error("HINCRBY/EXPIRE: unexpected reply");
          return;
        }
        if (reply_.type != '*' || reply_.elems.size() % 2 != 0) {
          return stats_->note_error("HGETALL: unexpected reply");
        }
        return judge_minutes(key);
      case RedisScheme::kLuaGcra:
      case RedisScheme::kClThrottle:
        // [limited, limit, remaining, retry_after, reset_after]
        if (reply_.type != '*' || reply_.elems.size() != 5) {
          return stats_->note_error("GCRA: unexpected reply");
        }
        if (reply_.elems[0] != "0") ++stats_->denied;
        return;
    }
  }

  void judge_minutes(uint32_t key) {
    const int64_t now_s = epoch_ms() / 1000;
    const int64_t oldest = now_s / 60 - kHashWindowMinutes + (now_s % 60 == 0 ? 1 : 0);
    uint64_t sum = 0;
    size_t stale = 0;
    for (size_t i = 0; i + 1 < reply_.elems.size(); i += 2) {
      int64_t field = 0;
      uint64_t value = 0;
      if (!parse_int(reply_.elems[i], field) || !parse_int(reply_.elems[i + 1], value)) {
        return stats_->note_error("HGETALL: non-numeric field");
      }
      sum += field >= oldest ? value : 0;
      stale += field >= oldest ? 0 : 1;
    }
    if (sum > o_.limit) ++stats_->denied;
    if (stale <= kStaleFieldsBeforeCleanup || !cleanup_.empty()) return;
    key_.assign("rl:").append(o_.keys->names[key]);
    append_array_header(cleanup_, 2 + stale);
    append_bulk(cleanup_, "HDEL");
    append_bulk(cleanup_, key_);
    for (size_t i = 0; i + 1 < reply_.elems.size(); i += 2) {
      int64_t field = 0;
      if (parse_int(reply_.elems[i], field) && field < oldest)
        append_bulk(cleanup_, reply_.elems[i]);
    }
  }

  RedisConnOptions o_;
  detail::InOrder<Unit> units_;
  uint32_t per_check_;
  std::string limit_text_, burst_text_, count_text_, period_text_;
  std::string key_;
  RespReply reply_;
  std::string cleanup_;  // an HDEL to send with the next request
};

// ---- memcached --------------------------------------------------------------------------------

// The memcached sliding window (fixed rate), as its library does it per check:
//   1. get <key>:<bucket> <key>:<bucket-1>            one multi-get of both buckets
//   2. estimate = previous * (share of the previous bucket still inside the window) + current;
//      denied when estimate + 1 > limit (nothing is written);
//   3. otherwise incr <key>:<bucket> 1; on NOT_FOUND add it with value 1 and a TTL of two
//      windows; if the add loses a race (NOT_STORED), incr again.
// Buckets are one minute (the window). Steps 1 and 3 depend on each other (the decision comes
// between them), so a check costs two round trips, three on a bucket's first hit.
class MemcachedConn final : public detail::StreamConn {
 public:
  MemcachedConn(int fd, const MemcachedConnOptions& o, ThreadContext& ctx)
      : StreamConn(fd, ctx), o_(o) {}
  bool has_room() const override { return state_ == State::kIdle; }
  void send(int64_t start) override {
    start_ = start;
    now_ms_ = epoch_ms();
    const int64_t bucket = now_ms_ / 60'000;
    const std::string& name = o_.keys->names[keys_.next()];
    cur_key_.assign(name).append(":").append(std::to_string(bucket));
    prev_key_.assign(name).append(":").append(std::to_string(bucket - 1));
    cur_ = prev_ = 0;
    out_.append("get ").append(cur_key_).append(" ").append(prev_key_).append("\r\n");
    state_ = State::kGet;
  }

 private:
  enum class State { kIdle, kGet, kIncr, kAdd, kIncrAgain };

  size_t parse(std::string_view in, int64_t now) override {
    const size_t eol = in.find("\r\n");
    if (state_ == State::kIdle || eol == std::string_view::npos) return 0;
    const std::string_view line = in.substr(0, eol);
    if (state_ != State::kGet || !line.starts_with("VALUE ")) {
      handle_line(line, now);
      return eol + 2;
    }
    // VALUE <key> <flags> <bytes>\r\n<data>\r\n
    size_t bytes = 0;
    if (!parse_int(line.substr(line.rfind(' ') + 1), bytes)) {
      stats_->note_error("memcached: bad VALUE line");
      fail();
      return 0;
    }
    if (in.size() < eol + bytes + 4) return 0;  // data not complete yet
    uint64_t v = 0;
    if (!parse_int(in.substr(eol + 2, bytes), v)) stats_->note_error("memcached: bad value");
    (line.substr(6, line.find(' ', 6) - 6) == cur_key_ ? cur_ : prev_) = v;
    return eol + bytes + 4;
  }

  // A reply line: the next request of this check, or the check's end.
  void handle_line(std::string_view line, int64_t now) {
    uint64_t v = 0;
    if (line == "ERROR" || line.starts_with("CLIENT_ERROR") || line.starts_with("SERVER_ERROR")) {
      stats_->note_error("memcached: " + std::string(line));
    } else if (state_ == State::kGet) {
      if (line != "END") return stats_->note_error("memcached: unexpected get reply");
      const double into = static_cast<double>(now_ms_ % 60'000) / 60'000.0;
      const double estimate = static_cast<double>(prev_) * (1.0 - into) + static_cast<double>(cur_);
      if (estimate + 1 <= static_cast<double>(o_.limit)) return incr(State::kIncr);
      ++stats_->denied;
    } else if (state_ == State::kAdd) {
      if (line == "NOT_STORED") return incr(State::kIncrAgain);
      if (line != "STORED")
        stats_->note_error("memcached: unexpected add reply " + std::string(line));
    } else if (!parse_int(line, v)) {  // kIncr, kIncrAgain
      if (line == "NOT_FOUND" && state_ == State::kIncr) {
        out_.append("add ").append(cur_key_).append(" 0 ");
        out_.append(std::to_string(kMemcachedBucketTtlS)).append(" 1\r\n1\r\n");
        state_ = State::kAdd;
        return;
      }
      stats_->note_error("memcached: unexpected incr reply " + std::string(line));
    }
    rec_.complete(start_, now, 1);
    state_ = State::kIdle;
  }
  void incr(State next) {
    out_.append("incr ").append(cur_key_).append(" 1\r\n");
    state_ = next;
  }

  MemcachedConnOptions o_;
  State state_ = State::kIdle;
  int64_t start_ = 0;
  int64_t now_ms_ = 0;
  std::string cur_key_, prev_key_;
  uint64_t cur_ = 0, prev_ = 0;
};

// ---- blocking helpers for setup -----------------------------------------------------------------

// `request` to 127.0.0.1:port on a fresh blocking connection, then the answer read into `reply`
// until done(reply), every send and receive bounded by timeout_ms: "" or the first error.
std::string exchange(uint16_t port, std::string_view request, int timeout_ms,
                     const std::function<bool(std::string_view)>& done, std::string& reply) {
  std::string e;
  const int fd = tcp_connect(port, timeout_ms, e);
  if (fd < 0) return e;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const timeval tv{timeout_ms / 1000, timeout_ms % 1000 * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  for (size_t off = 0; off < request.size() && e.empty();) {
    const ssize_t n = ::send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno != EINTR) e = std::string("send: ") + std::strerror(errno);
    off += static_cast<size_t>(std::max<ssize_t>(n, 0));
  }
  char buf[65'536];
  while (e.empty() && !done(reply)) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) e = "connection closed";
    if (n < 0 && errno != EINTR) e = std::string("recv: ") + std::strerror(errno);
    reply.append(buf, static_cast<size_t>(std::max<ssize_t>(n, 0)));
  }
  ::close(fd);
  return e;
}

// exchange() of `request` for one reply line: "" when it starts with `expect`.
std::string line_exchange(uint16_t port, std::string_view request, std::string_view expect,
                          int timeout_ms) {
  std::string reply;
  std::string e = exchange(
      port, request, timeout_ms, [](std::string_view b) { return b.find("\r\n") != b.npos; },
      reply);
  if (e.empty() && !reply.starts_with(expect)) e = "unexpected reply: " + reply.substr(0, 200);
  return e;
}

}  // namespace

std::unique_ptr<Conn> make_redis(const RedisConnOptions& o, ThreadContext& ctx) {
  return detail::connect_stream<RedisConn>(o, ctx);
}

std::unique_ptr<Conn> make_memcached(const MemcachedConnOptions& o, ThreadContext& ctx) {
  return detail::connect_stream<MemcachedConn>(o, ctx);
}

std::string redis_probe(uint16_t port, int timeout_ms) {
  return line_exchange(port, "PING\r\n", "+PONG", timeout_ms);
}

std::string redis_command(uint16_t port, const std::vector<std::string>& args, std::string& reply) {
  std::string cmd, in;
  append_array_header(cmd, args.size());
  for (const std::string& a : args)
    append_bulk(cmd, a);
  RespReply r;
  if (std::string e = exchange(
          port, cmd, 10'000, [&](std::string_view b) { return parse_resp(b, r) != 0; }, in);
      !e.empty()) {
    return e;
  }
  if (parse_resp(in, r) <= 0) return "malformed reply";
  reply = r.type == '*' ? "*" + std::to_string(r.elems.size()) : r.type + std::string(r.text);
  return r.type == '-' ? "redis: " + std::string(r.text) : "";
}

// A script writes the hashes, a chunk of keys a call: on each, HSET of the 60 minutes before now's
// (1 each) and EXPIRE 3600.
std::string redis_preload_minutes(uint16_t port, const Keyspace& keys, int64_t now_ms) {
  constexpr size_t kChunk = 1000;
  // Bounded: keys / kChunk calls.
  for (size_t first = 0; first < keys.names.size(); first += kChunk) {
    const size_t last = std::min(keys.names.size(), first + kChunk);
    std::vector<std::string> args = {"EVAL", R"lua(for _, key in ipairs(KEYS) do
  for m = ARGV[1] - 60, ARGV[1] - 1 do redis.call('HSET', 'rl:' .. key, m, 1) end
  redis.call('EXPIRE', 'rl:' .. key, 3600)
end)lua",
                                     std::to_string(last - first)};
    args.insert(args.end(), keys.names.data() + first, keys.names.data() + last);
    args.push_back(std::to_string(now_ms / 60'000));
    std::string reply;
    if (std::string e = redis_command(port, args, reply); !e.empty()) return "preloading: " + e;
  }
  return "";
}

std::string memcached_probe(uint16_t port, int timeout_ms) {
  return line_exchange(port, "version\r\n", "VERSION ", timeout_ms);
}

std::string memcached_flush_all(uint16_t port) {
  return line_exchange(port, "flush_all\r\n", "OK", 5000);
}

std::string memcached_preload_previous(uint16_t port, const Keyspace& keys, int64_t now_ms) {
  const std::string prev = std::to_string(now_ms / 60'000 - 1);
  const std::string ttl = std::to_string(kMemcachedBucketTtlS);
  std::string cmds;
  for (const std::string& name : keys.names)
    cmds.append("set ").append(name).append(":").append(prev).append(" 0 ").append(ttl).append(
        " 1 noreply\r\n1\r\n");
  // The sets answer nothing; the answer to this says every set before it was handled (the first
  // line is an error instead when one failed).
  return line_exchange(port, cmds + "version\r\n", "VERSION", 10'000);
}

}  // namespace sluice::bench
