// The targets sluiced is compared against, the common designs: Redis (a RESP client, RedisConn
// for INCR, the Lua sliding log (a sorted set per key), Figma's hash of minute counters, GCRA in
// Lua, and CL.THROTTLE, which also drives sluiced's Redis-protocol door) and memcached
// (MemcachedConn, the memcached sliding window's two counters), with their factories, probes and
// preloads. sluiced's own targets are in targets.cc; the shared StreamConn and SyncClient in
// stream_conn.h.
#include "load/targets.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "load/stream_conn.h"

namespace sluice::bench {

namespace {

using detail::StreamConn;
using detail::SyncClient;

template <typename Int>
bool parse_int(std::string_view s, Int& out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// ---- RESP -------------------------------------------------------------------------------------

struct RespReply {
  char type = 0;          // '+', '-', ':', '$', '*'
  int64_t integer = 0;    // ':'
  std::string_view text;  // '+', '-', '$' (empty and null = true for a null bulk)
  bool null = false;
  std::vector<std::string_view> elems;  // '*': elements (bulk, simple or integer text)
};

// One reply from the front of `in`: bytes consumed, 0 when incomplete, -1 when malformed or
// nested deeper than one array (no command used here answers that way).
long parse_resp(std::string_view in, RespReply& r) {
  r.elems.clear();
  r.null = false;
  r.text = {};
  size_t pos = 0;
  // Reads a CRLF-terminated line after pos; 1 ok, 0 incomplete, -1 malformed.
  auto line = [&](std::string_view& out) -> int {
    const size_t cr = in.find('\r', pos);
    if (cr == std::string_view::npos || cr + 1 >= in.size()) return 0;
    if (in[cr + 1] != '\n') return -1;
    out = in.substr(pos, cr - pos);
    pos = cr + 2;
    return 1;
  };
  // One scalar element at pos (type byte included) into `out`; same returns as line().
  auto scalar = [&](char& type, std::string_view& out, bool& is_null) -> int {
    if (pos >= in.size()) return 0;
    type = in[pos++];
    std::string_view l;
    if (const int s = line(l); s <= 0) return s;
    if (type == '+' || type == '-' || type == ':') {
      out = l;
      return 1;
    }
    if (type != '$') return -1;
    int64_t len = 0;
    if (!parse_int(l, len)) return -1;
    if (len < 0) {
      is_null = true;
      out = {};
      return 1;
    }
    const auto ulen = static_cast<size_t>(len);
    if (in.size() - pos < ulen + 2) return 0;
    out = in.substr(pos, ulen);
    pos += ulen + 2;
    return 1;
  };
  if (in.empty()) return 0;
  if (in[0] != '*') {
    const int s = scalar(r.type, r.text, r.null);
    if (s <= 0) return s;
    if (r.type == ':' && !parse_int(r.text, r.integer)) return -1;
    return static_cast<long>(pos);
  }
  r.type = '*';
  ++pos;
  std::string_view l;
  if (const int s = line(l); s <= 0) return s;
  int64_t count = 0;
  if (!parse_int(l, count)) return -1;
  if (count < 0) {
    r.null = true;
    return static_cast<long>(pos);
  }
  for (int64_t i = 0; i < count; ++i) {
    char t = 0;
    std::string_view e;
    bool en = false;
    if (pos < in.size() && in[pos] == '*') return -1;
    const int s = scalar(t, e, en);
    if (s <= 0) return s;
    r.elems.push_back(e);
  }
  return static_cast<long>(pos);
}

void append_bulk(std::string& out, std::string_view s) {
  out += '$';
  out += std::to_string(s.size());
  out += "\r\n";
  out.append(s);
  out += "\r\n";
}

void append_array_header(std::string& out, size_t n) {
  out += '*';
  out += std::to_string(n);
  out += "\r\n";
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

class RedisConn final : public StreamConn {
 public:
  RedisConn(int fd, const RedisConnOptions& o, ThreadContext& ctx)
      : StreamConn(fd, ctx.recorder->stats),
        o_(o),
        rec_(*ctx.recorder),
        stream_(*ctx.keys),
        units_(o.window) {
    for (Unit& u : units_)
      u.keys.resize(o.batch);
    limit_text_ = std::to_string(o.limit);
    burst_text_ = std::to_string(o.gcra_burst);
    count_text_ = std::to_string(o.gcra_count);
    period_text_ = std::to_string(o.gcra_period_s);
    per_check_ = o.scheme == RedisScheme::kHashMinutes ? 3 : 1;
  }
  bool has_room() const override { return count_ < units_.size(); }
  void send(int64_t start) override {
    Unit& u = units_[(head_ + count_) % units_.size()];
    ++count_;
    u.start = start;
    u.replies_total = o_.batch * per_check_;
    u.replies_seen = 0;
    const int64_t now_ms = epoch_ms();
    char now_text[24];
    const auto now_end = std::to_chars(now_text, now_text + sizeof now_text, now_ms).ptr;
    const std::string_view now_sv(now_text, static_cast<size_t>(now_end - now_text));
    for (uint32_t i = 0; i < o_.batch; ++i) {
      const uint32_t k = stream_.next();
      u.keys[i] = k;
      const std::string& name = o_.keys->names[k];
      switch (o_.scheme) {
        case RedisScheme::kIncr:
          append_command(out_, {"INCR", name});
          break;
        case RedisScheme::kLuaLog:
          key_.assign(name).append("-rate-limit-v1");  // the Lua sliding log's key
          append_command(out_, {"EVALSHA", o_.lua_sha, "1", key_, limit_text_, "60000", now_sv});
          break;
        case RedisScheme::kHashMinutes: {
          key_.assign("rl:").append(name);
          char minute[24];
          const auto mend = std::to_chars(minute, minute + sizeof minute, now_ms / 60'000).ptr;
          append_command(out_, {"HINCRBY", key_,
                                std::string_view(minute, static_cast<size_t>(mend - minute)), "1"});
          append_command(out_, {"EXPIRE", key_, "3600"});
          append_command(out_, {"HGETALL", key_});
          break;
        }
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
  void on_readable(int64_t now) override {
    const bool ok = read_available();
    // Bounded: each pass consumes one reply or stops.
    for (size_t guard = 0; guard < 1'000'000; ++guard) {
      const std::string_view in = pending_input();
      if (in.empty()) break;
      const long used = parse_resp(in, reply_);
      if (used == 0) break;
      if (used < 0) {
        stats_->note_error("malformed RESP reply");
        fail();
        return;
      }
      handle_reply(now);
      consume(static_cast<size_t>(used));
    }
    if (!ok) fail();
  }

 private:
  struct Unit {
    int64_t start = 0;
    uint32_t replies_total = 0;
    uint32_t replies_seen = 0;
    std::vector<uint32_t> keys;  // the key of each check, in order
  };

  void handle_reply(int64_t now) {
    if (count_ == 0) {
      stats_->note_error("RESP reply with nothing in flight");
      return;
    }
    Unit& u = units_[head_];
    const uint32_t idx = u.replies_seen++;
    if (reply_.type == '-') {
      stats_->note_error("redis: " + std::string(reply_.text));
    } else if (idx < o_.batch * per_check_) {
      judge(idx % per_check_, u.keys[idx / per_check_]);
    }
    if (u.replies_seen == u.replies_total) {
      rec_.complete(u.start, now, o_.batch);
      head_ = (head_ + 1) % units_.size();
      --count_;
    }
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
        judge_minutes(key);
        return;
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
    const int64_t minute = now_s / 60;
    const int64_t oldest = minute - kHashWindowMinutes + (now_s % 60 == 0 ? 1 : 0);
    uint64_t sum = 0;
    size_t stale = 0;
    for (size_t i = 0; i + 1 < reply_.elems.size(); i += 2) {
      int64_t field = 0;
      uint64_t value = 0;
      if (!parse_int(reply_.elems[i], field) || !parse_int(reply_.elems[i + 1], value)) {
        return stats_->note_error("HGETALL: non-numeric field");
      }
      if (field >= oldest) {
        sum += value;
      } else {
        ++stale;
      }
    }
    if (sum > o_.limit) ++stats_->denied;
    if (stale > kStaleFieldsBeforeCleanup && cleanup_.empty()) {
      key_.assign("rl:").append(o_.keys->names[key]);
      append_array_header(cleanup_, 2 + stale);
      append_bulk(cleanup_, "HDEL");
      append_bulk(cleanup_, key_);
      for (size_t i = 0; i + 1 < reply_.elems.size(); i += 2) {
        int64_t field = 0;
        if (parse_int(reply_.elems[i], field) && field < oldest) {
          append_bulk(cleanup_, reply_.elems[i]);
        }
      }
    }
  }

  RedisConnOptions o_;
  Recorder& rec_;
  KeyStream& stream_;
  std::vector<Unit> units_;
  size_t head_ = 0, count_ = 0;
  uint32_t per_check_ = 1;
  std::string limit_text_;
  std::string burst_text_, count_text_, period_text_;
  std::string key_;
  RespReply reply_;
  std::string cleanup_;  // an HDEL to send with the next request
};

// ---- memcached (two-counter sliding window)
// ----------------------------------------------------------

// The memcached sliding window (fixed rate), as its library does it per check:
//   1. get <key>:<bucket> <key>:<bucket-1>            one multi-get of both buckets
//   2. estimate = previous * (share of the previous bucket still inside the window) + current;
//      denied when estimate + 1 > limit (nothing is written);
//   3. otherwise incr <key>:<bucket> 1; on NOT_FOUND add it with value 1 and a TTL of two
//      windows; if the add loses a race (NOT_STORED), incr again.
// Buckets are one minute (the window). Steps 1 and 3 depend on each other (the decision comes
// between them), so a check costs two round trips, three on a bucket's first hit.
class MemcachedConn final : public StreamConn {
 public:
  MemcachedConn(int fd, const MemcachedConnOptions& o, ThreadContext& ctx)
      : StreamConn(fd, ctx.recorder->stats), o_(o), rec_(*ctx.recorder), stream_(*ctx.keys) {}
  bool has_room() const override { return state_ == State::kIdle; }
  void send(int64_t start) override {
    start_ = start;
    now_ms_ = epoch_ms();
    const int64_t bucket = now_ms_ / 60'000;
    const std::string& name = o_.keys->names[stream_.next()];
    cur_key_.assign(name).append(":").append(std::to_string(bucket));
    prev_key_.assign(name).append(":").append(std::to_string(bucket - 1));
    cur_ = prev_ = 0;
    out_.append("get ").append(cur_key_).append(" ").append(prev_key_).append("\r\n");
    state_ = State::kGet;
  }
  void on_readable(int64_t now) override {
    const bool ok = read_available();
    for (size_t guard = 0; guard < 1'000'000 && state_ != State::kIdle; ++guard) {
      const std::string_view in = pending_input();
      const size_t eol = in.find("\r\n");
      if (eol == std::string_view::npos) break;
      const std::string_view line = in.substr(0, eol);
      size_t used = eol + 2;
      if (state_ == State::kGet && line.starts_with("VALUE ")) {
        // VALUE <key> <flags> <bytes>\r\n<data>\r\n
        const size_t sp3 = line.rfind(' ');
        size_t bytes = 0;
        if (!parse_int(line.substr(sp3 + 1), bytes)) {
          stats_->note_error("memcached: bad VALUE line");
          fail();
          return;
        }
        if (in.size() < used + bytes + 2) break;  // data not complete yet
        const std::string_view key = line.substr(6, line.find(' ', 6) - 6);
        uint64_t v = 0;
        if (!parse_int(in.substr(used, bytes), v)) stats_->note_error("memcached: bad value");
        (key == cur_key_ ? cur_ : prev_) = v;
        used += bytes + 2;
      } else {
        handle_line(line, now);
      }
      consume(used);
    }
    flush();
    if (!ok) fail();
  }

 private:
  enum class State { kIdle, kGet, kIncr, kAdd, kIncrAgain };

  void handle_line(std::string_view line, int64_t now) {
    if (line == "ERROR" || line.starts_with("CLIENT_ERROR") || line.starts_with("SERVER_ERROR")) {
      stats_->note_error("memcached: " + std::string(line));
      finish(now);
      return;
    }
    uint64_t v = 0;
    switch (state_) {
      case State::kGet: {
        if (line != "END") return stats_->note_error("memcached: unexpected get reply");
        const double into = static_cast<double>(now_ms_ % 60'000) / 60'000.0;
        const double estimate =
            static_cast<double>(prev_) * (1.0 - into) + static_cast<double>(cur_);
        if (estimate + 1 > static_cast<double>(o_.limit)) {
          ++stats_->denied;
          finish(now);
          return;
        }
        out_.append("incr ").append(cur_key_).append(" 1\r\n");
        state_ = State::kIncr;
        return;
      }
      case State::kIncr:
      case State::kIncrAgain:
        if (parse_int(line, v)) return finish(now);
        if (line == "NOT_FOUND" && state_ == State::kIncr) {
          out_.append("add ")
              .append(cur_key_)
              .append(" 0 ")
              .append(std::to_string(kMemcachedBucketTtlS))
              .append(" 1\r\n1\r\n");
          state_ = State::kAdd;
          return;
        }
        stats_->note_error("memcached: unexpected incr reply " + std::string(line));
        return finish(now);
      case State::kAdd:
        if (line == "STORED") return finish(now);
        if (line == "NOT_STORED") {
          out_.append("incr ").append(cur_key_).append(" 1\r\n");
          state_ = State::kIncrAgain;
          return;
        }
        stats_->note_error("memcached: unexpected add reply " + std::string(line));
        return finish(now);
      case State::kIdle:
        stats_->note_error("memcached: reply with nothing in flight");
        return;
    }
  }
  void finish(int64_t now) {
    rec_.complete(start_, now, 1);
    state_ = State::kIdle;
  }

  MemcachedConnOptions o_;
  Recorder& rec_;
  KeyStream& stream_;
  State state_ = State::kIdle;
  int64_t start_ = 0;
  int64_t now_ms_ = 0;
  std::string cur_key_, prev_key_;
  uint64_t cur_ = 0, prev_ = 0;
};

// Counts complete RESP replies at the front of `in` (stops at the first incomplete one); sets
// `bad` on a malformed or error reply.
size_t count_resp_replies(std::string_view in, bool& bad) {
  RespReply r;
  size_t n = 0;
  bad = false;
  while (!in.empty()) {
    const long used = parse_resp(in, r);
    if (used < 0 || (used > 0 && r.type == '-')) {
      bad = true;
      break;
    }
    if (used == 0) break;
    in.remove_prefix(static_cast<size_t>(used));
    ++n;
  }
  return n;
}

}  // namespace

// ---- factories ---------------------------------------------------------------------------------

std::unique_ptr<Conn> make_redis(const RedisConnOptions& o, ThreadContext& ctx) {
  std::string err;
  const int fd = tcp_connect(o.port, 2000, err);
  if (fd < 0) throw std::runtime_error(err);
  return std::make_unique<RedisConn>(fd, o, ctx);
}

std::unique_ptr<Conn> make_memcached(const MemcachedConnOptions& o, ThreadContext& ctx) {
  std::string err;
  const int fd = tcp_connect(o.port, 2000, err);
  if (fd < 0) throw std::runtime_error(err);
  return std::make_unique<MemcachedConn>(fd, o, ctx);
}

// ---- probes and setup ---------------------------------------------------------------------------

std::string redis_probe(uint16_t port, int timeout_ms) {
  SyncClient c;
  if (std::string e = c.exchange(port, "PING\r\n", timeout_ms); !e.empty()) return e;
  return c.buf.starts_with("+PONG") ? "" : "unexpected PING reply: " + c.buf;
}

std::string redis_command(uint16_t port, const std::vector<std::string>& args, std::string& reply) {
  SyncClient c;
  std::string cmd;
  append_array_header(cmd, args.size());
  for (const std::string& a : args)
    append_bulk(cmd, a);
  RespReply r;
  if (std::string e =
          c.exchange(port, cmd, 10'000, [&](std::string_view b) { return parse_resp(b, r) != 0; });
      !e.empty()) {
    return e;
  }
  if (parse_resp(c.buf, r) <= 0) return "malformed reply";
  switch (r.type) {
    case ':':
      reply = ":" + std::to_string(r.integer);
      break;
    case '$':
      reply = "$" + std::string(r.text);
      break;
    case '*':
      reply = "*" + std::to_string(r.elems.size());
      break;
    default:
      reply = std::string(1, r.type) + std::string(r.text);
  }
  return r.type == '-' ? "redis: " + std::string(r.text) : "";
}

std::string redis_preload_minutes(uint16_t port, const Keyspace& keys, int64_t now_ms) {
  SyncClient c;
  if (std::string e = c.connect(port, 2000); !e.empty()) return e;
  const int64_t minute = now_ms / 60'000;
  std::vector<std::string> fields;
  for (int64_t m = minute - kHashWindowMinutes; m < minute; ++m)
    fields.push_back(std::to_string(m));
  constexpr size_t kChunk = 500;
  // Bounded: keys / kChunk round trips.
  for (size_t first = 0; first < keys.names.size(); first += kChunk) {
    const size_t last = std::min(keys.names.size(), first + kChunk);
    std::string cmds;
    for (size_t i = first; i < last; ++i) {
      const std::string key = "rl:" + keys.names[i];
      append_array_header(cmds, 2 + 2 * fields.size());
      append_bulk(cmds, "HSET");
      append_bulk(cmds, key);
      for (const std::string& f : fields) {
        append_bulk(cmds, f);
        append_bulk(cmds, "1");
      }
      append_command(cmds, {"EXPIRE", key, "3600"});
    }
    if (std::string e = c.send_all(cmds, 10'000); !e.empty()) return e;
    const size_t want = 2 * (last - first);
    bool bad = false;
    if (std::string e = c.read_until(
            [&](std::string_view b) { return count_resp_replies(b, bad) >= want || bad; }, 10'000);
        !e.empty()) {
      return e;
    }
    if (bad) return "malformed or error reply while preloading: " + c.buf.substr(0, 200);
    c.buf.clear();
  }
  return "";
}

std::string memcached_probe(uint16_t port, int timeout_ms) {
  SyncClient c;
  if (std::string e = c.exchange(port, "version\r\n", timeout_ms); !e.empty()) return e;
  return c.buf.starts_with("VERSION ") ? "" : "unexpected version reply: " + c.buf;
}

std::string memcached_flush_all(uint16_t port) {
  SyncClient c;
  if (std::string e = c.exchange(port, "flush_all\r\n", 5000); !e.empty()) return e;
  return c.buf.starts_with("OK") ? "" : "unexpected flush_all reply: " + c.buf;
}

std::string memcached_preload_previous(uint16_t port, const Keyspace& keys, int64_t now_ms) {
  const std::string prev = std::to_string(now_ms / 60'000 - 1);
  std::string cmds;
  for (const std::string& name : keys.names) {
    cmds.append("set ")
        .append(name)
        .append(":")
        .append(prev)
        .append(" 0 ")
        .append(std::to_string(kMemcachedBucketTtlS))
        .append(" 1 noreply\r\n1\r\n");
  }
  cmds.append("version\r\n");  // the answer to this says every set before it was handled
  SyncClient c;
  if (std::string e = c.exchange(
          port, cmds, 10'000,
          [](std::string_view b) { return b.find("VERSION") != b.npos && b.ends_with("\r\n"); });
      !e.empty()) {
    return e;
  }
  return c.buf.starts_with("VERSION") ? "" : "unexpected reply while preloading: " + c.buf;
}

}  // namespace sluice::bench
