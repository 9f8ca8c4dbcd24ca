// Private to bench/load: what targets.cc (sluiced), targets_kv.cc (Redis, memcached) and
// http_target.cc (sluiced's /v1/check, nginx) share. StreamConn is the byte-stream connection base
// (buffered output, an input buffer) of the TCP and HTTP targets; SyncClient is the blocking
// client of the probes and setup helpers of targets.cc and targets_kv.cc.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "load/driver.h"
#include "load/targets.h"

namespace sluice::bench::detail {

// ---- a byte-stream connection: buffered output, input buffer ------------------------------------

// How a StreamConn sizes its input buffer and names its socket errors. The defaults are the TCP
// targets'.
struct StreamConnOptions {
  size_t in_initial_bytes = 256 * 1024;
  // A full input buffer doubles only while it is smaller than this; past it, reading stops until
  // the owner consumes (so its parser must call an answer that large malformed, or it stalls).
  size_t in_grow_below_bytes = SIZE_MAX;
  const char* error_prefix = "";  // before "send: " and "recv: " in error messages
};

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
      stats_->note_error(std::string(error_prefix_) + "send: " + std::strerror(errno));
      fail();
      return;
    }
    out_.clear();  // keeps its capacity
    out_pos_ = 0;
  }
  bool wants_write() const override { return out_pos_ < out_.size(); }

 protected:
  StreamConn(int fd, RowStats* stats, const StreamConnOptions& o = {})
      : Conn(fd),
        stats_(stats),
        in_grow_below_(o.in_grow_below_bytes),
        error_prefix_(o.error_prefix) {
    in_.resize(o.in_initial_bytes);
  }

  enum class ReadResult {
    kOpen,        // read what there was (maybe nothing)
    kPeerClosed,  // the peer closed its side; nothing noted, the connection not failed
    kFailed,      // recv failed: noted in the stats, the connection failed
  };
  // Reads what is available (at most a few buffers full). Whatever it returns, what was read
  // stays in the input buffer to be parsed.
  ReadResult read_some() {
    for (int i = 0; i < 8; ++i) {
      if (in_end_ == in_.size()) {
        if (in_begin_ > 0) {
          std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
          in_end_ -= in_begin_;
          in_begin_ = 0;
        } else if (in_.size() < in_grow_below_) {
          in_.resize(in_.size() * 2);
        } else {
          return ReadResult::kOpen;  // full at the limit: the owner's parser has to decide
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
      stats_->note_error(std::string(error_prefix_) + "recv: " + std::strerror(errno));
      fail();
      return ReadResult::kFailed;
    }
    return ReadResult::kOpen;
  }
  // read_some(), the peer closing being an error too (noted, the connection failed). False when
  // the peer closed or failed.
  bool read_available() {
    const ReadResult r = read_some();
    if (r == ReadResult::kPeerClosed) {
      stats_->note_error("connection closed by the server");
      fail();
    }
    return r == ReadResult::kOpen;
  }
  std::string_view pending_input() const { return {in_.data() + in_begin_, in_end_ - in_begin_}; }
  void consume(size_t n) {
    in_begin_ += n;
    if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
  }

  RowStats* stats_;
  std::string out_;
  size_t out_pos_ = 0;
  std::vector<char> in_;
  size_t in_begin_ = 0, in_end_ = 0;

 private:
  size_t in_grow_below_;
  const char* error_prefix_;
};

// ---- blocking helpers for setup -----------------------------------------------------------------

class SyncClient {
 public:
  ~SyncClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  std::string connect(uint16_t port, int timeout_ms) {
    std::string err;
    fd_ = tcp_connect(port, timeout_ms, err);
    return err;
  }
  std::string send_all(std::string_view data, int timeout_ms) {
    size_t off = 0;
    const int64_t deadline = now_ns() + int64_t{timeout_ms} * 1'000'000;
    while (off < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return std::string("send: ") + std::strerror(errno);
      }
      if (now_ns() > deadline) return "send timed out";
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, 10);
    }
    return "";
  }
  // Reads until done(buf) is true, EOF (then `eof` is set) or the timeout.
  std::string read_until(const std::function<bool(std::string_view)>& done, int timeout_ms,
                         bool* eof = nullptr) {
    const int64_t deadline = now_ns() + int64_t{timeout_ms} * 1'000'000;
    char tmp[65'536];
    while (!done(buf)) {
      const int64_t left_ms = (deadline - now_ns()) / 1'000'000;
      if (left_ms <= 0) return "timed out waiting for a reply";
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 100))) <= 0) continue;
      const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n > 0) {
        buf.append(tmp, static_cast<size_t>(n));
      } else if (n == 0) {
        if (eof) *eof = true;
        return done(buf) ? "" : "connection closed";
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return std::string("recv: ") + std::strerror(errno);
      }
    }
    return "";
  }
  // connect(), send_all(request), read_until(done), each bounded by timeout_ms: "" or the first
  // error. A whole-line answer (memcached, PING) is done at its first "\r\n".
  std::string exchange(uint16_t port, std::string_view request, int timeout_ms,
                       const std::function<bool(std::string_view)>& done = line_done,
                       bool* eof = nullptr) {
    std::string e = connect(port, timeout_ms);
    if (e.empty()) e = send_all(request, timeout_ms);
    if (e.empty()) e = read_until(done, timeout_ms, eof);
    return e;
  }
  static bool line_done(std::string_view b) { return b.find("\r\n") != b.npos; }
  int fd() const { return fd_; }
  std::string buf;

 private:
  int fd_ = -1;
};

}  // namespace sluice::bench::detail
