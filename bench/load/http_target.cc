#include "load/http_target.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string_view>

#include "load/stream_conn.h"

namespace sluice::bench {

namespace {

// Bounds on what a server may send back; past them the answer is malformed (and the connection
// is given up: the stream cannot be resynchronised).
constexpr size_t kMaxResponseHeaderBytes = 16 * 1024;
constexpr size_t kMaxResponseBodyBytes = 1024 * 1024;
constexpr size_t kMaxChunkLineBytes = 1024;

// ---- HTTP/1.1 answers -------------------------------------------------------------------------

char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

// True when the comma-separated list `value` (Connection, Transfer-Encoding) holds `token`
// (case-insensitive); `last` only looks at its last element.
bool has_token(std::string_view value, std::string_view token, bool last = false) {
  // Bounded by the value's length: each pass removes one element.
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view item = trim(value.substr(0, comma));
    if (comma == std::string_view::npos) return iequals(item, token);
    if (!last && iequals(item, token)) return true;
    value.remove_prefix(comma + 1);
  }
  return false;
}

struct Response {
  int status = 0;
  bool close = false;     // Connection: close
  size_t size = 0;        // bytes of the whole answer (head and body)
  std::string_view body;  // Content-Length bodies only (for error messages)
};

enum class Parse { kIncomplete, kComplete, kMalformed };

Parse malformed(const char*& why, const char* what) {
  why = what;
  return Parse::kMalformed;
}

// Chunked body from the front of `in`: its length on the wire in `used`. `why` names a problem.
// The bound is on the wire size (chunk lines included), so tiny chunks cannot grow it unbounded.
Parse parse_chunked(std::string_view in, size_t& used, const char*& why) {
  size_t pos = 0;
  // Bounded: each pass consumes one chunk (at least its size line) or returns.
  for (;;) {
    if (pos > kMaxResponseBodyBytes) return malformed(why, "chunked body over 1 MiB");
    const size_t eol = in.find("\r\n", pos);
    if (eol == std::string_view::npos) {
      if (in.size() - pos > kMaxChunkLineBytes) return malformed(why, "chunk size line too long");
      return Parse::kIncomplete;
    }
    std::string_view line = in.substr(pos, eol - pos);
    line = trim(line.substr(0, line.find(';')));  // chunk extensions are ignored
    size_t n = 0;
    const auto r = std::from_chars(line.data(), line.data() + line.size(), n, 16);
    if (line.empty() || r.ec != std::errc() || r.ptr != line.data() + line.size()) {
      return malformed(why, "bad chunk size");
    }
    pos = eol + 2;
    if (n == 0) break;
    if (n > kMaxResponseBodyBytes) return malformed(why, "chunked body over 1 MiB");
    if (in.size() - pos < n + 2) return Parse::kIncomplete;
    if (in.substr(pos + n, 2) != "\r\n") return malformed(why, "chunk not followed by CRLF");
    pos += n + 2;
  }
  // Trailer fields, then an empty line. Bounded by the input: each pass consumes one line.
  for (;;) {
    if (pos > kMaxResponseBodyBytes + kMaxResponseHeaderBytes) {
      return malformed(why, "chunked trailer over 16 KiB");
    }
    const size_t eol = in.find("\r\n", pos);
    if (eol == std::string_view::npos) {
      if (in.size() - pos > kMaxResponseHeaderBytes) return malformed(why, "trailer too long");
      return Parse::kIncomplete;
    }
    const bool empty = eol == pos;
    pos = eol + 2;
    if (empty) break;
  }
  used = pos;
  return Parse::kComplete;
}

// One answer from the front of `in` (RFC 9112: status line, fields, body framed by
// Transfer-Encoding: chunked or Content-Length; 1xx, 204 and 304 have none). An answer framed only
// by the end of the connection cannot be followed by another: malformed here.
Parse parse_response(std::string_view in, Response& r, const char*& why) {
  const size_t head_end = in.find("\r\n\r\n");
  if (head_end == std::string_view::npos) {
    if (in.size() > kMaxResponseHeaderBytes) return malformed(why, "answer header over 16 KiB");
    return Parse::kIncomplete;
  }
  r = Response{};
  const std::string_view head = in.substr(0, head_end + 2);  // every line ends with CRLF
  size_t eol = head.find("\r\n");
  const std::string_view status_line = head.substr(0, eol);
  // "HTTP/1.x SSS[ reason]"
  if (status_line.size() < 12 || !status_line.starts_with("HTTP/1.") || status_line[8] != ' ' ||
      (status_line.size() > 12 && status_line[12] != ' ')) {
    return malformed(why, "bad status line");
  }
  const auto sr = std::from_chars(status_line.data() + 9, status_line.data() + 12, r.status);
  if (sr.ec != std::errc() || sr.ptr != status_line.data() + 12 || r.status < 100) {
    return malformed(why, "bad status code");
  }
  bool chunked = false, have_length = false;
  size_t length = 0;
  // Bounded by the header's length: each pass consumes one line.
  for (size_t pos = eol + 2; pos < head.size(); pos = eol + 2) {
    eol = head.find("\r\n", pos);
    const std::string_view line = head.substr(pos, eol - pos);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0 || line[0] == ' ' || line[0] == '\t') {
      return malformed(why, "bad header line");
    }
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = trim(line.substr(colon + 1));
    if (iequals(name, "content-length")) {
      size_t n = 0;
      const auto cr = std::from_chars(value.data(), value.data() + value.size(), n);
      if (value.empty() || cr.ec != std::errc() || cr.ptr != value.data() + value.size() ||
          (have_length && n != length)) {
        return malformed(why, "bad Content-Length");
      }
      have_length = true;
      length = n;
    } else if (iequals(name, "transfer-encoding")) {
      if (!has_token(value, "chunked", /*last=*/true)) {
        return malformed(why, "Transfer-Encoding without chunked last");
      }
      chunked = true;
    } else if (iequals(name, "connection")) {
      r.close = r.close || has_token(value, "close");
    }
  }
  const size_t body_at = head_end + 4;
  if (r.status < 200 || r.status == 204 || r.status == 304) {
    r.size = body_at;
    return Parse::kComplete;
  }
  if (chunked) {
    size_t used = 0;
    const Parse p = parse_chunked(in.substr(body_at), used, why);
    if (p != Parse::kComplete) return p;
    r.size = body_at + used;
    return Parse::kComplete;
  }
  if (!have_length) return malformed(why, "answer without Content-Length or chunked framing");
  if (length > kMaxResponseBodyBytes) return malformed(why, "answer body over 1 MiB");
  if (in.size() - body_at < length) return Parse::kIncomplete;
  r.body = in.substr(body_at, length);
  r.size = body_at + length;
  return Parse::kComplete;
}

// An error body for a report: at most 200 bytes, one line.
std::string snippet(std::string_view body) {
  std::string s(body.substr(0, 200));
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  while (!s.empty() && s.back() == ' ')
    s.pop_back();
  return s;
}

// Characters a key may have: safe unescaped in a JSON string and in a query string.
bool plain_key(std::string_view k) {
  if (k.empty()) return false;
  for (const char c : k) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '~' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// ---- the connection ---------------------------------------------------------------------------

// Requests are appended to `out_` by send() and written by StreamConn::flush(); their start times
// wait in a ring (answers come back in request order). `in_` holds what was read and not yet
// parsed; it stops growing once it could hold two of the largest answers the parser accepts (an
// answer that fills it is malformed, and the parser says so). All three are sized once: nothing is
// allocated per request once the buffers have grown to the row's needs.
class HttpConn final : public detail::StreamConn {
 public:
  HttpConn(int fd, const HttpConnOptions& o, ThreadContext& ctx)
      : StreamConn(fd, ctx.recorder->stats,
                   {.in_initial_bytes = 64 * 1024,
                    .in_grow_below_bytes = 2 * (kMaxResponseHeaderBytes + kMaxResponseBodyBytes),
                    .error_prefix = "http "}),
        o_(o),
        rec_(*ctx.recorder),
        stream_(*ctx.keys),
        starts_(std::max<uint32_t>(o.window, 1)) {
    if (o.scheme == HttpScheme::kSluiceCheck) {
      target_ = "POST /v1/check";
      head_ =
          "POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
          "Content-Length: ";
      body_prefix_ = R"({"domain":")" + std::string(kSluiceDomain) + R"(","descriptors":{")" +
                     std::string(kSluiceEntryKey) + R"(":")";
      body_suffix_ = R"("},"hits":1})";
    } else {
      target_ = "GET /check";
      head_ = "GET /check?k=";
      body_suffix_ = " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    }
    out_.reserve(starts_.size() * (head_.size() + body_prefix_.size() + body_suffix_.size() + 64));
  }

  bool has_room() const override { return inflight_ < starts_.size(); }

  void send(int64_t start) override {
    const uint32_t i = stream_.next();
    if (i >= o_.keys->names.size()) {
      stats_->note_error("key index " + std::to_string(i) + " outside the keyspace of " +
                         std::to_string(o_.keys->names.size()) + " keys");
      fail();
      return;
    }
    const std::string& key = o_.keys->names[i];
    const size_t before = out_.size();
    out_.append(head_);
    if (o_.scheme == HttpScheme::kSluiceCheck) {
      char len[24];
      const size_t n = body_prefix_.size() + key.size() + body_suffix_.size();
      const auto r = std::to_chars(len, len + sizeof len, n);
      out_.append(len, r.ptr).append("\r\n\r\n").append(body_prefix_);
    }
    out_.append(key).append(body_suffix_);
    starts_[(head_slot_ + inflight_) % starts_.size()] = start;
    sizes_[(head_slot_ + inflight_) % starts_.size()] = out_.size() - before;
    ++inflight_;
  }

  void on_readable(int64_t now) override {
    // The server closing is reported below, after the answers read before it are handled.
    const bool open = read_some() == ReadResult::kOpen;
    // Bounded: each pass consumes one answer or stops.
    for (size_t guard = 0; guard < 1'000'000 && !failed_ && !pending_input().empty(); ++guard) {
      const std::string_view in = pending_input();
      Response r;
      const char* why = "";
      const Parse p = parse_response(in, r, why);
      if (p == Parse::kIncomplete) break;
      if (p == Parse::kMalformed) {
        stats_->note_error(std::string("malformed HTTP answer to ") + target_ + ": " + why +
                           " (starts \"" + snippet(in.substr(0, 80)) + "\")");
        fail();
        return;
      }
      consume(r.size);  // r.body still points into the buffer: consume() only moves indices
      handle(r, now);
    }
    if (!open && !failed_) {
      stats_->note_error(std::string("the server closed the HTTP connection (") + target_ +
                         ") after " + std::to_string(answers_) + " answers, with " +
                         std::to_string(inflight_) + " requests unanswered");
      fail();
    }
  }

 private:
  void handle(const Response& r, int64_t now) {
    if (r.status < 200) {
      if (r.status == 101) {
        stats_->note_error("HTTP 101 (protocol switch) from " + target_);
        fail();
      }
      return;  // an interim answer (100 Continue): the final one follows
    }
    if (inflight_ == 0) {
      stats_->note_error("HTTP answer with no request in flight from " + target_);
      fail();
      return;
    }
    const int64_t start = starts_[head_slot_];
    const size_t sent = sizes_[head_slot_];
    head_slot_ = (head_slot_ + 1) % starts_.size();
    --inflight_;
    ++answers_;
    if (r.status >= 200 && r.status < 300) {
      rec_.complete(start, now, 1, sent, r.size);
    } else if (r.status == 429) {
      ++stats_->denied;
      rec_.complete(start, now, 1, sent, r.size);
    } else {
      const std::string body = snippet(r.body);
      stats_->note_error("HTTP " + std::to_string(r.status) + " from " + target_ +
                         (body.empty() ? "" : ": " + body));
    }
    if (r.close) {
      stats_->note_error(std::string("the server ended keep-alive (Connection: close) on ") +
                         target_ + " after " + std::to_string(answers_) + " answers");
      fail();
    }
  }

  HttpConnOptions o_;
  Recorder& rec_;
  KeyStream& stream_;
  std::string target_;  // for messages: "POST /v1/check"
  // A request is head_ [Content-Length "\r\n\r\n" body_prefix_] key body_suffix_.
  std::string head_, body_prefix_, body_suffix_;
  std::vector<int64_t> starts_;  // ring of the start times in flight, oldest at head_slot_
  std::vector<size_t> sizes_ = std::vector<size_t>(starts_.size());  // their request bytes
  size_t head_slot_ = 0;
  size_t inflight_ = 0;
  uint64_t answers_ = 0;
};

// The nginx binary: "nginx" on PATH, else Debian's /usr/sbin/nginx (not on a user's PATH).
std::string find_nginx() {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "";
  // Bounded by PATH's length: each pass removes one directory.
  while (!dirs.empty()) {
    const size_t colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    dirs.remove_prefix(colon == std::string_view::npos ? dirs.size() : colon + 1);
    if (dir.empty()) continue;
    const std::string candidate = dir + "/nginx";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return ::access("/usr/sbin/nginx", X_OK) == 0 ? "/usr/sbin/nginx" : "";
}

}  // namespace

std::unique_ptr<Conn> make_http(const HttpConnOptions& o, ThreadContext& ctx) {
  if (o.port == 0) throw std::runtime_error("http target: no port");
  if (o.keys == nullptr || o.keys->names.empty()) throw std::runtime_error("http target: no keys");
  if (o.window == 0) throw std::runtime_error("http target: window 0");
  // Bounded by the keyspace (a few microseconds for 10,000 keys).
  for (const std::string& k : o.keys->names) {
    if (!plain_key(k)) {
      throw std::runtime_error("http target: key '" + k +
                               "' needs escaping (only [A-Za-z0-9._~:-] are sent as they are)");
    }
  }
  std::string err;
  const int fd = tcp_connect(o.port, 2000, err);
  if (fd < 0) throw std::runtime_error(err);
  return std::make_unique<HttpConn>(fd, o, ctx);
}

std::vector<std::string> nginx_limit_req_argv(const std::string& dir, uint16_t port,
                                              std::string& err) {
  const std::string nginx = find_nginx();
  if (nginx.empty()) {
    err = "no nginx on PATH or at /usr/sbin/nginx (apt-get install nginx-light)";
    return {};
  }
  // The reasons for each value are in http_target.h.
  const std::string conf = dir + "/nginx.conf";
  std::ofstream out(conf);
  out << "# written by sluice-bench-load (bench/load/http_target.cc)\n"
         "daemon off;\n"
         "master_process off;\n"
         "worker_processes 1;\n"
         "error_log "
      << dir << "/error.log warn;\n"
      << "pid " << dir << "/nginx.pid;\n"
      << "events {\n"
         "    worker_connections 1024;\n"
         "}\n"
         "http {\n"
         "    access_log off;\n"
         "    client_body_temp_path "
      << dir << "/client_body;\n"
      << "    proxy_temp_path " << dir << "/proxy;\n"
      << "    fastcgi_temp_path " << dir << "/fastcgi;\n"
      << "    uwsgi_temp_path " << dir << "/uwsgi;\n"
      << "    scgi_temp_path " << dir << "/scgi;\n"
      << "    keepalive_requests 1000000000;\n"
         "    keepalive_time 1d;\n"
         "    keepalive_timeout 300s;\n"
         "    limit_req_zone $arg_k zone=bench:16m rate=1000000000r/s;\n"
         "    server {\n"
         "        listen 127.0.0.1:"
      << port << ";\n"
      << "        location = /check {\n"
         "            limit_req zone=bench burst=1000000 nodelay;\n"
         "            limit_req_status 429;\n"
         "            empty_gif;\n"
         "        }\n"
         "    }\n"
         "}\n";
  out.close();
  if (!out) {
    err = "cannot write " + conf;
    return {};
  }
  return {nginx, "-p", dir + "/", "-e", dir + "/error.log", "-c", conf};
}

std::string nginx_probe(uint16_t port, int timeout_ms) {
  detail::SyncClient c;
  Response r;
  const char* why = "";
  Parse parsed = Parse::kIncomplete;
  size_t skip = 0;  // interim answers (1xx) before the final one
  auto done = [&](std::string_view in) {
    // Bounded by the input.
    while ((parsed = parse_response(in.substr(skip), r, why)) == Parse::kComplete && r.status < 200)
      skip += r.size;
    return parsed != Parse::kIncomplete;
  };
  const std::string e = c.exchange(
      port, "GET /check?k=probe HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
      timeout_ms, done);
  if (parsed == Parse::kMalformed) return std::string("malformed answer: ") + why;
  if (parsed == Parse::kIncomplete) return e.empty() ? "no whole answer" : e;
  return r.status < 300 ? "" : "HTTP " + std::to_string(r.status) + ": " + snippet(r.body);
}

}  // namespace sluice::bench
