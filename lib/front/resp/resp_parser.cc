// The RESP door's request parser (resp_parser.h): arrays of bulk strings and inline lines, as
// redis-server's processMultibulkBuffer and processInlineBuffer read them, with tighter limits,
// and stricter in two places: a bulk's payload must end in "\r\n" (Redis skips two bytes
// unseen), and a `*` count below -1 is an error (Redis skips it like `*-1`), since either means
// the client and the door no longer agree where requests begin.
#include "front/resp/resp_parser.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace sluice::front::resp {
namespace {

struct ErrorInfo {
  std::string_view reason;
  std::string_view text;
};

constexpr std::array<ErrorInfo, kProtocolErrorKinds> kErrors = {{
    {"none", ""},
    {"invalid_multibulk_length", "ERR Protocol error: invalid multibulk length"},
    {"unauthenticated_multibulk_length", "ERR Protocol error: unauthenticated multibulk length"},
    {"invalid_bulk_length", "ERR Protocol error: invalid bulk length"},
    {"expected_bulk", "ERR Protocol error: expected '$', got '"},
    {"multibulk_line_too_big", "ERR Protocol error: too big mbulk count string"},
    {"bulk_line_too_big", "ERR Protocol error: too big bulk count string"},
    {"bulk_terminator", "ERR Protocol error: invalid bulk terminator"},
    {"inline_too_big", "ERR Protocol error: too big inline request"},
    {"inline_too_many_args", "ERR Protocol error: too many arguments in inline request"},
    {"unbalanced_quotes", "ERR Protocol error: unbalanced quotes in request"},
    {"command_too_big", "ERR Protocol error: command over 65536 bytes"},
    {"cross_protocol", ""},
}};
static_assert(kMaxCommandBytes == 65536, "kErrors names kMaxCommandBytes");

enum class Line { kFound, kMore, kTooBig, kBadEnd };

// The `*`/`$` line starting at `from`: its "\r" at `cr`, found within kMaxLengthLineBytes.
Line find_length_line(std::string_view data, size_t from, size_t& cr) {
  const size_t end = std::min(data.size(), from + kMaxLengthLineBytes);
  const void* p = std::memchr(data.data() + from, '\r', end - from);
  if (p == nullptr) return end - from >= kMaxLengthLineBytes ? Line::kTooBig : Line::kMore;
  cr = static_cast<size_t>(static_cast<const char*>(p) - data.data());
  if (cr + 1 >= data.size()) return Line::kMore;
  return data[cr + 1] == '\n' ? Line::kFound : Line::kBadEnd;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == '\0';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One argument of an inline line at `i`, quoted or not (redis's sdssplitargs), appended to
// `out`. False: unbalanced quotes.
bool split_one(std::string_view line, size_t& i, std::string& out) {
  bool in_double = false, in_single = false;
  while (true) {
    const char c = i < line.size() ? line[i] : '\0';
    const bool at_end = i >= line.size();
    if (in_double) {
      if (at_end) return false;
      if (c == '\\' && i + 3 < line.size() && line[i + 1] == 'x' && hex_value(line[i + 2]) >= 0 &&
          hex_value(line[i + 3]) >= 0) {
        out.push_back(static_cast<char>(hex_value(line[i + 2]) * 16 + hex_value(line[i + 3])));
        i += 4;
        continue;
      }
      if (c == '\\' && i + 1 < line.size()) {
        const char e = line[++i];
        out.push_back(e == 'n'   ? '\n'
                      : e == 'r' ? '\r'
                      : e == 't' ? '\t'
                      : e == 'b' ? '\b'
                      : e == 'a' ? '\a'
                                 : e);
      } else if (c == '"') {
        if (i + 1 < line.size() && !is_space(line[i + 1])) return false;
        ++i;
        return true;
      } else {
        out.push_back(c);
      }
    } else if (in_single) {
      if (at_end) return false;
      if (c == '\\' && i + 1 < line.size() && line[i + 1] == '\'') {
        out.push_back('\'');
        ++i;
      } else if (c == '\'') {
        if (i + 1 < line.size() && !is_space(line[i + 1])) return false;
        ++i;
        return true;
      } else {
        out.push_back(c);
      }
    } else {
      if (at_end || is_space(c)) return true;
      if (c == '"') {
        in_double = true;
      } else if (c == '\'') {
        in_single = true;
      } else {
        out.push_back(c);
      }
    }
    ++i;
  }
}

}  // namespace

std::string_view reason_name(ProtocolError e) {
  return kErrors[static_cast<size_t>(e)].reason;
}

void error_text(ProtocolError e, char found, std::string& out) {
  out.assign(kErrors[static_cast<size_t>(e)].text);
  if (e == ProtocolError::kExpectedDollar) {
    out.push_back(found);
    out.push_back('\'');
  }
}

RespParser::RespParser() = default;

void RespParser::reset() {
  error_ = ProtocolError::kNone;
  error_byte_ = 0;
  in_array_ = false;
  pos_ = 0;
  remaining_ = 0;
  bulk_len_ = -1;
  spans_.clear();
  views_.clear();
}

RespParser::Status RespParser::fail(ProtocolError e, char found) {
  error_ = e;
  error_byte_ = found;
  views_.clear();
  return Status::kError;
}

RespParser::Status RespParser::next(std::string_view data, size_t& consumed, bool authenticated) {
  consumed = 0;
  views_.clear();
  if (error_ != ProtocolError::kNone) return Status::kError;
  while (!data.empty()) {
    const Status s =
        data[0] == '*' || in_array_ ? parse_array(data, authenticated) : parse_inline(data);
    if (s == Status::kError) return s;
    if (s == Status::kNeedMore) return s;
    // kCommand: a whole request of pos_ bytes, perhaps an empty one.
    consumed += pos_;
    data.remove_prefix(pos_);
    pos_ = 0;
    if (!views_.empty()) return Status::kCommand;
  }
  return Status::kNeedMore;
}

RespParser::Status RespParser::parse_array(std::string_view data, bool authenticated) {
  size_t cr = 0;
  if (!in_array_) {
    switch (find_length_line(data, 1, cr)) {
      case Line::kMore:
        return Status::kNeedMore;
      case Line::kTooBig:
        return fail(ProtocolError::kMultibulkLineTooBig);
      case Line::kBadEnd:
        return fail(ProtocolError::kMultibulkLength);
      case Line::kFound:
        break;
    }
    int64_t n = 0;
    if (!parse_redis_int(data.substr(1, cr - 1), n) || n < -1 || n > static_cast<int64_t>(kMaxArgs))
      return fail(ProtocolError::kMultibulkLength);
    if (!authenticated && n > static_cast<int64_t>(kMaxUnauthenticatedArgs))
      return fail(ProtocolError::kUnauthMultibulk);
    pos_ = cr + 2;
    if (n <= 0) return Status::kCommand;  // no command: skipped
    in_array_ = true;
    remaining_ = n;
    bulk_len_ = -1;
    spans_.clear();
  }
  while (remaining_ > 0) {
    if (bulk_len_ < 0) {
      if (pos_ >= data.size()) return Status::kNeedMore;
      if (data[pos_] != '$') return fail(ProtocolError::kExpectedDollar, data[pos_]);
      switch (find_length_line(data, pos_ + 1, cr)) {
        case Line::kMore:
          return Status::kNeedMore;
        case Line::kTooBig:
          return fail(ProtocolError::kBulkLineTooBig);
        case Line::kBadEnd:
          return fail(ProtocolError::kBulkLength);
        case Line::kFound:
          break;
      }
      int64_t len = 0;
      if (!parse_redis_int(data.substr(pos_ + 1, cr - pos_ - 1), len) || len < 0 ||
          len > static_cast<int64_t>(kMaxArgBytes))
        return fail(ProtocolError::kBulkLength);
      if (cr + 2 + static_cast<size_t>(len) + 2 > kMaxCommandBytes)
        return fail(ProtocolError::kCommandTooBig);
      pos_ = cr + 2;
      bulk_len_ = len;
    }
    const auto len = static_cast<size_t>(bulk_len_);
    if (data.size() < pos_ + len + 2) return Status::kNeedMore;
    if (data[pos_ + len] != '\r' || data[pos_ + len + 1] != '\n')
      return fail(ProtocolError::kBulkTerminator);
    spans_.push_back({static_cast<uint32_t>(pos_), static_cast<uint32_t>(len)});
    pos_ += len + 2;
    bulk_len_ = -1;
    --remaining_;
  }
  in_array_ = false;
  views_.reserve(spans_.size());
  for (const Span& s : spans_)
    views_.emplace_back(data.data() + s.offset, s.size);
  return Status::kCommand;
}

RespParser::Status RespParser::parse_inline(std::string_view data) {
  // pos_: the bytes already searched for the line's end.
  const size_t limit = std::min(data.size(), kMaxInlineBytes + 2);
  const void* p = pos_ < limit ? std::memchr(data.data() + pos_, '\n', limit - pos_) : nullptr;
  if (p == nullptr) {
    pos_ = limit;
    if (data.size() > kMaxInlineBytes + 1) return fail(ProtocolError::kInlineTooBig);
    return Status::kNeedMore;
  }
  const auto nl = static_cast<size_t>(static_cast<const char*>(p) - data.data());
  size_t line_end = nl;
  if (line_end > 0 && data[line_end - 1] == '\r') --line_end;
  if (line_end > kMaxInlineBytes) return fail(ProtocolError::kInlineTooBig);
  const std::string_view line = data.substr(0, line_end);
  unescaped_.clear();
  spans_.clear();
  size_t i = 0;
  while (true) {
    while (i < line.size() && is_space(line[i]))
      ++i;
    if (i >= line.size()) break;
    if (spans_.size() == kMaxArgs) return fail(ProtocolError::kInlineTooManyArgs);
    const size_t start = unescaped_.size();
    if (!split_one(line, i, unescaped_)) return fail(ProtocolError::kUnbalancedQuotes);
    spans_.push_back(
        {static_cast<uint32_t>(start), static_cast<uint32_t>(unescaped_.size() - start)});
  }
  pos_ = nl + 1;
  views_.reserve(spans_.size());
  for (const Span& s : spans_)
    views_.emplace_back(unescaped_.data() + s.offset, s.size);
  return Status::kCommand;
}

bool digits_to_int64(std::string_view digits, bool negative, int64_t& out) {
  if (digits.empty()) return false;
  uint64_t v = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return false;
    const auto d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  const uint64_t max = static_cast<uint64_t>(INT64_MAX) + (negative ? 1 : 0);
  if (v > max) return false;
  out = negative ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
  return true;
}

bool parse_redis_int(std::string_view s, int64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  const bool negative = s[0] == '-';
  if (negative) s.remove_prefix(1);
  if (s.size() > 1 && s[0] == '0') return false;
  return digits_to_int64(s, negative, out);
}

}  // namespace sluice::front::resp
