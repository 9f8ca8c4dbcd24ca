// Private to lib/front/check: a worker of the check front (its thread, io_context, UDP socket and
// counters) and a TCP connection on it. Included by check_front.cc, the front's only translation
// unit; nothing outside the front sees Asio through here.
#pragma once

#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include <sys/socket.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <chrono>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "front/check/check_front.h"
#include "wire/protocol.h"

namespace sluice::front::check {

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::ip::udp;

inline constexpr size_t kLatencyBuckets = 24;  // < 1 us ... < 2^23 us (8 s), last: slower
inline constexpr size_t kUdpBurst = 32;        // datagrams per recvmmsg / sendmmsg
inline constexpr size_t kUdpSlot = 65'536;  // one datagram's buffer (the largest UDP payload fits)
inline constexpr int kUdpRounds = 8;        // bursts per wake-up before other work gets a turn

inline size_t latency_bucket(int64_t us) {
  size_t b = 0;
  while (b + 1 < kLatencyBuckets && (int64_t{1} << b) <= us)
    ++b;
  return b;
}

// Counters one worker updates and any thread reads (relaxed: they are statistics).
struct alignas(64) WorkerCounters {
  std::atomic<uint64_t> udp_requests{0};
  std::atomic<uint64_t> tcp_requests{0};
  std::atomic<uint64_t> tcp_connections{0};
  std::atomic<uint64_t> tcp_open{0};
  std::atomic<uint64_t> tcp_closed_shed{0};   // the oldest waiting one, over max_connections
  std::atomic<uint64_t> tcp_closed_frame{0};  // a frame not finished within client_timeout_ms
  std::atomic<uint64_t> dropped_datagrams{0};
  std::atomic<uint64_t> bad_frames{0};
  std::atomic<uint64_t> rejected_requests{0};
  std::array<std::atomic<uint64_t>, kLatencyBuckets> latency{};

  void record_latency(std::chrono::steady_clock::time_point t0) {
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    latency[latency_bucket(us)].fetch_add(1, std::memory_order_relaxed);
  }
};

// One worker thread: its io_context, its UDP socket, the TCP connections handed to it, and the
// CheckPath that decides their requests. Everything but `counters` belongs to its thread once
// it runs.
struct Worker final : WorkerLoop {
  explicit Worker(const CheckFrontOptions& o) : opt(o) {}

  // WorkerLoop (check_front.cc)
  asio::io_context& io() override { return io_ctx; }
  bool stopping() const override { return stopped; }
  void answer(Reply& to, std::span<const uint8_t> answer) override;

  const CheckFrontOptions& opt;  // the front's
  asio::io_context io_ctx{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::optional<udp::socket> udp_socket;
  // recvmmsg / sendmmsg state, reused for every burst.
  std::vector<uint8_t> udp_in = std::vector<uint8_t>(kUdpBurst * kUdpSlot);
  std::array<std::vector<uint8_t>, kUdpBurst> udp_out;
  std::array<mmsghdr, kUdpBurst> msgs{};
  std::array<mmsghdr, kUdpBurst> replies{};
  std::array<iovec, kUdpBurst> iov_in{};
  std::array<iovec, kUdpBurst> iov_out{};
  std::array<sockaddr_storage, kUdpBurst> peers{};
  Reply udp_reply;               // where the datagram being decided is answered, if later
  std::vector<uint8_t> tcp_out;  // the TCP answer being decided
  WorkerCounters counters;
  std::list<std::weak_ptr<Connection>> connections;  // owned by this worker's thread
  std::optional<asio::steady_timer> tcp_deadlines;   // closes connections past a frame's deadline
  bool stopped = false;                              // this worker's thread only
  // Declared after every Asio object it may use (io_ctx), so it is destroyed before them.
  std::unique_ptr<CheckPath> path;
  std::thread thread;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Worker& w, tcp::socket socket, size_t max_pending)
      : w_(w), socket_(std::move(socket)), max_pending_(max_pending) {
    w_.counters.tcp_open.fetch_add(1, std::memory_order_relaxed);
  }
  ~Connection() { w_.counters.tcp_open.fetch_sub(1, std::memory_order_relaxed); }

  void start() {
    reply_.connection = weak_from_this();
    read();
  }

  // Slow and idle clients (CheckFrontOptions::max_connections, client_timeout_ms). Waiting:
  // nothing of this connection's is being decided or written, since waiting_since() (its last
  // answer, or its start); a connection over the cap closes the longest-waiting one first.
  using Clock = std::chrono::steady_clock;
  bool waiting() const { return reading_ && !writing_ && pending_.empty() && !draining_; }
  Clock::time_point waiting_since() const { return active_; }
  // A frame begun (some of its bytes in) at this time and not finished; max() when none.
  Clock::time_point frame_started() const { return frame_started_; }
  void close_now() {
    draining_ = true;
    close();
  }

  // An answer decided later (forwarded to the key's owner): queued like any other.
  void deliver(std::span<const uint8_t> answer) {
    if (socket_.is_open() && !(draining_ && !writing_ && !reading_)) {
      wire::append_frame(answer, pending_);
      flush();
    }
  }

  // Stop reading; answers already being written still go out, then the socket closes.
  void drain() {
    draining_ = true;
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_receive, ec);
    if (!writing_ && !reading_) close();
  }

 private:
  void read() {
    if (draining_ || paused_ || reading_) return;  // one read at a time
    reading_ = true;
    auto self = shared_from_this();
    socket_.async_read_some(asio::buffer(in_), [this, self](boost::system::error_code ec,
                                                            size_t n) {
      reading_ = false;
      if (ec) {
        draining_ = true;
        if (!writing_) close();
        return;
      }
      frames_.feed({in_.data(), n});
      bool served = false;
      while (!draining_) {
        auto frame = frames_.next();
        if (!frame) break;
        serve(*frame);
        served = true;
      }
      const Clock::time_point now = Clock::now();
      if (served) active_ = now;
      if (frames_.buffered() == 0) {
        frame_started_ = Clock::time_point::max();
      } else if (served || frame_started_ == Clock::time_point::max()) {
        frame_started_ = now;  // the start of a frame still coming in
      }
      if (draining_) {  // a bad frame: answers already queued still go out, then close
        flush();
        if (!writing_) close();
        return;
      }
      if (frames_.failed()) {
        // A length over the limit: the stream cannot be resynchronised. Answer nothing more.
        w_.counters.bad_frames.fetch_add(1, std::memory_order_relaxed);
        spdlog::warn("tcp {}: frame length over {} bytes, closing", peer(), wire::kMaxFrameBytes);
        draining_ = true;
        if (!writing_) close();
        return;
      }
      if (pending_.size() > max_pending_) {
        paused_ = true;  // the writer resumes reading once the backlog is written
      }
      flush();
      read();
    });
  }

  void serve(std::span<const uint8_t> frame) {
    reply_.t0 = Clock::now();
    w_.counters.tcp_requests.fetch_add(1, std::memory_order_relaxed);
    const CheckPath::Outcome o =
        w_.path->decide(frame, wire::kMaxFrameBytes, w_.opt.clock(), w_.tcp_out, reply_);
    if (o == CheckPath::Outcome::kLater) return;  // answered when the owners have
    if (o == CheckPath::Outcome::kDrop) {
      // No id to answer to: the client cannot learn this request failed except by a closed
      // connection, which fails its in-flight requests over at once instead of at its timeout.
      w_.counters.bad_frames.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("tcp {}: a frame that is not a request with an id, closing", peer());
      draining_ = true;
      return;
    }
    if (o == CheckPath::Outcome::kRejected) {
      w_.counters.rejected_requests.fetch_add(1, std::memory_order_relaxed);
    }
    wire::append_frame(w_.tcp_out, pending_);
    w_.counters.record_latency(reply_.t0);
  }

  void flush() {
    if (writing_ || pending_.empty()) return;
    // Most answers fit the socket's send buffer: sent here, at once. An asynchronous write would
    // post its completion, and the worker would poll epoll once more to run it. What does not fit
    // is written asynchronously.
    const ssize_t sent = ::send(socket_.native_handle(), pending_.data(), pending_.size(),
                                MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      draining_ = true;  // a reset or a broken pipe: the client is gone
      pending_.clear();
      if (!reading_) close();
      return;
    }
    const size_t done = sent > 0 ? static_cast<size_t>(sent) : 0;
    if (done == pending_.size()) {
      pending_.clear();
      after_written();
      return;
    }
    writing_ = true;
    writing_buf_.assign(pending_.begin() + static_cast<std::ptrdiff_t>(done), pending_.end());
    pending_.clear();
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(writing_buf_),
                      [this, self](boost::system::error_code ec, size_t) {
                        writing_ = false;
                        if (ec) {
                          draining_ = true;
                          if (!reading_) close();
                          return;
                        }
                        flush();
                        if (!writing_) after_written();
                      });
  }

  // Everything written: a connection paused for its output reads again; a draining one closes.
  void after_written() {
    if (paused_ && pending_.size() <= max_pending_) {
      paused_ = false;
      read();
    }
    if (draining_ && !writing_ && !reading_) close();
  }

  void close() {
    boost::system::error_code ec;
    socket_.close(ec);
  }

  std::string peer() const {
    boost::system::error_code ec;
    const auto ep = socket_.remote_endpoint(ec);
    return ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  Worker& w_;
  tcp::socket socket_;
  size_t max_pending_;
  std::array<uint8_t, 64 * 1024> in_{};
  wire::FrameReader frames_;
  Reply reply_;                       // this connection, for answers decided later
  std::vector<uint8_t> pending_;      // answers not yet handed to the socket
  std::vector<uint8_t> writing_buf_;  // the answers being written
  bool reading_ = false;
  bool writing_ = false;
  bool paused_ = false;
  bool draining_ = false;
  Clock::time_point active_ = Clock::now();
  Clock::time_point frame_started_ = Clock::time_point::max();
};

}  // namespace sluice::front::check
