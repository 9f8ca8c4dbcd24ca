// The admin HTTP front: the HTTP/1.1 server of a node's admin port and its route table. The node
// (lib/node) wires it: it gives the routes, who may call them, and the threads to serve on;
// docs/http.md lists the endpoints as users see them. Nothing of Asio or Beast is visible here
// (io_context is only declared), so a user of this header compiles without them.
//
// One route table {method, path, access, runs, handler} serves the port. A request whose path no
// row names is a 404 with a JSON error; one whose method the path's rows do not take is a 405
// with a JSON error and `Allow` listing the methods they take (in table order). A path ending in
// "/*" is a prefix row: it takes every path below it that no exact row names.
//
// Threads. Connections are served on the connection threads given to the constructor (a node's
// workers: their io_contexts), handed out round-robin by the acceptor, which runs on the admin
// io_context. A row that runs kConnectionThread is answered on the connection's thread, inline
// (the checks: no thread hand-off for a node on its own); it must not block. A row that runs
// kAdminThread is handed to the admin io_context's one thread and its answer handed back: it may
// block on the disk (operator writes), and it is the only thread that runs those handlers, so
// they need no lock among themselves.
//
// Hostile input is bounded where it is read (limits: docs/http.md): a request header of at most
// kMaxHeaderBytes (431), a body of at most kMaxBodyBytes (413, before it is read, for a
// Content-Length), client_timeout_ms to send a request's header (counted from when the
// connection began to wait for it) and again its body, and at most max_connections connections:
// one more closes the one that has waited longest for a request (shed), or, with every connection
// busy, is served all the same while accepting pauses until one closes. A malformed request is
// answered 400 and its connection closed. Keep-alive and pipelining: answers go in request order.
//
// Lifetime: construct, stop() and destroy on the admin io_context's thread (or while it is not
// running). stop() closes idle connections; one with a request in hand answers it, then closes.
// The io_contexts must outlive the AdminFront; a connection's state lives on by itself until its
// io_context has run its last handler for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace sluice::front::admin {

class MetricsText;

inline constexpr size_t kMaxHeaderBytes = 8 * 1024;  // start line and header fields
inline constexpr size_t kMaxBodyBytes = 64 * 1024;

// Who may call a route; the node decides what each level asks for (its admin token).
enum class Access {
  kOpen,   // anyone (liveness, the checks)
  kRead,   // reads: open, unless the node locks reads too
  kWrite,  // operator writes
};

enum class Runs { kConnectionThread, kAdminThread };

struct Header {
  std::string_view name;
  std::string_view value;  // without the spaces around it
};

// One request, as views into the connection's buffers: valid until the handler returns.
struct Request {
  std::string_view method;  // as sent ("GET", "POST", ...)
  std::string_view target;  // path and query
  std::string_view path;
  std::string_view query;  // after '?', without it
  std::span<const Header> headers;
  std::string_view body;  // de-chunked
  // The first header of that name (any case), and how many there are.
  std::optional<std::string_view> header(std::string_view name) const;
  size_t count(std::string_view name) const;
};

// One answer. The front reuses it from request to request (capacity kept), so a handler that
// appends to body and adds headers allocates nothing once warm.
struct Reply {
  unsigned status = 200;
  // Static text (a literal); "" with an empty body sends no Content-Type.
  std::string_view content_type;
  std::string body;
  // Further header lines, "Name: value\r\n" each (add_header writes them).
  std::string headers;
  bool close = false;  // close the connection after this answer

  void add_header(std::string_view name, std::string_view value);
  void text(unsigned s, std::string_view type, std::string_view b) {
    status = s;
    content_type = type;
    body.assign(b);
  }
  // {"error":"<message>"} and a newline, as every JSON error of the port.
  void json_error(unsigned s, std::string_view message);
  void clear();
};

// A handler that cannot answer before it returns (a cluster node's check, decided on a worker and
// perhaps by other nodes) takes the request's completion: `finish` may be called once, from any
// thread, with the answer; the connection waits for it before it reads on.
class Later {
 public:
  virtual std::function<void(Reply&&)> take() = 0;

 protected:
  ~Later() = default;
};

using Handler = std::function<void(const Request&, Reply&, Later&)>;

struct Route {
  std::string_view method;  // "GET", "POST", ...
  std::string_view path;    // exact, or a prefix ending in "/*"
  Access access = Access::kRead;
  Runs runs = Runs::kAdminThread;
  Handler handler;
};

struct AuthVerdict {
  bool allowed = true;
  unsigned status = 200;   // 401 or 403 when refused
  bool challenge = false;  // 401: send `WWW-Authenticate: Bearer`
  std::string message;     // the JSON error's text
};

// What the front needs from the node. Called on connection threads: thread-safe, non-blocking.
struct Backend {
  // Whether a request of `access` may go on: `authorization` is its Authorization header (nullopt
  // when absent), `count` how many it had. Never asked for kOpen.
  std::function<AuthVerdict(Access access, std::optional<std::string_view> authorization,
                            size_t count)>
      authorize;
  // The level of a request no row takes (a 404 or 405 to be), by method and path.
  std::function<Access(std::string_view method, std::string_view path)> access_of;
};

struct Options {
  std::string listen = "127.0.0.1:7351";  // "host:port" or "[v6]:port"; port 0: any free one
  size_t max_connections = 1024;
  int64_t client_timeout_ms = 10'000;
};

class AdminFront {
 public:
  // Binds and starts accepting. Throws std::runtime_error naming the address when it cannot be
  // parsed or bound. `connection_threads`: non-empty; they and `admin` must be run by one thread
  // each.
  AdminFront(boost::asio::io_context& admin,
             std::vector<boost::asio::io_context*> connection_threads, Options options,
             Backend backend, std::vector<Route> routes);
  ~AdminFront();  // stop(), then closes every connection
  AdminFront(const AdminFront&) = delete;
  AdminFront& operator=(const AdminFront&) = delete;

  uint16_t port() const;
  bool loopback() const;  // bound to a loopback address
  // Stops accepting and closes idle connections; an answer in the making is written, then its
  // connection closes. Idempotent.
  void stop();

  // sluice_http_* (accept errors, connections closed by reason, open, internal errors). Any
  // thread.
  void append_metrics(MetricsText& m) const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace sluice::front::admin
