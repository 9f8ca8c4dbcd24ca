#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include "rls/grpc_h2.h"

#include <nghttp2/nghttp2.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <array>
#include <boost/asio.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

namespace sluice::rls::h2 {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr size_t kReadBytes = 64 * 1024;
constexpr std::string_view kRlsPath =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
constexpr std::string_view kHealthPath = "/grpc.health.v1.Health/Check";

Method method_of(std::string_view path) {
  if (path == kRlsPath) return Method::kShouldRateLimit;
  if (path == kHealthPath) return Method::kHealthCheck;
  return Method::kUnknown;
}

nghttp2_nv nv(std::string_view name, std::string_view value) {
  // Names and values are copied by nghttp2 (no NO_COPY flags): they may be temporaries.
  return {reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
          NGHTTP2_NV_FLAG_NONE};
}

// grpc-message is percent-encoded: bytes outside printable ASCII, and '%' itself.
void percent_encode(std::string_view in, std::string& out) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  out.clear();
  for (const char ch : in) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
}

// nghttp2 allocates for every stream and header block it handles (a few blocks per call); malloc
// and free showed up high under load. Blocks of up to 4 KiB come from size-class free lists of
// the calling thread (a session is only used on its connection's thread; a block freed on another
// thread simply joins that thread's lists), capped so an idle thread keeps at most a few MiB.
class BlockPool {
 public:
  static void* alloc(size_t size) {
    const unsigned c = class_of(size);
    if (c == kLarge) return with_header(std::malloc(size + kHeader), kLarge, size);
    auto& list = lists()[c];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      return p;
    }
    const size_t capacity = size_t{kMin} << c;
    return with_header(std::malloc(capacity + kHeader), c, capacity);
  }
  static void release(void* p) {
    if (p == nullptr) return;
    const auto c = static_cast<unsigned>(header(p).size_class);
    if (c != kLarge) {
      auto& list = lists()[c];
      if (list.size() < kMaxFree) {
        list.push_back(p);
        return;
      }
    }
    std::free(static_cast<char*>(p) - kHeader);
  }
  static void* zeroed(size_t n, size_t size) {
    if (size != 0 && n > SIZE_MAX / size) return nullptr;
    void* p = alloc(n * size);
    if (p != nullptr) std::memset(p, 0, n * size);
    return p;
  }
  static void* resize(void* p, size_t size) {
    if (p == nullptr) return alloc(size);
    const size_t capacity = header(p).capacity;
    if (header(p).size_class != kLarge && size <= capacity) return p;
    void* q = alloc(size);
    if (q == nullptr) return nullptr;
    std::memcpy(q, p, std::min(size, capacity));
    release(p);
    return q;
  }

 private:
  struct Header {
    uint64_t size_class;
    uint64_t capacity;
  };
  static constexpr size_t kHeader = sizeof(Header);  // keeps the block 16-byte aligned
  static constexpr unsigned kMin = 32;               // classes 32 B .. 4 KiB
  static constexpr unsigned kClasses = 8;
  static constexpr unsigned kLarge = 255;
  static constexpr size_t kMaxFree = 1024;  // per class and thread

  static unsigned class_of(size_t size) {
    for (unsigned c = 0; c < kClasses; ++c) {
      if (size <= (size_t{kMin} << c)) return c;
    }
    return kLarge;
  }
  static void* with_header(void* raw, unsigned c, size_t capacity) {
    if (raw == nullptr) return nullptr;
    *static_cast<Header*>(raw) = Header{c, capacity};
    return static_cast<char*>(raw) + kHeader;
  }
  static const Header& header(void* p) {
    return *reinterpret_cast<const Header*>(static_cast<char*>(p) - kHeader);
  }
  // The thread's free blocks, returned to malloc when the thread ends.
  struct Lists : std::array<std::vector<void*>, kClasses> {
    Lists() = default;
    Lists(const Lists&) = delete;
    Lists& operator=(const Lists&) = delete;
    ~Lists() {
      for (auto& list : *this) {
        for (void* p : list)
          std::free(static_cast<char*>(p) - kHeader);
      }
    }
  };
  static Lists& lists() {
    thread_local Lists l;
    return l;
  }
};

nghttp2_mem pooled_mem() {
  nghttp2_mem m{};
  m.malloc = [](size_t size, void*) { return BlockPool::alloc(size); };
  m.free = [](void* p, void*) { BlockPool::release(p); };
  m.calloc = [](size_t n, size_t size, void*) { return BlockPool::zeroed(n, size); };
  m.realloc = [](void* p, size_t size, void*) { return BlockPool::resize(p, size); };
  return m;
}

tcp::endpoint resolve_listen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw std::runtime_error("grpc " + listen + ": expected host:port");
  }
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  asio::io_context io;
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  const auto results = resolver.resolve(host, port, tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    throw std::runtime_error("grpc " + listen + ": cannot resolve (" + ec.message() + ")");
  }
  return results.begin()->endpoint();
}

}  // namespace

// ---- threads ------------------------------------------------------------------------------------

class Conn;

// One thread of the server: its io_context and the connections it serves (touched on it only).
struct Loop {
  asio::io_context io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work{
      asio::make_work_guard(io)};
  std::thread thread;
  std::list<std::shared_ptr<Conn>> conns;
};

// What a Later holds: the connection's loop (kept alive, so a post is always safe) and the
// connection itself, weakly.
struct ConnRef {
  std::shared_ptr<Loop> loop;
  std::weak_ptr<Conn> conn;
};

struct Server::Impl {
  ServerOptions opt;
  CallHandler& handler;
  ServerCounters counters;
  std::vector<std::shared_ptr<Loop>> loops;
  std::optional<tcp::acceptor> acceptor;  // on loops[0]
  size_t next_loop = 0;
  uint16_t port = 0;
  bool started = false, shut = false;
  std::atomic<bool> stopping{false};

  Impl(ServerOptions o, CallHandler& h) : opt(std::move(o)), handler(h) {}
  void accept();
  // On l's thread: closes its oldest connection with no call in flight; false when there is none.
  bool shed_oldest_idle(Loop& l);
};

// ---- one connection -----------------------------------------------------------------------------

class Conn : public std::enable_shared_from_this<Conn> {
 public:
  Conn(Server::Impl& server, std::shared_ptr<Loop> loop, tcp::socket socket)
      : server_(server),
        loop_(std::move(loop)),
        socket_(std::move(socket)),
        handshake_timer_(loop_->io) {}
  ~Conn() {
    if (session_ != nullptr) nghttp2_session_del(session_);
  }

  // On the connection's thread.
  void start() {
    if (!open_session()) {
      close();
      return;
    }
    ref_ = std::make_shared<ConnRef>(ConnRef{loop_, weak_from_this()});
    boost::system::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    handshake_timer_.expires_after(std::chrono::milliseconds(server_.opt.handshake_timeout_ms));
    handshake_timer_.async_wait([self = shared_from_this()](boost::system::error_code e) {
      if (e || self->greeted_ || self->closed_) return;
      self->server_.counters.closed_handshake.fetch_add(1, std::memory_order_relaxed);
      self->close();
    });
    pump();
    read();
  }

  // Ends the connection now (on its thread): calls in flight are dropped.
  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    handshake_timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    server_.counters.open.fetch_sub(1, std::memory_order_relaxed);
    for (auto it = loop_->conns.begin(); it != loop_->conns.end(); ++it) {
      if (it->get() == this) {
        loop_->conns.erase(it);  // may drop the last owner but for the caller's
        break;
      }
    }
  }

  // Shutdown: no new calls; the connection closes once its calls are answered and written.
  void go_away() {
    if (closed_ || going_away_) return;
    going_away_ = true;
    nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(session_), NGHTTP2_NO_ERROR,
                          nullptr, 0);
    pump();
  }

  // No call in flight (none begun, or all answered): it may be closed to make room.
  bool idle() const { return pool_.size() == free_.size(); }

  // A Later's answer, on this thread.
  void finish_later(int32_t id, uint32_t generation, Reply&& reply) {
    if (closed_) return;
    auto* st = static_cast<Stream*>(nghttp2_session_get_stream_user_data(session_, id));
    if (st == nullptr || st->generation != generation || !st->pending) return;
    st->pending = false;
    st->reply = std::move(reply);
    respond(*st);
    pump();
  }

 private:
  // One call (an HTTP/2 stream); pooled per connection, reused.
  struct Stream {
    int32_t id = 0;
    uint32_t generation = 0;
    Method method = Method::kUnknown;
    bool post = false, grpc_type = false;
    bool oversized = false;  // the message is over the bound: discarded as it arrives
    bool pending = false;    // handed to the handler, answered later
    size_t received = 0;     // bytes of the body seen (kept or discarded)
    std::string body;        // the body (prefix and message), up to the bound
    Reply reply;
    std::string out;  // the DATA: prefix and reply.message
    size_t out_pos = 0;
    std::string grpc_message;  // percent-encoded reply.error
  };

  bool open_session() {
    nghttp2_session_callbacks* cb = nullptr;
    if (nghttp2_session_callbacks_new(&cb) != 0) return false;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, &Conn::on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, &Conn::on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, &Conn::on_data);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, &Conn::on_frame);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, &Conn::on_stream_close);
    nghttp2_option* opt = nullptr;
    if (nghttp2_option_new(&opt) != 0) {
      nghttp2_session_callbacks_del(cb);
      return false;
    }
    // No closed streams kept for the RFC 7540 priority tree, which gRPC clients do not use.
    nghttp2_option_set_no_closed_streams(opt, 1);
    static const nghttp2_mem mem = pooled_mem();
    const int rv =
        nghttp2_session_server_new3(&session_, cb, this, opt, const_cast<nghttp2_mem*>(&mem));
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    if (rv != 0) return false;
    const nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, kMaxStreams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1u << 20},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, 16u * 1024},
    };
    return nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, iv, std::size(iv)) == 0;
  }

  // One read at a time. Asio tries the read at once and waits on epoll only when the socket is
  // empty (async_wait would instead re-arm epoll with a system call every time).
  void read() {
    if (closed_ || reading_) return;
    reading_ = true;
    socket_.async_read_some(asio::buffer(rbuf_),
                            [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                              self->reading_ = false;
                              self->on_read(ec, n);
                            });
  }

  void on_read(boost::system::error_code ec, size_t n) {
    if (closed_) return;
    if (ec) {  // end of stream, a reset, or the socket closed
      close();
      return;
    }
    const ssize_t used = nghttp2_session_mem_recv(session_, rbuf_.data(), n);
    if (used < 0) {
      server_.counters.protocol_errors.fetch_add(1, std::memory_order_relaxed);
      spdlog::debug("grpc: closing a connection: {}", nghttp2_strerror(static_cast<int>(used)));
      pump();  // nghttp2 may have a GOAWAY to send; the connection ends either way
      close();
      return;
    }
    pump();
    if (pending_.size() < kMaxPendingOutput) read();
  }

  // Moves what nghttp2 has to send into pending_ and writes it; closes a finished connection.
  void pump() {
    if (closed_) return;
    // Bounded: each pass takes one chunk nghttp2 produced; it stops when there is none.
    for (;;) {
      const uint8_t* data = nullptr;
      const ssize_t n = nghttp2_session_mem_send(session_, &data);
      if (n < 0) {
        server_.counters.protocol_errors.fetch_add(1, std::memory_order_relaxed);
        close();
        return;
      }
      if (n == 0) break;
      pending_.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
    if (!writing_ && !pending_.empty()) {
      // Most output fits the socket's send buffer: sent here, at once. An asynchronous write
      // would post its completion, and the thread would poll epoll once more to run it. What
      // does not fit is written asynchronously.
      const ssize_t sent = ::send(socket_.native_handle(), pending_.data(), pending_.size(),
                                  MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        close();  // a reset or a broken pipe: the peer is gone
        return;
      }
      const size_t done = sent > 0 ? static_cast<size_t>(sent) : 0;
      if (done < pending_.size()) {
        writing_ = true;
        writing_buf_.assign(pending_, done);
        pending_.clear();
        asio::async_write(socket_, asio::buffer(writing_buf_),
                          [self = shared_from_this()](boost::system::error_code ec, size_t) {
                            self->on_written(ec);
                          });
        return;
      }
      pending_.clear();
    }
    if (!writing_ && nghttp2_session_want_read(session_) == 0 &&
        nghttp2_session_want_write(session_) == 0) {
      close();
    }
  }

  void on_written(boost::system::error_code ec) {
    writing_ = false;
    if (closed_) return;
    if (ec) {
      close();
      return;
    }
    writing_buf_.clear();
    pump();
    if (!closed_ && pending_.size() < kMaxPendingOutput) read();
  }

  // ---- nghttp2 callbacks (on this thread, inside mem_recv / mem_send) ---------------------------

  static Conn& self(void* user) { return *static_cast<Conn*>(user); }
  static Stream* stream_of(nghttp2_session* s, int32_t id) {
    return static_cast<Stream*>(nghttp2_session_get_stream_user_data(s, id));
  }

  static int on_begin_headers(nghttp2_session* s, const nghttp2_frame* frame, void* user) {
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    Conn& c = self(user);
    Stream* st = c.take_stream();
    st->id = frame->hd.stream_id;
    nghttp2_session_set_stream_user_data(s, frame->hd.stream_id, st);
    return 0;
  }

  static int on_header(nghttp2_session* s, const nghttp2_frame* frame, const uint8_t* name,
                       size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void*) {
    Stream* st = stream_of(s, frame->hd.stream_id);
    if (st == nullptr || frame->hd.type != NGHTTP2_HEADERS) return 0;
    const std::string_view n(reinterpret_cast<const char*>(name), namelen);
    const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":path") {
      st->method = method_of(v);
    } else if (n == ":method") {
      st->post = v == "POST";
    } else if (n == "content-type") {
      st->grpc_type = v == "application/grpc" || v.starts_with("application/grpc+") ||
                      v.starts_with("application/grpc;");
    }
    return 0;
  }

  static int on_data(nghttp2_session* s, uint8_t, int32_t id, const uint8_t* data, size_t len,
                     void* user) {
    Stream* st = stream_of(s, id);
    if (st == nullptr) return 0;
    st->received += len;
    if (st->oversized) return 0;
    const size_t bound = self(user).server_.opt.max_message_bytes + 5;
    const size_t room = bound - std::min(bound, st->body.size());
    st->body.append(reinterpret_cast<const char*>(data), std::min(len, room));
    // The prefix says how long the message is: past the bound it is refused unread.
    if (st->body.size() >= 5 &&
        declared_length(st->body) > self(user).server_.opt.max_message_bytes) {
      st->oversized = true;
    }
    return 0;
  }

  static int on_frame(nghttp2_session* s, const nghttp2_frame* frame, void* user) {
    Conn& c = self(user);
    if (frame->hd.type == NGHTTP2_SETTINGS && (frame->hd.flags & NGHTTP2_FLAG_ACK) == 0) {
      c.greeted_ = true;
      return 0;
    }
    if ((frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) ||
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) {
      return 0;
    }
    Stream* st = stream_of(s, frame->hd.stream_id);
    if (st != nullptr) c.dispatch(*st);
    return 0;
  }

  static int on_stream_close(nghttp2_session* s, int32_t id, uint32_t, void* user) {
    Stream* st = stream_of(s, id);
    if (st != nullptr) self(user).give_back(st);
    return 0;
  }

  static ssize_t read_out(nghttp2_session* s, int32_t id, uint8_t* buf, size_t length,
                          uint32_t* flags, nghttp2_data_source* source, void*) {
    auto* st = static_cast<Stream*>(source->ptr);
    const size_t n = std::min(length, st->out.size() - st->out_pos);
    std::memcpy(buf, st->out.data() + st->out_pos, n);
    st->out_pos += n;
    if (st->out_pos == st->out.size()) {
      *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
      const nghttp2_nv trailers[] = {nv("grpc-status", "0")};
      if (nghttp2_submit_trailer(s, id, trailers, std::size(trailers)) != 0) {
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
      }
    }
    return static_cast<ssize_t>(n);
  }

  static size_t declared_length(std::string_view body) {
    return (size_t{static_cast<uint8_t>(body[1])} << 24) |
           (size_t{static_cast<uint8_t>(body[2])} << 16) |
           (size_t{static_cast<uint8_t>(body[3])} << 8) | size_t{static_cast<uint8_t>(body[4])};
  }

  // ---- calls
  // --------------------------------------------------------------------------------------

  Stream* take_stream() {
    Stream* st = nullptr;
    if (free_.empty()) {
      pool_.push_back(std::make_unique<Stream>());
      st = pool_.back().get();
    } else {
      st = free_.back();
      free_.pop_back();
    }
    st->generation = ++generation_;
    st->method = Method::kUnknown;
    st->post = st->grpc_type = st->oversized = st->pending = false;
    st->received = 0;
    st->body.clear();
    st->out.clear();
    st->out_pos = 0;
    st->reply.code = Code::kOk;
    st->reply.error.clear();
    st->reply.message.clear();
    return st;
  }

  void give_back(Stream* st) {
    st->generation = ++generation_;  // a Later still out for it no longer matches
    st->pending = false;
    free_.push_back(st);
  }

  // The request of `st` is complete (END_STREAM): answer it, now or later.
  void dispatch(Stream& st) {
    if (!st.post) {
      status_only(st, "405");
      return;
    }
    if (!st.grpc_type) {
      status_only(st, "415");
      return;
    }
    if (st.method == Method::kUnknown) {
      error(st, Code::kUnimplemented, "unknown method");
      return;
    }
    if (st.oversized) {
      server_.handler.on_oversized(st.method, declared_length(st.body), st.reply);
      respond(st);
      return;
    }
    if (st.body.size() < 5 || st.received != st.body.size() ||
        declared_length(st.body) != st.body.size() - 5) {
      error(st, Code::kInternal, "the request is not one length-prefixed gRPC message");
      return;
    }
    if (st.body[0] != 0) {
      error(st, Code::kUnimplemented, "compressed messages are not supported (identity only)");
      return;
    }
    st.pending = true;
    const std::string_view message = std::string_view(st.body).substr(5);
    if (server_.handler.on_call(st.method, message, st.reply, Later(ref_, st.id, st.generation))) {
      st.pending = false;
      respond(st);
    }
  }

  void error(Stream& st, Code code, std::string_view why) {
    st.reply.code = code;
    st.reply.error.assign(why);
    respond(st);
  }

  void status_only(Stream& st, std::string_view status) {
    const nghttp2_nv hdrs[] = {nv(":status", status)};
    nghttp2_submit_response(session_, st.id, hdrs, std::size(hdrs), nullptr);
  }

  // Submits st.reply: HEADERS, DATA and trailers for kOk, else trailers-only.
  void respond(Stream& st) {
    if (st.reply.code == Code::kOk) {
      const auto n = static_cast<uint32_t>(st.reply.message.size());
      st.out.clear();
      st.out.push_back('\0');
      for (int shift = 24; shift >= 0; shift -= 8)
        st.out.push_back(static_cast<char>((n >> shift) & 0xff));
      st.out.append(st.reply.message);
      st.out_pos = 0;
      const nghttp2_nv hdrs[] = {nv(":status", "200"), nv("content-type", "application/grpc")};
      nghttp2_data_provider data{};
      data.source.ptr = &st;
      data.read_callback = &Conn::read_out;
      nghttp2_submit_response(session_, st.id, hdrs, std::size(hdrs), &data);
      return;
    }
    percent_encode(st.reply.error, st.grpc_message);
    const std::string code = std::to_string(static_cast<int>(st.reply.code));
    const nghttp2_nv hdrs[] = {nv(":status", "200"), nv("content-type", "application/grpc"),
                               nv("grpc-status", code), nv("grpc-message", st.grpc_message)};
    const size_t count = st.grpc_message.empty() ? 3 : 4;
    nghttp2_submit_response(session_, st.id, hdrs, count, nullptr);
  }

  Server::Impl& server_;
  std::shared_ptr<Loop> loop_;
  tcp::socket socket_;
  asio::steady_timer handshake_timer_;
  std::shared_ptr<ConnRef> ref_;
  nghttp2_session* session_ = nullptr;
  std::array<uint8_t, kReadBytes> rbuf_;
  std::string pending_, writing_buf_;
  std::vector<std::unique_ptr<Stream>> pool_;
  std::vector<Stream*> free_;
  uint32_t generation_ = 0;
  bool reading_ = false, writing_ = false, closed_ = false, greeted_ = false, going_away_ = false;
};

void Later::finish(Reply reply) const {
  if (!ref_) return;
  asio::post(ref_->loop->io,
             [ref = ref_, id = stream_, gen = generation_, r = std::move(reply)]() mutable {
               if (auto c = ref->conn.lock()) c->finish_later(id, gen, std::move(r));
             });
}

// ---- the server ---------------------------------------------------------------------------------

void Server::Impl::accept() {
  std::shared_ptr<Loop> loop = loops[next_loop];
  next_loop = (next_loop + 1) % loops.size();
  acceptor->async_accept(loop->io, [this, loop](boost::system::error_code ec, tcp::socket socket) {
    if (!acceptor || !acceptor->is_open() || stopping.load()) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      spdlog::warn("grpc: accept: {}", ec.message());
      // EMFILE and the like: retry soon rather than spin.
      auto t = std::make_shared<asio::steady_timer>(loops[0]->io, std::chrono::milliseconds(100));
      t->async_wait([this, t](boost::system::error_code) {
        if (!stopping.load()) accept();
      });
      return;
    }
    counters.connections.fetch_add(1, std::memory_order_relaxed);
    counters.open.fetch_add(1, std::memory_order_relaxed);
    auto conn = std::make_shared<Conn>(*this, loop, std::move(socket));
    asio::post(loop->io, [this, conn, l = loop.get()] {
      // Each thread holds its share of max_connections: one more closes the thread's oldest idle
      // connection (no call in flight: a slow or silent client) to make room, else the new one.
      const size_t share = std::max<size_t>(1, opt.max_connections / loops.size());
      if (l->conns.size() >= share && !shed_oldest_idle(*l)) {
        counters.refused_over_cap.fetch_add(1, std::memory_order_relaxed);
        conn->close();
        return;
      }
      l->conns.push_back(conn);
      conn->start();
    });
    accept();
  });
}

bool Server::Impl::shed_oldest_idle(Loop& l) {
  for (const auto& c : l.conns) {  // oldest first
    if (c->idle()) {
      counters.shed.fetch_add(1, std::memory_order_relaxed);
      auto keep = c;  // close() drops the list's reference
      keep->close();
      return true;
    }
  }
  return false;
}

Server::Server(ServerOptions options, CallHandler& handler)
    : impl_(std::make_unique<Impl>(std::move(options), handler)) {}

Server::~Server() {
  shutdown(0);
}

void Server::start() {
  Impl& m = *impl_;
  const tcp::endpoint ep = resolve_listen(m.opt.listen);
  const unsigned threads = std::max(1u, m.opt.threads);
  for (unsigned i = 0; i < threads; ++i)
    m.loops.push_back(std::make_shared<Loop>());
  m.acceptor.emplace(m.loops[0]->io);
  boost::system::error_code ec;
  m.acceptor->open(ep.protocol(), ec);
  if (!ec) m.acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) m.acceptor->bind(ep, ec);
  if (!ec) m.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    m.acceptor.reset();
    m.loops.clear();
    throw std::runtime_error("grpc " + m.opt.listen + ": cannot listen there (" + ec.message() +
                             ")");
  }
  m.port = m.acceptor->local_endpoint().port();
  m.accept();
  for (auto& loop : m.loops) {
    loop->thread = std::thread([l = loop.get()] {
      // Bounded by the server's life: run() returns once the work guard is reset and the
      // connections are closed.
      for (;;) {
        try {
          l->io.run();
          return;
        } catch (const std::exception& e) {
          spdlog::error("grpc: a handler threw (a bug): {}", e.what());
        }
      }
    });
  }
  m.started = true;
}

uint16_t Server::port() const {
  return impl_->port;
}

const ServerCounters& Server::counters() const {
  return impl_->counters;
}

void Server::shutdown(int64_t grace_ms) {
  Impl& m = *impl_;
  if (!m.started || m.shut) return;
  m.shut = true;
  m.stopping = true;
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  // Step 1: stop accepting, send GOAWAY everywhere.
  asio::post(m.loops[0]->io, [&m] {
    boost::system::error_code ec;
    if (m.acceptor) m.acceptor->close(ec);
  });
  for (auto& loop : m.loops) {
    asio::post(loop->io, [l = loop.get(), &mu, &cv, &done] {
      for (auto& c : std::list<std::shared_ptr<Conn>>(l->conns))
        c->go_away();
      std::lock_guard lock(mu);
      ++done;
      cv.notify_all();
    });
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done == m.loops.size(); });
  }
  // Step 2: connections close by themselves once their calls are answered; wait for that up to
  // the grace period (polled: it is a stop, not a hot path).
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  while (m.counters.open.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Step 3: close the rest, let each thread finish.
  for (auto& loop : m.loops) {
    asio::post(loop->io, [l = loop.get()] {
      for (auto& c : std::list<std::shared_ptr<Conn>>(l->conns))
        c->close();
      l->work.reset();
    });
  }
  asio::post(m.loops[0]->io, [&m] { m.acceptor.reset(); });
  for (auto& loop : m.loops) {
    if (loop->thread.joinable()) loop->thread.join();
  }
}

}  // namespace sluice::rls::h2
