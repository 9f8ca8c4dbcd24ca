#include "load/http_target.h"

#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>
#include <utility>

#include "http_client.h"
#include "load/stream_conn.h"

namespace sluice::bench {

namespace {

// Bounds on what a server may send back; past them the answer is malformed (and the connection
// is given up: the stream cannot be resynchronised).
constexpr size_t kMaxResponseHeaderBytes = 16 * 1024;
constexpr size_t kMaxResponseBodyBytes = 1024 * 1024;

struct Response {
  int status = 0;
  bool close = false;     // Connection: close
  std::string_view body;  // for error messages
};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0;
}

// One answer from the front of `in` (RFC 9112: status line, fields, a body of Content-Length
// bytes; 1xx, 204 and 304 have none): its size, 0 when incomplete or malformed (then `why` says
// why). Chunked bodies are malformed here (neither server sends them), and so is an answer framed
// only by the end of the connection (no answer could follow it).
size_t parse_response(std::string_view in, Response& r, const char*& why) {
  auto bad = [&](const char* what) {
    why = what;
    return size_t{0};
  };
  const size_t head_end = in.find("\r\n\r\n");
  if (head_end == std::string_view::npos) {
    return in.size() > kMaxResponseHeaderBytes ? bad("answer header over 16 KiB") : 0;
  }
  r = Response{};
  // "HTTP/1.x SSS[ reason]"
  const std::string_view status_line = in.substr(0, in.find("\r\n"));
  if (status_line.size() < 12 || !status_line.starts_with("HTTP/1.") || status_line[8] != ' ' ||
      (status_line.size() > 12 && status_line[12] != ' ') ||
      !detail::parse_int(status_line.substr(9, 3), r.status) || r.status < 100) {
    return bad("bad status line");
  }
  size_t length = SIZE_MAX;  // none
  // Bounded by the header's length: each pass takes one line.
  for (size_t pos = status_line.size() + 2, eol = 0; pos < head_end + 2; pos = eol + 2) {
    eol = in.find("\r\n", pos);
    const std::string_view line = in.substr(pos, eol - pos);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0 || line[0] == ' ' || line[0] == '\t') {
      return bad("bad header line");
    }
    const std::string_view name = line.substr(0, colon);
    std::string_view value = line.substr(colon + 1);
    value.remove_prefix(std::min(value.find_first_not_of(" \t"), value.size()));
    value = value.substr(0, value.find_last_not_of(" \t") + 1);
    if (iequals(name, "content-length")) {
      if (!detail::parse_int(value, length)) return bad("bad Content-Length");
    } else if (iequals(name, "transfer-encoding")) {
      return bad("Transfer-Encoding (only Content-Length bodies are read)");
    } else if (iequals(name, "connection")) {
      const std::string_view close = "close";
      r.close = r.close ||
                std::search(value.begin(), value.end(), close.begin(), close.end(),
                            [](char a, char b) { return std::tolower(a) == b; }) != value.end();
    }
  }
  const size_t body_at = head_end + 4;
  if (r.status < 200 || r.status == 204 || r.status == 304) return body_at;
  if (length == SIZE_MAX) return bad("answer without Content-Length");
  if (length > kMaxResponseBodyBytes) return bad("answer body over 1 MiB");
  if (in.size() - body_at < length) return 0;
  r.body = in.substr(body_at, length);
  return body_at + length;
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

// Requests are appended to `out_` by send(); their start times and sizes wait in a ring (answers
// come back in request order). Nothing is allocated per request once the buffers have grown.
class HttpConn final : public detail::StreamConn {
 public:
  HttpConn(int fd, const HttpConnOptions& o, ThreadContext& ctx)
      : StreamConn(fd, ctx, "http "), o_(o), inflight_(o.window) {
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
    out_.reserve(o.window * (head_.size() + body_prefix_.size() + body_suffix_.size() + 64));
  }

  bool has_room() const override { return !inflight_.full(); }

  void send(int64_t start) override {
    const std::string& key = o_.keys->names[keys_.next()];
    const size_t before = out_.size();
    out_.append(head_);
    if (o_.scheme == HttpScheme::kSluiceCheck) {
      out_.append(std::to_string(body_prefix_.size() + key.size() + body_suffix_.size()));
      out_.append("\r\n\r\n").append(body_prefix_);
    }
    out_.append(key).append(body_suffix_);
    inflight_.push() = {start, out_.size() - before};
  }

 private:
  size_t parse(std::string_view in, int64_t now) override {
    Response r;
    const char* why = nullptr;
    const size_t size = parse_response(in, r, why);
    if (why != nullptr) {
      stats_->note_error("malformed HTTP answer to " + target_ + ": " + why + " (starts \"" +
                         snippet(in.substr(0, 80)) + "\")");
      fail();
    }
    if (size == 0) return 0;
    if (r.status < 200) return size;  // an interim answer (100 Continue): the final one follows
    if (inflight_.empty()) {
      stats_->note_error("HTTP answer with no request in flight from " + target_);
      fail();
      return size;
    }
    const Sent sent = inflight_.front();
    inflight_.pop();
    ++answers_;
    if (r.status == 429) ++stats_->denied;
    if ((r.status >= 200 && r.status < 300) || r.status == 429) {
      rec_.complete(sent.start, now, 1, sent.bytes, size);
    } else {
      const std::string body = snippet(r.body);
      stats_->note_error("HTTP " + std::to_string(r.status) + " from " + target_ +
                         (body.empty() ? "" : ": " + body));
    }
    if (r.close) {
      stats_->note_error("the server ended keep-alive (Connection: close) on " + target_ +
                         " after " + std::to_string(answers_) + " answers");
      fail();
    }
    return size;
  }
  std::string closed_message() const override {
    return "connection closed by the server (" + target_ + ") after " + std::to_string(answers_) +
           " answers, with " + std::to_string(inflight_.size()) + " requests unanswered";
  }

  struct Sent {
    int64_t start = 0;
    size_t bytes = 0;
  };

  HttpConnOptions o_;
  std::string target_;  // for messages: "POST /v1/check"
  // A request is head_ [Content-Length "\r\n\r\n" body_prefix_] key body_suffix_.
  std::string head_, body_prefix_, body_suffix_;
  detail::InOrder<Sent> inflight_;
  uint64_t answers_ = 0;
};

}  // namespace

std::unique_ptr<Conn> make_http(const HttpConnOptions& o, ThreadContext& ctx) {
  return detail::connect_stream<HttpConn>(o, ctx);
}

std::vector<std::string> nginx_limit_req_argv(const std::string& dir, uint16_t port,
                                              std::string& err) {
  // "nginx" on PATH, else Debian's /usr/sbin/nginx (not on a user's PATH).
  std::string nginx = "/usr/sbin/nginx";
  std::istringstream path(std::getenv("PATH") != nullptr ? std::getenv("PATH") : "");
  for (std::string d; std::getline(path, d, ':');) {
    if (!d.empty() && ::access((d + "/nginx").c_str(), X_OK) == 0) {
      nginx = d + "/nginx";
      break;
    }
  }
  if (::access(nginx.c_str(), X_OK) != 0) {
    err = "no nginx on PATH or at /usr/sbin/nginx (apt-get install nginx-light)";
    return {};
  }
  // The reasons for each value are in http_target.h.
  std::string conf = R"(# written by sluice-bench-load (bench/load/http_target.cc)
daemon off;
master_process off;
worker_processes 1;
error_log @DIR@/error.log warn;
pid @DIR@/nginx.pid;
events {
    worker_connections 1024;
}
http {
    access_log off;
    client_body_temp_path @DIR@/client_body;
    proxy_temp_path @DIR@/proxy;
    fastcgi_temp_path @DIR@/fastcgi;
    uwsgi_temp_path @DIR@/uwsgi;
    scgi_temp_path @DIR@/scgi;
    keepalive_requests 1000000000;
    keepalive_time 1d;
    keepalive_timeout 300s;
    limit_req_zone $arg_k zone=bench:16m rate=1000000000r/s;
    server {
        listen 127.0.0.1:@PORT@;
        location = /check {
            limit_req zone=bench burst=1000000 nodelay;
            limit_req_status 429;
            empty_gif;
        }
    }
}
)";
  for (const auto& [from, to] :
       {std::pair<std::string, std::string>{"@DIR@", dir},
        std::pair<std::string, std::string>{"@PORT@", std::to_string(port)}}) {
    for (size_t at = conf.find(from); at != std::string::npos; at = conf.find(from, at + to.size()))
      conf.replace(at, from.size(), to);
  }
  const std::string file = dir + "/nginx.conf";
  std::ofstream out(file);
  out << conf;
  out.close();
  if (!out) {
    err = "cannot write " + file;
    return {};
  }
  return {nginx, "-p", dir + "/", "-e", dir + "/error.log", "-c", file};
}

std::string nginx_probe(uint16_t port, int timeout_ms) {
  const testing::HttpReply r = testing::http_request(port, "GET", "/check?k=probe", "",
                                                     std::chrono::milliseconds(timeout_ms));
  if (r.status == 0) return "no HTTP answer";
  return r.status < 300 ? "" : "HTTP " + std::to_string(r.status) + ": " + snippet(r.body);
}

}  // namespace sluice::bench
