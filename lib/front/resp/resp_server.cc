// The RESP door's server: the acceptor, connections on the connection threads, deadlines.
// resp_front.h has the contract.
#include <utility>  // before Asio: Boost 1.74 with g++ 12 in C++20 needs std::exchange declared

#include "front/resp/resp_front.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <unordered_set>

#include <time.h>

#include "front/common/tcp_listener.h"

namespace sluice::front::resp {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr size_t kReadChunk = 16 * 1024;  // the smallest free room a read is given

// The deadlines' clock: coarse (a few ms), far finer than any deadline here.
int64_t steady_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1'000 + ts.tv_nsec / 1'000'000;
}

class Connection;

}  // namespace

std::string_view close_reason_name(CloseReason r) {
  switch (r) {
    case CloseReason::kClient:
      return "client";
    case CloseReason::kFinished:
      return "finished";
    case CloseReason::kShed:
      return "shed";
    case CloseReason::kFrame:
      return "frame";
    case CloseReason::kWrite:
      return "write";
    case CloseReason::kStop:
      return "stop";
  }
  return "client";
}

struct RespFront::State : std::enable_shared_from_this<RespFront::State> {
  State(asio::io_context& io, std::vector<asio::io_context*> ios_,
        std::vector<std::shared_ptr<Backend>> backends_, FrontOptions opt_)
      : acceptor_io(io),
        ios(std::move(ios_)),
        backends(std::move(backends_)),
        opt(std::move(opt_)),
        acceptor(io),
        retry(io),
        sweep(io),
        session_config(std::make_shared<const Config>(opt.session)) {}

  asio::io_context& acceptor_io;
  const std::vector<asio::io_context*> ios;
  const std::vector<std::shared_ptr<Backend>> backends;
  const FrontOptions opt;
  RespCounters counters;

  // Acceptor thread only.
  tcp::acceptor acceptor;
  asio::steady_timer retry;
  asio::steady_timer sweep;
  size_t next_io = 0;
  bool accepting = false;
  uint16_t port = 0;
  bool loopback = false;

  std::atomic<bool> stopped{false};
  std::atomic<uint64_t> next_client_id{0};
  std::atomic<uint64_t> accepted{0}, accept_errors{0};
  std::array<std::atomic<uint64_t>, kCloseReasons> closed{};
  mutable std::mutex mu;  // guards connections and session_config
  // What a new connection's session is given (opt.session until set_password replaces it); a
  // connection keeps the one it was opened with.
  std::shared_ptr<const Config> session_config;
  std::unordered_set<Connection*> connections;

  void accept();
  void maybe_resume_accept();
  bool shed_oldest_idle();  // under mu
  void arm_sweep();
  void sweep_deadlines();
};

namespace {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<RespFront::State> st, std::shared_ptr<const Config> config,
             tcp::socket socket, asio::io_context& io, Backend& backend)
      : st_(std::move(st)),
        config_(std::move(config)),
        io_(io),
        socket_(std::move(socket)),
        seq_(st_->next_client_id.fetch_add(1) + 1),
        session_(*config_, backend, st_->counters, seq_, [this] { on_wake(); }) {}

  asio::io_context& io() { return io_; }
  uint64_t seq() const { return seq_; }
  // Between commands with nothing in flight: may be shed.
  bool idle() const { return idle_.load(std::memory_order_relaxed); }
  int64_t idle_since() const { return idle_since_.load(std::memory_order_relaxed); }
  // When the unfinished command (or the unwritten reply) began; 0 when none.
  int64_t frame_since() const { return frame_since_.load(std::memory_order_relaxed); }
  int64_t write_since() const { return write_since_.load(std::memory_order_relaxed); }

  ~Connection() {
    std::lock_guard g(st_->mu);
    st_->connections.erase(this);  // closed before, in every path but an io_context torn down
  }

  void start() {
    self_ = shared_from_this();
    socket_.non_blocking(true);
    in_.resize(kReadChunk * 2);
    mark_idle();
    read();
  }

  void close(CloseReason why) {
    if (closed_) return;
    closed_ = true;
    const std::shared_ptr<Connection> keep = std::move(self_);  // alive to the end of this call
    boost::system::error_code ignored;
    socket_.close(ignored);
    bool counted = false;
    {
      std::lock_guard g(st_->mu);
      counted = st_->connections.erase(this) > 0;  // shed: already out, counted by the shedder
    }
    if (counted) st_->closed[static_cast<size_t>(why)].fetch_add(1, std::memory_order_relaxed);
    if (counted) asio::post(st_->acceptor_io, [st = st_] { st->maybe_resume_accept(); });
  }

  // The sweep's verdict, on this thread: still late?
  void expire(bool write, int64_t since) {
    if (closed_) return;
    if (write && write_since() == since) return close(CloseReason::kWrite);
    if (!write && frame_since() == since) return close(CloseReason::kFrame);
  }

  // stop(): close once what was asked is answered.
  void stop() {
    stopping_ = true;
    if (!closed_ && session_.awaited() == 0 && !writing_ && session_.output().empty()) {
      close(CloseReason::kStop);
    }
  }

 private:
  void read() {
    if (reading_ || closed_ || stopping_ || !session_.wants_input()) return;
    if (begin_ > 0 && in_.size() - end_ < kReadChunk) {
      std::memmove(in_.data(), in_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (in_.size() - end_ < kReadChunk) in_.resize(end_ + kReadChunk);
    reading_ = true;
    socket_.async_read_some(asio::buffer(in_.data() + end_, in_.size() - end_),
                            [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                              self->reading_ = false;
                              if (self->closed_) return;
                              if (ec) return self->close(CloseReason::kClient);
                              self->end_ += n;
                              self->process();
                            });
  }

  void process() {
    idle_.store(false, std::memory_order_relaxed);
    const size_t used = session_.feed(std::string_view(in_.data() + begin_, end_ - begin_));
    begin_ += used;
    if (begin_ == end_) begin_ = end_ = 0;
    // A command started and not finished: its deadline runs while the session reads on, from
    // when the last whole command was consumed.
    if (begin_ < end_ && session_.wants_input()) {
      if (used > 0 || frame_since() == 0) {
        frame_since_.store(steady_ms(), std::memory_order_relaxed);
      }
    } else {
      frame_since_.store(0, std::memory_order_relaxed);
    }
    advance();
  }

  // Answers filled later: write them, and read on if the session had stopped reading.
  void on_wake() {
    if (in_advance_ || closed_) return;
    advance();
  }

  void advance() {
    in_advance_ = true;
    if (!writing_ && !session_.output().empty()) write();
    in_advance_ = false;
    if (closed_) return;
    if (!writing_ && session_.output().empty()) {
      if (session_.finished()) {
        boost::system::error_code ignored;
        socket_.shutdown(tcp::socket::shutdown_send, ignored);
        return close(CloseReason::kFinished);
      }
      if (stopping_ && session_.awaited() == 0) return close(CloseReason::kStop);
      if (session_.awaited() == 0 && begin_ == end_) mark_idle();
    }
    // Input consumed while the session was paused waits in the buffer: feed it first.
    if (!reading_ && begin_ < end_ && session_.wants_input() && frame_since() == 0 &&
        !session_.closing()) {
      return asio::post(io_, [self = shared_from_this()] {
        if (!self->closed_) self->process();
      });
    }
    read();
  }

  void mark_idle() {
    idle_since_.store(steady_ms(), std::memory_order_relaxed);
    idle_.store(true, std::memory_order_relaxed);
  }

  // Sends the session's output: at once when the socket takes it all, else the rest
  // asynchronously.
  void write() {
    sending_.swap(session_.output());
    session_.output().clear();
    boost::system::error_code ec;
    const size_t n = socket_.write_some(asio::buffer(sending_), ec);
    if (!ec && n == sending_.size()) {
      sending_.clear();
      return;
    }
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
      sending_.clear();
      return close(CloseReason::kClient);
    }
    sending_.erase(0, ec ? 0 : n);
    writing_ = true;
    write_since_.store(steady_ms(), std::memory_order_relaxed);
    asio::async_write(socket_, asio::buffer(sending_),
                      [self = shared_from_this()](boost::system::error_code wec, size_t) {
                        self->writing_ = false;
                        self->sending_.clear();
                        self->write_since_.store(0, std::memory_order_relaxed);
                        if (self->closed_) return;
                        if (wec) return self->close(CloseReason::kClient);
                        self->advance();
                      });
  }

  std::shared_ptr<RespFront::State> st_;
  std::shared_ptr<const Config> config_;  // the session's; outlives it
  // The connection holds itself from start() to close(): while it awaits answers it has no
  // operation of its own pending, and the front's set holds plain pointers.
  std::shared_ptr<Connection> self_;
  asio::io_context& io_;
  tcp::socket socket_;
  const uint64_t seq_;  // the client id, and the order of acceptance
  RespSession session_;

  std::vector<char> in_;  // [begin_, end_) read and not consumed
  size_t begin_ = 0, end_ = 0;
  std::string sending_;
  bool reading_ = false;
  bool writing_ = false;
  bool closed_ = false;
  bool stopping_ = false;
  bool in_advance_ = false;
  std::atomic<bool> idle_{false};
  std::atomic<int64_t> idle_since_{0}, frame_since_{0}, write_since_{0};
};

}  // namespace

// ---- accepting and deadlines -------------------------------------------------------------------

void RespFront::State::accept() {
  accepting = true;
  const size_t i = next_io++ % ios.size();
  asio::io_context& io = *ios[i];
  acceptor.async_accept(
      io, [st = shared_from_this(), &io, i](boost::system::error_code ec, tcp::socket socket) {
        st->accepting = false;
        if (st->stopped.load()) return;
        if (ec) {
          if (ec == asio::error::operation_aborted) return;
          ++st->accept_errors;  // out of descriptors and the like: retry soon rather than spin
          retry_accept_later(st->retry, [st] { st->maybe_resume_accept(); });
          return;
        }
        boost::system::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        std::shared_ptr<const Config> config;
        {
          std::lock_guard g(st->mu);
          config = st->session_config;
        }
        auto c = std::make_shared<Connection>(st, std::move(config), std::move(socket), io,
                                              *st->backends[i]);
        ++st->accepted;
        {
          std::lock_guard g(st->mu);
          if (st->connections.size() >= st->opt.max_connections) st->shed_oldest_idle();
          st->connections.insert(c.get());
        }
        asio::post(io, [c] { c->start(); });
        st->maybe_resume_accept();
      });
}

void RespFront::State::maybe_resume_accept() {
  if (stopped.load() || accepting) return;
  bool room = false;
  {
    std::lock_guard g(mu);
    room = connections.size() < opt.max_connections;
    for (const Connection* c : connections)
      room = room || c->idle();
  }
  if (room) accept();
}

bool RespFront::State::shed_oldest_idle() {
  Connection* oldest = nullptr;
  for (Connection* c : connections) {
    if (!c->idle()) continue;
    if (oldest == nullptr || c->idle_since() < oldest->idle_since() ||
        (c->idle_since() == oldest->idle_since() && c->seq() < oldest->seq())) {
      oldest = c;
    }
  }
  if (oldest == nullptr) return false;
  closed[static_cast<size_t>(CloseReason::kShed)].fetch_add(1, std::memory_order_relaxed);
  connections.erase(oldest);  // no longer open; its thread closes it
  asio::post(oldest->io(), [weak = oldest->weak_from_this()] {
    if (auto c = weak.lock()) c->close(CloseReason::kShed);
  });
  return true;
}

void RespFront::State::arm_sweep() {
  const int64_t every = std::clamp<int64_t>(opt.client_timeout_ms / 4, 1, 1'000);
  sweep.expires_after(std::chrono::milliseconds(every));
  sweep.async_wait([st = shared_from_this()](boost::system::error_code ec) {
    if (ec || st->stopped.load()) return;
    st->sweep_deadlines();
    st->arm_sweep();
  });
}

void RespFront::State::sweep_deadlines() {
  const int64_t now = steady_ms();
  std::lock_guard g(mu);
  for (Connection* c : connections) {
    const int64_t frame = c->frame_since(), write = c->write_since();
    const bool write_late = write != 0 && now - write > kWriteTimeoutMs;
    const bool frame_late = frame != 0 && now - frame > opt.client_timeout_ms;
    if (!write_late && !frame_late) continue;
    asio::post(c->io(),
               [weak = c->weak_from_this(), write_late, since = write_late ? write : frame] {
                 if (auto conn = weak.lock()) conn->expire(write_late, since);
               });
  }
}

// ---- RespFront ---------------------------------------------------------------------------------

RespFront::RespFront(asio::io_context& acceptor_io,
                     std::vector<asio::io_context*> connection_threads,
                     std::vector<std::shared_ptr<Backend>> backends, FrontOptions options) {
  if (connection_threads.empty() || backends.size() != connection_threads.size()) {
    throw std::invalid_argument("RespFront: one backend per connection thread needed");
  }
  const std::string listen = options.listen;
  state_ = std::make_shared<State>(acceptor_io, std::move(connection_threads), std::move(backends),
                                   std::move(options));
  const tcp::endpoint ep = open_listener(state_->acceptor, listen, "RESP");
  state_->port = ep.port();
  state_->loopback = ep.address().is_loopback();
  state_->accept();
  state_->arm_sweep();
}

RespFront::~RespFront() {
  stop();
}

uint16_t RespFront::port() const {
  return state_->port;
}

bool RespFront::loopback() const {
  return state_->loopback;
}

void RespFront::stop() {
  State& st = *state_;
  if (st.stopped.exchange(true)) return;
  boost::system::error_code ec;
  st.acceptor.close(ec);
  st.retry.cancel();
  st.sweep.cancel();
  std::lock_guard g(st.mu);
  for (Connection* c : st.connections) {
    asio::post(c->io(), [weak = c->weak_from_this()] {
      if (auto conn = weak.lock()) conn->stop();
    });
  }
}

FrontStats RespFront::stats() const {
  const State& st = *state_;
  FrontStats s;
  s.accepted = st.accepted.load();
  s.accept_errors = st.accept_errors.load();
  for (size_t i = 0; i < kCloseReasons; ++i)
    s.closed[i] = st.closed[i].load();
  std::lock_guard g(st.mu);
  s.open = st.connections.size();
  return s;
}

void RespFront::set_password(std::string password) {
  State& st = *state_;
  auto config = std::make_shared<Config>(st.opt.session);
  config->password = std::move(password);
  std::lock_guard g(st.mu);
  st.session_config = std::move(config);
}

const RespCounters& RespFront::counters() const {
  return state_->counters;
}

}  // namespace sluice::front::resp
