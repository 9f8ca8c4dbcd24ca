// Private to bench/load: the byte-stream connection every TCP target (sluiced's frames, RESP,
// memcached, HTTP, gRPC) is made of. StreamConn keeps the output buffer send() appends to and the
// input buffer, and runs the read loop; a target only encodes requests and parses answers.
#pragma once

#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "load/driver.h"
#include "load/targets.h"

namespace sluice::bench::detail {

// A whole decimal number.
template <typename Int>
bool parse_int(std::string_view s, Int& out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

class StreamConn : public Conn {
 public:
  void flush() override {
    // Bounded: each pass writes something or stops.
    while (out_pos_ < out_.size()) {
      const ssize_t n = ::send(fd_, out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL);
      if (n > 0) {
        out_pos_ += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      stats_->note_error(error_prefix_ + "send: " + std::strerror(errno));
      fail();
      return;
    }
    out_.clear();  // keeps its capacity
    out_pos_ = 0;
  }
  bool wants_write() const override { return out_pos_ < out_.size(); }

  // Reads what is available and hands it to parse() answer by answer; then, when the server has
  // closed its side, notes that (after the answers that came before it) and fails. Writes what
  // parse() queued (a follow-up request).
  void on_readable(int64_t now) override {
    const ReadResult r = read_some();
    // Bounded: each pass consumes one answer or stops.
    for (size_t guard = 0; guard < 1'000'000 && !failed_ && in_begin_ < in_end_; ++guard) {
      const size_t used = parse({in_.data() + in_begin_, in_end_ - in_begin_}, now);
      if (used == 0) break;
      in_begin_ += used;
      if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
    }
    if (r == ReadResult::kPeerClosed && !failed_) {
      stats_->note_error(error_prefix_ + closed_message());
      fail();
    }
    if (!failed_ && wants_write()) flush();
  }

 protected:
  // error_prefix: before "send: ", "recv: " and "connection closed by the server".
  StreamConn(int fd, ThreadContext& ctx, std::string error_prefix = "")
      : Conn(fd),
        rec_(*ctx.recorder),
        keys_(*ctx.keys),
        stats_(rec_.stats),
        error_prefix_(std::move(error_prefix)) {}

  // The answer at the front of `in`: its bytes, 0 when it is incomplete or the connection failed
  // (a malformed answer: noted and fail()ed).
  virtual size_t parse(std::string_view in, int64_t now) = 0;
  virtual std::string closed_message() const { return "connection closed by the server"; }

  Recorder& rec_;
  KeyStream& keys_;  // the thread's key draws
  RowStats* stats_;
  std::string out_;
  size_t out_pos_ = 0;

 private:
  enum class ReadResult { kOpen, kPeerClosed, kFailed };
  // Reads what is available (at most a few buffers full) into the input buffer, which doubles
  // when full (the parsers bound an answer's size).
  ReadResult read_some() {
    for (int i = 0; i < 8; ++i) {
      if (in_end_ == in_.size()) {
        if (in_begin_ > 0) {
          std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
          in_end_ -= in_begin_;
          in_begin_ = 0;
        } else {
          in_.resize(in_.size() * 2);
        }
      }
      const ssize_t n = ::recv(fd_, in_.data() + in_end_, in_.size() - in_end_, 0);
      if (n > 0) {
        in_end_ += static_cast<size_t>(n);
        if (in_end_ < in_.size()) return ReadResult::kOpen;  // drained the socket
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ReadResult::kOpen;
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) return ReadResult::kPeerClosed;
      stats_->note_error(error_prefix_ + "recv: " + std::strerror(errno));
      fail();
      return ReadResult::kFailed;
    }
    return ReadResult::kOpen;
  }

  std::string error_prefix_;
  std::vector<char> in_ = std::vector<char>(256 * 1024);
  size_t in_begin_ = 0, in_end_ = 0;
};

// A connection of type C (a StreamConn taking (fd, o, ctx)) to 127.0.0.1:o.port; throws
// std::runtime_error when it cannot connect.
template <typename C, typename O>
std::unique_ptr<Conn> connect_stream(const O& o, ThreadContext& ctx) {
  std::string err;
  const int fd = tcp_connect(o.port, 2000, err);
  if (fd < 0) throw std::runtime_error(err);
  return std::make_unique<C>(fd, o, ctx);
}

// Requests answered in the order they were sent (pipelined): a ring of at most `window`.
template <typename T>
class InOrder {
 public:
  explicit InOrder(size_t window) : items_(window) {}
  bool full() const { return count_ == items_.size(); }
  bool empty() const { return count_ == 0; }
  T& push() { return items_[(head_ + count_++) % items_.size()]; }
  T& front() { return items_[head_]; }
  void pop() {
    head_ = (head_ + 1) % items_.size();
    --count_;
  }
  size_t size() const { return count_; }

 private:
  std::vector<T> items_;
  size_t head_ = 0, count_ = 0;
};

}  // namespace sluice::bench::detail
