// The admin front's server: the acceptor on the admin io_context, connections on the connection
// threads, the route table, and the deadlines. admin_front.h has the contract.
#include <utility>  // before Asio: Boost 1.74 with g++ 12 in C++20 needs std::exchange declared

#include "front/admin/admin_front.h"

#include <spdlog/spdlog.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <unordered_set>

#include <time.h>

#include "front/admin/metrics_text.h"
#include "front/admin/request_parser.h"
#include "front/common/tcp_listener.h"

namespace sluice::front::admin {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

// Writing an answer: a client that does not read it within this is gone.
constexpr auto kWriteTimeout = std::chrono::seconds(30);
constexpr size_t kReadChunk = 16 * 1024;   // the smallest free room a read is given
constexpr size_t kFlushBytes = 64 * 1024;  // pipelined answers are written once this much waits

std::string_view reason(unsigned status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 409:
      return "Conflict";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "<unknown-status>";
  }
}

void append_number(std::string& out, uint64_t n) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, n);
  out.append(buf, static_cast<size_t>(r.ptr - buf));
}

// The status line, headers and body of `r`, always with a Content-Length (0 on a 204, as nginx's
// auth_request and every client accept).
void append_answer(std::string& out, const Reply& r, bool close) {
  out += "HTTP/1.1 ";
  append_number(out, r.status);
  out += ' ';
  out += reason(r.status);
  out += "\r\n";
  if (!r.content_type.empty()) {
    out += "Content-Type: ";
    out += r.content_type;
    out += "\r\n";
  }
  out += r.headers;
  out += "Content-Length: ";
  append_number(out, r.body.size());
  out += "\r\n";
  if (close) out += "Connection: close\r\n";
  out += "\r\n";
  out += r.body;
}

// The deadlines' clock: CLOCK_MONOTONIC_COARSE (a tick of a few ms, read without a timer
// instruction), far finer than any client_timeout_ms. Connections that began to wait in the same
// tick are told apart by their connection order (shed_oldest_idle).
int64_t steady_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

class Connection;

}  // namespace

// ---- Request and Reply -------------------------------------------------------------------------

std::optional<std::string_view> Request::header(std::string_view name) const {
  for (const Header& h : headers) {
    if (iequals(h.name, name)) return h.value;
  }
  return std::nullopt;
}

size_t Request::count(std::string_view name) const {
  size_t n = 0;
  for (const Header& h : headers)
    n += iequals(h.name, name) ? 1u : 0u;
  return n;
}

void Reply::add_header(std::string_view name, std::string_view value) {
  headers += name;
  headers += ": ";
  headers += value;
  headers += "\r\n";
}

void Reply::json_error(unsigned s, std::string_view message) {
  status = s;
  content_type = "application/json";
  body = nlohmann::json{{"error", message}}.dump();
  body += '\n';
}

void Reply::clear() {
  status = 200;
  content_type = {};
  body.clear();
  headers.clear();
  close = false;
}

// ---- shared state ------------------------------------------------------------------------------

struct AdminFront::State : std::enable_shared_from_this<AdminFront::State> {
  State(asio::io_context& admin_, std::vector<asio::io_context*> ios_, Options opt_,
        Backend backend_, std::vector<Route> routes_)
      : admin(admin_),
        ios(std::move(ios_)),
        opt(std::move(opt_)),
        backend(std::move(backend_)),
        routes(std::move(routes_)),
        acceptor(admin_),
        retry(admin_),
        sweep(admin_) {}

  asio::io_context& admin;
  const std::vector<asio::io_context*> ios;
  const Options opt;
  const Backend backend;
  const std::vector<Route> routes;

  // Admin thread only.
  tcp::acceptor acceptor;
  asio::steady_timer retry;  // backs off after an accept error (e.g. out of descriptors)
  asio::steady_timer sweep;  // closes connections past their deadlines
  size_t next_io = 0;
  uint64_t next_seq = 0;   // Connection::seq
  bool accepting = false;  // an async_accept is pending
  uint16_t port = 0;
  bool loopback = false;

  std::atomic<bool> stopped{false};
  std::atomic<bool> accept_paused{false};  // at max_connections with none waiting
  mutable std::mutex mu;                   // guards connections and admin_open
  std::unordered_set<Connection*> connections;
  bool admin_open = true;  // requests may still be handed to the admin thread

  std::atomic<uint64_t> accept_errors{0};
  std::atomic<uint64_t> internal_errors{0};  // answered 500: a handler threw
  // Closed before the client was done (docs/operations.md, slow clients).
  std::atomic<uint64_t> closed_shed{0}, closed_idle{0}, closed_header{0}, closed_body{0};

  // The row for `method` and `path`; nullptr with `path_known` false (404), or true with `allow`
  // the methods its rows take (405).
  const Route* find(std::string_view method, std::string_view path, bool& path_known,
                    std::string& allow) const;

  void accept();
  void maybe_resume_accept();
  bool any_waiting() const;  // under mu
  bool shed_oldest_idle();   // under mu
  void arm_sweep();
  void sweep_deadlines();
};

namespace {

bool path_matches(std::string_view pattern, std::string_view path) {
  if (pattern.size() >= 2 && pattern.substr(pattern.size() - 2) == "/*") {
    return path.starts_with(pattern.substr(0, pattern.size() - 1));
  }
  return pattern == path;
}

bool is_prefix(std::string_view pattern) {
  return pattern.size() >= 2 && pattern.substr(pattern.size() - 2) == "/*";
}

}  // namespace

const Route* AdminFront::State::find(std::string_view method, std::string_view path,
                                     bool& path_known, std::string& allow) const {
  path_known = false;
  // Exact rows first; prefix rows take what no exact row names.
  for (const bool prefix : {false, true}) {
    for (const Route& r : routes) {
      if (is_prefix(r.path) != prefix || !path_matches(r.path, path)) continue;
      if (r.method == method) return &r;
      path_known = true;
    }
    if (path_known) break;
  }
  if (!path_known) return nullptr;
  for (const bool prefix : {false, true}) {
    for (const Route& r : routes) {
      if (is_prefix(r.path) != prefix || !path_matches(r.path, path)) continue;
      if (allow.find(r.method) != std::string::npos) continue;
      if (!allow.empty()) allow += ", ";
      allow += r.method;
    }
    if (!allow.empty()) break;
  }
  return nullptr;
}

namespace {

// ---- one connection ----------------------------------------------------------------------------

// Lives on its io_context's thread; the admin thread reads phase_ and since_ns_ (atomics) to pick
// a connection to shed or to close past its deadline, and posts the closing to this thread.
class Connection final : public std::enable_shared_from_this<Connection>, public Later {
 public:
  enum Phase : uint8_t { kWaitHead, kWaitBody, kBusy, kWriting, kClosed };

  Connection(std::shared_ptr<AdminFront::State> st, tcp::socket socket, asio::io_context& io)
      : st_(std::move(st)), io_(io), socket_(std::move(socket)), seq_(st_->next_seq++) {}
  ~Connection() {
    bool resume = false;
    {
      std::lock_guard g(st_->mu);
      st_->connections.erase(this);
      resume = st_->accept_paused.load();
    }
    if (resume) asio::post(st_->admin, [st = st_] { st->maybe_resume_accept(); });
  }

  void start() {
    boost::system::error_code ec;
    socket_.non_blocking(true, ec);  // write() tries a plain send first
    in_.resize(kReadChunk);
    begin_waiting();
    process();
  }

  asio::io_context& io() { return io_; }

  // Admin thread, under the state's mutex.
  Phase phase() const { return phase_.load(std::memory_order_relaxed); }
  int64_t since_ns() const { return since_ns_.load(std::memory_order_relaxed); }
  uint64_t seq() const { return seq_; }
  bool waiting() const { return phase() == kWaitHead || phase() == kWaitBody; }

  // On this connection's thread.
  void close() {
    phase_.store(kClosed, std::memory_order_relaxed);
    hold_.reset();
    pending_work_.reset();
    boost::system::error_code ec;
    socket_.close(ec);
  }
  void close_if_idle() {
    if (waiting()) close();
  }
  // Posted by the admin thread's sweep: closes when the connection is still where it was.
  void expire(Phase phase, int64_t since) {
    if (phase_.load() != phase || since_ns_.load() != since) return;
    if (phase == kWaitBody) {
      ++st_->closed_body;
    } else if (phase == kWaitHead) {
      ++(end_ > begin_ ? st_->closed_header : st_->closed_idle);
    }
    close();
  }

  std::function<void(Reply&&)> take() override {
    defer();
    return finisher();
  }

  // Hands an answer back to this connection's thread (any thread).
  std::function<void(Reply&&)> finisher() {
    return [weak = weak_from_this(), &io = io_](Reply&& r) {
      asio::post(io, [weak, r = std::move(r)]() mutable {
        if (auto c = weak.lock()) c->finish(std::move(r));
      });
    };
  }

 private:
  // The answer comes later (finish): the connection stays alive for it, and so does its thread's
  // io_context (a stopping node's workers run until every such answer is written).
  void defer() {
    taken_ = true;
    hold_ = shared_from_this();
    pending_work_.emplace(io_.get_executor());
  }

  // A phase with a deadline starts its clock; kBusy has none.
  void set_phase(Phase p) {
    if (p != kBusy) since_ns_.store(steady_ns(), std::memory_order_relaxed);
    phase_.store(p, std::memory_order_relaxed);
  }
  // The next request's head is awaited; its clock starts when the connection waits for it
  // (read()), not while answers are written or pipelined requests are served from the buffer.
  void begin_waiting() {
    in_head_ = true;
    in_body_ = false;
    continue_sent_ = false;
    stamp_wait_ = true;
  }

  void read() {
    // A stopping front closes a connection once it waits for a new request (stop() closed those
    // that waited then).
    if (st_->stopped.load() && in_head_ && begin_ == end_) return close();
    // Waiting for (the rest of) a head or a body: since the wait began, not since this read.
    if (stamp_wait_) {
      stamp_wait_ = false;
      set_phase(in_body_ ? kWaitBody : kWaitHead);
    } else {
      phase_.store(in_body_ ? kWaitBody : kWaitHead, std::memory_order_relaxed);
    }
    if (begin_ == end_) {
      begin_ = end_ = 0;
    } else if (in_.size() - end_ < kReadChunk && begin_ > 0) {
      compact();
    }
    if (in_.size() - end_ < kReadChunk) {
      in_.resize(end_ + kReadChunk);
      head_stale_ = in_body_;
    }
    socket_.async_read_some(asio::buffer(in_.data() + end_, in_.size() - end_),
                            [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                              self->on_read(ec, n);
                            });
  }

  void on_read(boost::system::error_code ec, size_t n) {
    if (ec) return close();  // closed, reset, shed, or past its deadline: nothing to answer
    if (phase_.load(std::memory_order_relaxed) == kClosed) return;
    end_ += n;
    process();
  }

  // Answers every complete request in the buffer (in order), then writes, or reads for more.
  void process() {
    while (!out_full()) {
      const std::string_view data(in_.data() + begin_, end_ - begin_);
      if (in_head_) {
        std::string_view error;
        const ParseStatus s = parse_head(data, head_, error);
        if (s == ParseStatus::kIncomplete) break;
        if (s != ParseStatus::kDone) return refuse(s, error);
        in_head_ = false;
        in_body_ = true;
        body_.clear();
        chunked_.reset();
        chunk_pos_ = head_.bytes;
        stamp_wait_ = true;  // the body's own deadline
      }
      if (in_body_ && !body_complete(data)) {
        if (refused_) return;
        // curl and others wait for "100 Continue" before they send a larger body.
        if (head_.expect_continue && !continue_sent_) {
          continue_sent_ = true;
          out_ += "HTTP/1.1 100 Continue\r\n\r\n";
          stamp_wait_ = true;  // the body's deadline starts once the client is told to send it
        }
        break;
      }
      in_body_ = false;
      const size_t request_bytes = head_.chunked ? chunk_pos_ : head_.bytes + head_.content_length;
      const bool deferred = dispatch(data.substr(0, request_bytes));
      begin_ += request_bytes;
      if (deferred || phase_.load() == kClosed) break;
      if (close_after_) return write();
      begin_waiting();
    }
    if (phase_.load() == kClosed || taken_) {
      if (!out_.empty() && phase_.load() != kClosed) write();
      return;
    }
    if (!out_.empty()) return write();
    read();
  }

  // Moves the unread bytes to the front. The head's views move with them: parsed again before use.
  void compact() {
    std::memmove(in_.data(), in_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
    head_stale_ = in_body_;
  }

  bool out_full() const { return out_.size() >= kFlushBytes; }

  // Whether the body is in; a chunked one is decoded into body_ as it comes.
  bool body_complete(std::string_view data) {
    if (!head_.chunked) {
      if (data.size() >= head_.bytes + head_.content_length) return true;
      // Room for the whole body (at most kMaxBodyBytes past the head).
      const size_t need = begin_ + head_.bytes + head_.content_length;
      if (in_.size() < need + kReadChunk && begin_ > 0) compact();
      return false;
    }
    size_t consumed = 0;
    std::string_view error;
    const ParseStatus s = chunked_.feed(data.substr(chunk_pos_), body_, consumed, error);
    chunk_pos_ += consumed;
    if (s == ParseStatus::kDone) return true;
    if (s != ParseStatus::kIncomplete) refuse(s, error);  // sets refused_
    // Chunk data is copied out: the bytes consumed need no room any more. Keep the head (the
    // request's views point into it) and what follows.
    return false;
  }

  // A request that cannot be served: its answer, then the connection closes.
  void refuse(ParseStatus s, std::string_view error) {
    reply_.clear();
    if (s == ParseStatus::kHeadTooLarge) {
      reply_.json_error(431,
                        "request header larger than " + std::to_string(kMaxHeaderBytes) + " bytes");
    } else if (s == ParseStatus::kBodyTooLarge) {
      reply_.json_error(413, "body larger than " + std::to_string(kMaxBodyBytes) + " bytes");
    } else {
      reply_.json_error(400, "malformed HTTP request: " + std::string(error));
    }
    append_answer(out_, reply_, true);
    close_after_ = true;
    refused_ = true;
    in_head_ = in_body_ = false;
    write();
  }

  // Routes one request and answers it, or hands it on; true when its answer comes later.
  bool dispatch(std::string_view raw) {
    if (head_stale_) {
      std::string_view ignored;
      parse_head(raw, head_, ignored);  // parsed whole before: the same head, at its new place
      head_stale_ = false;
    }
    const std::string_view target = head_.target;
    const size_t q = target.find('?');
    Request req;
    req.method = head_.method;
    req.target = target;
    req.path = target.substr(0, q);
    req.query = q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
    req.headers = head_.headers;
    req.body = head_.chunked ? std::string_view(body_) : raw.substr(head_.bytes);
    reply_.clear();
    keep_alive_ = head_.keep_alive;
    taken_ = false;
    set_phase(kBusy);

    bool path_known = false;
    allow_.clear();
    const Route* route = st_->find(req.method, req.path, path_known, allow_);
    const Access access =
        route != nullptr ? route->access : st_->backend.access_of(req.method, req.path);
    if (access != Access::kOpen && !authorized(req, access)) return answer_now();
    if (route == nullptr) {
      if (path_known) {
        reply_.add_header("Allow", allow_);
        reply_.json_error(405, "method not allowed");
      } else {
        reply_.json_error(404, "not found");
      }
      return answer_now();
    }
    if (route->runs == Runs::kAdminThread) return hand_to_admin(*route, req);
    try {
      route->handler(req, reply_, *this);
    } catch (const std::exception& e) {
      failed(req, e);
      if (taken_) return true;  // the answer is on its way
      reply_.clear();
      reply_.close = true;
      reply_.json_error(500, "internal error");
    }
    if (taken_) return true;
    return answer_now();
  }

  bool authorized(const Request& req, Access access) {
    const AuthVerdict v =
        st_->backend.authorize(access, req.header("authorization"), req.count("authorization"));
    if (v.allowed) return true;
    if (v.challenge) reply_.add_header("WWW-Authenticate", "Bearer");
    reply_.json_error(v.status, v.message);
    return false;
  }

  void failed(const Request& req, const std::exception& e) {
    ++st_->internal_errors;
    spdlog::error("admin HTTP: {} {} failed: {}", req.method, req.target, e.what());
  }

  bool answer_now() {
    const bool close = reply_.close || !keep_alive_ || st_->stopped.load();
    append_answer(out_, reply_, close);
    close_after_ = close;
    return false;
  }

  // The request, copied, to the admin thread; its answer comes back through finish().
  bool hand_to_admin(const Route& route, const Request& req) {
    struct Owned {
      std::string method, target, body;
      std::vector<std::pair<std::string, std::string>> headers;
    };
    auto owned = std::make_shared<Owned>();
    owned->method = req.method;
    owned->target = req.target;
    owned->body = req.body;
    for (const Header& h : req.headers)
      owned->headers.emplace_back(h.name, h.value);
    {
      std::lock_guard g(st_->mu);
      if (st_->admin_open) {
        defer();
        asio::post(st_->admin, [st = st_, &route, owned, done = finisher()] {
          run_on_admin(*st, route, owned->method, owned->target, owned->body, owned->headers, done);
        });
        return true;
      }
    }
    reply_.close = true;
    reply_.json_error(503, "the node is stopping");
    return answer_now();
  }

  static void run_on_admin(AdminFront::State& st, const Route& route, std::string_view method,
                           std::string_view target, std::string_view body,
                           const std::vector<std::pair<std::string, std::string>>& fields,
                           const std::function<void(Reply&&)>& done) {
    std::vector<Header> headers;
    headers.reserve(fields.size());
    for (const auto& [n, v] : fields)
      headers.push_back({n, v});
    const size_t q = target.find('?');
    Request req{method,
                target,
                target.substr(0, q),
                q == std::string_view::npos ? std::string_view() : target.substr(q + 1),
                headers,
                body};
    struct AdminLater final : Later {
      const std::function<void(Reply&&)>* done = nullptr;
      bool taken = false;
      std::function<void(Reply&&)> take() override {
        taken = true;
        return *done;
      }
    } later;
    later.done = &done;
    Reply reply;
    try {
      route.handler(req, reply, later);
    } catch (const std::exception& e) {
      ++st.internal_errors;
      spdlog::error("admin HTTP: {} {} failed: {}", method, target, e.what());
      if (later.taken) return;
      reply.clear();
      reply.close = true;
      reply.json_error(500, "internal error");
    }
    if (!later.taken) done(std::move(reply));
  }

  // A deferred answer is back.
  void finish(Reply&& r) {
    const auto self = std::move(hold_);  // alive to the end of this call
    pending_work_.reset();
    taken_ = false;
    if (phase_.load() == kClosed) return;
    const bool close = r.close || !keep_alive_ || st_->stopped.load();
    append_answer(out_, r, close);
    close_after_ = close;
    if (!close) begin_waiting();
    write();
  }

  // Sends what is in out_: at once when the socket takes it all (the usual case: an answer is
  // small), else the rest asynchronously.
  void write() {
    if (writing_) return;
    sending_.swap(out_);
    boost::system::error_code ec;
    const size_t n = socket_.write_some(asio::buffer(sending_), ec);
    if (!ec && n == sending_.size()) {
      sending_.clear();
      return on_written();
    }
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
      sending_.clear();
      return close();
    }
    sending_.erase(0, ec ? 0 : n);
    writing_ = true;
    set_phase(kWriting);
    asio::async_write(socket_, asio::buffer(sending_),
                      [self = shared_from_this()](boost::system::error_code wec, size_t) {
                        self->writing_ = false;
                        self->sending_.clear();
                        if (wec || self->phase_.load() == kClosed) return self->close();
                        self->on_written();
                      });
  }

  void on_written() {
    if (phase_.load() == kClosed) return;
    if (!out_.empty()) return write();  // answered meanwhile (a deferred answer)
    if (close_after_) {
      boost::system::error_code ignored;
      socket_.shutdown(tcp::socket::shutdown_send, ignored);
      return close();
    }
    if (taken_) return set_phase(kBusy);  // a deferred answer is still to come
    if (begin_ < end_) return process();  // pipelined requests wait in the buffer
    // Nothing buffered: the next read goes after the handlers already due on this thread (the
    // other connections' answers), so it finds the client's next request more often than not,
    // where a read now would find nothing and cost a system call for it.
    asio::post(io_, [self = shared_from_this()] {
      if (self->phase_.load() != kClosed) self->process();
    });
  }

  std::shared_ptr<AdminFront::State> st_;
  asio::io_context& io_;
  tcp::socket socket_;
  std::atomic<Phase> phase_{kWaitHead};
  std::atomic<int64_t> since_ns_{0};
  const uint64_t seq_;  // order of acceptance

  std::vector<char> in_;  // [begin_, end_) unread
  size_t begin_ = 0, end_ = 0;
  Head head_;
  bool in_head_ = true;   // waiting for (the rest of) a request's head
  bool in_body_ = false;  // the head is in; waiting for the body
  bool continue_sent_ = false;
  bool stamp_wait_ = true;   // a wait begins: read() starts its clock
  bool head_stale_ = false;  // the buffer moved under head_'s views
  bool refused_ = false;     // a malformed request was answered: the connection closes
  std::string body_;         // a chunked request's body, decoded
  ChunkedDecoder chunked_;
  size_t chunk_pos_ = 0;  // chunked: bytes of the request consumed, head included

  Reply reply_;
  std::string allow_;
  std::string out_;      // answers to write, in request order
  std::string sending_;  // answers being written
  bool writing_ = false;
  bool keep_alive_ = true;
  bool close_after_ = false;
  bool taken_ = false;                // a handler took the answer (Later): it comes via finish()
  std::shared_ptr<Connection> hold_;  // alive while a deferred answer is to come
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> pending_work_;
};

}  // namespace

// ---- accepting and deadlines -------------------------------------------------------------------

void AdminFront::State::accept() {
  accepting = true;
  asio::io_context& io = *ios[next_io++ % ios.size()];
  acceptor.async_accept(
      io, [st = shared_from_this(), &io](boost::system::error_code ec, tcp::socket socket) {
        st->accepting = false;
        if (st->stopped.load()) return;
        if (ec) {
          if (ec == asio::error::operation_aborted) return;
          // Out of descriptors and the like: retry soon rather than spin.
          ++st->accept_errors;
          retry_accept_later(st->retry, [st] { st->maybe_resume_accept(); });
          return;
        }
        boost::system::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        auto c = std::make_shared<Connection>(st, std::move(socket), io);
        {
          // At the cap, the connection that has waited longest for a request makes room. With none
          // waiting (all busy) this one is served all the same, and accepting pauses below until a
          // connection closes: at most one over the cap.
          std::lock_guard g(st->mu);
          if (st->connections.size() >= st->opt.max_connections) st->shed_oldest_idle();
          st->connections.insert(c.get());
        }
        asio::post(io, [c] { c->start(); });
        st->maybe_resume_accept();
      });
}

void AdminFront::State::maybe_resume_accept() {
  if (stopped.load() || accepting) return;
  bool room = false;
  {
    std::lock_guard g(mu);
    room = connections.size() < opt.max_connections || any_waiting();
    accept_paused.store(!room);
  }
  if (room) accept();
}

bool AdminFront::State::any_waiting() const {
  for (const Connection* c : connections) {
    if (c->waiting()) return true;
  }
  return false;
}

bool AdminFront::State::shed_oldest_idle() {
  Connection* oldest = nullptr;
  for (Connection* c : connections) {
    if (!c->waiting()) continue;
    if (oldest == nullptr || c->since_ns() < oldest->since_ns() ||
        (c->since_ns() == oldest->since_ns() && c->seq() < oldest->seq())) {
      oldest = c;
    }
  }
  if (oldest == nullptr) return false;
  ++closed_shed;
  // It leaves the set now (it no longer counts as open); its thread closes it.
  connections.erase(oldest);
  asio::post(oldest->io(), [weak = oldest->weak_from_this()] {
    if (auto c = weak.lock()) c->close();
  });
  return true;
}

}  // namespace sluice::front::admin

namespace sluice::front::admin {

void AdminFront::State::arm_sweep() {
  const int64_t every = std::clamp<int64_t>(opt.client_timeout_ms / 4, 1, 1'000);
  sweep.expires_after(std::chrono::milliseconds(every));
  sweep.async_wait([st = shared_from_this()](boost::system::error_code ec) {
    if (ec || st->stopped.load()) return;
    st->sweep_deadlines();
    st->arm_sweep();
  });
}

// Connections past their deadline: client_timeout_ms to send a request's head (from when the
// connection began to wait for it), as long for its body, kWriteTimeout to take an answer. The
// connection's own thread closes it, if it is still where it was.
void AdminFront::State::sweep_deadlines() {
  const int64_t now = steady_ns();
  const int64_t client = opt.client_timeout_ms * 1'000'000;
  const int64_t write = std::chrono::duration_cast<std::chrono::nanoseconds>(kWriteTimeout).count();
  std::lock_guard g(mu);
  for (Connection* c : connections) {
    const Connection::Phase p = c->phase();
    const int64_t since = c->since_ns();
    const bool late = p == Connection::kWriting ? now - since > write
                      : c->waiting()            ? now - since > client
                                                : false;
    if (!late) continue;
    asio::post(c->io(), [weak = c->weak_from_this(), p, since] {
      if (auto conn = weak.lock()) conn->expire(p, since);
    });
  }
}

// ---- AdminFront --------------------------------------------------------------------------------

AdminFront::AdminFront(asio::io_context& admin, std::vector<asio::io_context*> connection_threads,
                       Options options, Backend backend, std::vector<Route> routes) {
  if (connection_threads.empty()) throw std::invalid_argument("AdminFront: no connection thread");
  const std::string listen = options.listen;
  state_ = std::make_shared<State>(admin, std::move(connection_threads), std::move(options),
                                   std::move(backend), std::move(routes));
  const tcp::endpoint ep = open_listener(state_->acceptor, listen, "admin HTTP");
  state_->port = ep.port();
  state_->loopback = ep.address().is_loopback();
  state_->accept();
  state_->arm_sweep();
}

AdminFront::~AdminFront() {
  stop();
}

uint16_t AdminFront::port() const {
  return state_->port;
}

bool AdminFront::loopback() const {
  return state_->loopback;
}

void AdminFront::stop() {
  State& st = *state_;
  if (st.stopped.exchange(true)) return;
  boost::system::error_code ec;
  st.acceptor.close(ec);
  st.retry.cancel();
  st.sweep.cancel();
  std::lock_guard g(st.mu);
  st.admin_open = false;
  for (Connection* c : st.connections) {
    asio::post(c->io(), [weak = c->weak_from_this()] {
      if (auto conn = weak.lock()) conn->close_if_idle();
    });
  }
}

void AdminFront::append_metrics(MetricsText& m) const {
  const State& st = *state_;
  m.one("sluice_http_accept_errors_total", "counter",
        "Errors accepting admin HTTP connections (e.g. out of file descriptors).",
        st.accept_errors.load());
  m.family("sluice_http_connections_closed_total", "counter",
           "Admin HTTP connections the node closed before the client was done: shed (the oldest "
           "waiting one, for a new connection over max_connections), idle (a keep-alive "
           "connection silent for client_timeout_ms), header and body (a request not finished "
           "within client_timeout_ms).");
  m.sample("sluice_http_connections_closed_total", {"reason", "shed"}, st.closed_shed.load());
  m.sample("sluice_http_connections_closed_total", {"reason", "idle"}, st.closed_idle.load());
  m.sample("sluice_http_connections_closed_total", {"reason", "header"}, st.closed_header.load());
  m.sample("sluice_http_connections_closed_total", {"reason", "body"}, st.closed_body.load());
  size_t open = 0;
  {
    std::lock_guard g(st.mu);
    open = st.connections.size();
  }
  m.one("sluice_http_connections_open", "gauge", "Admin HTTP connections open now.", open);
  m.one("sluice_http_internal_errors_total", "counter",
        "Admin HTTP requests answered 500: a handler failed (the log says which and why).",
        st.internal_errors.load());
}

}  // namespace sluice::front::admin
