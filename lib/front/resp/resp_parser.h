// The RESP door's request parser: the bytes a Redis client sends, cut into commands. It owns no
// socket and no buffer: the connection keeps the bytes it read and not yet consumed, and hands
// them to next() again with more appended after each read. Many commands per read, a command
// split across reads at any byte: the parser remembers how far it got into the command that
// starts the unconsumed bytes (offsets from that start, so the caller may move the bytes to the
// front of its buffer between calls), and reads no byte twice.
//
// Two request forms, as redis-server accepts them (src/networking.c, processInputBuffer):
//  - an array of bulk strings, `*<n>\r\n` then n times `$<len>\r\n<len bytes>\r\n`: what every
//    client library sends;
//  - an inline command: one line (ended by "\n", an "\r" before it dropped), arguments split at
//    spaces, with "double" (C escapes, \xHH) and 'single' quotes: nc, health probes, telnet.
// The first byte of a request decides: '*' an array, anything else a line. `*0` and `*-1` and an
// empty line are no command (skipped). Requests are the same in RESP2 and RESP3.
//
// Hostile input is bounded here, with the limits below. A violation is a ProtocolError: its text
// is Redis's own where Redis has one, and the connection answers it and closes (as Redis does:
// CLIENT_CLOSE_AFTER_REPLY). The parser is then stuck in the error until reset().
//
// Thread safety: none; one parser per connection, used on the connection's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::front::resp {

// A rate-limit key or descriptor value never needs more; redis-server's own default is 512 MB.
inline constexpr size_t kMaxArgBytes = 4096;
// Arguments of one command, its name included: a SLUICE.CHECK with ~500 descriptor pairs.
inline constexpr size_t kMaxArgs = 1024;
// One inline line: inline requests are typed by people and probes (clients send arrays), so
// this is shorter than redis-server's 64 KB.
inline constexpr size_t kMaxInlineBytes = 4096;
// One command's bytes, framing included. A connection holds at most one unfinished command, so
// this bounds what it buffers (plus one read): a client that never finishes a command is
// refused once it sends more than this, not served from an ever-growing buffer.
inline constexpr size_t kMaxCommandBytes = 64 * 1024;
// `*<n>\r\n` and `$<n>\r\n` lines: room for any valid count and a few stray bytes.
inline constexpr size_t kMaxLengthLineBytes = 32;
// Before AUTH succeeds (a password set), an array may hold at most this many elements, as Redis.
inline constexpr size_t kMaxUnauthenticatedArgs = 10;

// Why a request was refused; a metrics appender shows one counter per reason
// (sluice_resp_protocol_errors_total{reason="..."}, reason_name()).
enum class ProtocolError : uint8_t {
  kNone = 0,
  kMultibulkLength,      // `*` count not a number, < -1, or over kMaxArgs
  kUnauthMultibulk,      // over kMaxUnauthenticatedArgs before AUTH
  kBulkLength,           // `$` length not a number, negative, or over kMaxArgBytes
  kExpectedDollar,       // an array element that is not a bulk string (nested arrays too)
  kMultibulkLineTooBig,  // no line end in a `*` line's first kMaxLengthLineBytes
  kBulkLineTooBig,       // no line end in a `$` line's first kMaxLengthLineBytes
  kBulkTerminator,       // the bytes after a bulk's payload are not "\r\n"
  kInlineTooBig,         // an inline line over kMaxInlineBytes
  kInlineTooManyArgs,    // an inline line of more than kMaxArgs arguments
  kUnbalancedQuotes,     // an inline line's quotes do not close, or close mid-argument
  kCommandTooBig,        // a command over kMaxCommandBytes
  // Not the parser's: a command named `POST` or `Host:`, an HTTP request sent to the door (a
  // browser's cross-protocol attack); closed without a reply, as redis-server does.
  kCrossProtocol,
};
inline constexpr size_t kProtocolErrorKinds = 13;

// The label value of a reason ("invalid_bulk_length", ...).
std::string_view reason_name(ProtocolError e);
// The error reply's text without the leading '-' ("ERR Protocol error: ..."). For
// kExpectedDollar it names the byte found, so it is built into `out`.
void error_text(ProtocolError e, char found, std::string& out);

class RespParser {
 public:
  enum class Status {
    kCommand,   // args() holds a command of `consumed` bytes
    kNeedMore,  // `data` ends inside a command: call again with more bytes after it
    kError,     // error() says why; close after answering it
  };

  RespParser();

  // Parses the command at the start of `data`: the bytes not consumed yet, beginning at the
  // first byte of the command the previous kCommand left off at (or of the stream). On kCommand
  // `consumed` is its length (skipped empty requests included): the caller drops those bytes
  // once it is done with args(). On kNeedMore `consumed` is what may be dropped already
  // (skipped empty requests), and the parser keeps its progress into the command that follows.
  // `authenticated` false applies kMaxUnauthenticatedArgs.
  Status next(std::string_view data, size_t& consumed, bool authenticated = true);

  // The last command's arguments, args()[0] its name: views into the `data` of that call, or
  // into the parser (an inline argument with escapes). Valid until the next call.
  std::span<const std::string_view> args() const { return {views_.data(), views_.size()}; }
  ProtocolError error() const { return error_; }
  char error_byte() const { return error_byte_; }  // kExpectedDollar: the byte found

  void reset();

 private:
  struct Span {
    uint32_t offset;  // from the start of the command
    uint32_t size;
  };

  Status fail(ProtocolError e, char found = 0);
  Status parse_array(std::string_view data, bool authenticated);
  Status parse_inline(std::string_view data);

  ProtocolError error_ = ProtocolError::kNone;
  char error_byte_ = 0;
  // Progress into the current array command.
  bool in_array_ = false;
  size_t pos_ = 0;         // bytes of it parsed
  int64_t remaining_ = 0;  // elements still to read
  int64_t bulk_len_ = -1;  // the current element's length, -1 before its `$` line
  std::vector<Span> spans_;
  std::vector<std::string_view> views_;
  std::string unescaped_;  // inline arguments, unquoted
};

// Integers as Redis reads them (string2ll): an optional '-', then digits with no leading zero
// (but "0"), no spaces, within int64. Lengths, SELECT's db, HELLO's version, HITS.
bool parse_redis_int(std::string_view s, int64_t& out);

// `digits` (one or more '0'-'9', the sign already taken off), negated when `negative`; false when
// it is not all digits or does not fit int64.
bool digits_to_int64(std::string_view digits, bool negative, int64_t& out);

}  // namespace sluice::front::resp
