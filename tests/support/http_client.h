// A small blocking HTTP/1.1 client for the tests: one request per connection to an admin port
// (or any HTTP door), every socket wait bounded by the request's timeout. What the tests use to
// call sluiced's admin API and read /metrics (metrics_text.h reads the samples). Not for testing
// the HTTP server's own connection handling (keep-alive, pipelining, partial writes): those tests
// drive their socket themselves (tests/process/admin_http_test.cc).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace sluice::testing {

struct HttpReply {
  unsigned status = 0;                         // 0: no answer (connect failed, timeout, unparsable)
  std::map<std::string, std::string> headers;  // names in lower case, values trimmed
  std::string body;
  // A header's value, "" when absent (`name` in lower case).
  std::string header(const std::string& name) const {
    const auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
  // The body as JSON; nullopt when it is not JSON.
  std::optional<nlohmann::json> json() const {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded()) return std::nullopt;
    return j;
  }
};

// One request to host:port (an IPv4 literal) on a fresh connection ("Connection: close"), the
// whole exchange within `timeout`. `extra_headers` is written as is after the request's own
// headers, each line ending in "\r\n" (e.g. "Authorization: Bearer x\r\n"). A body, or any POST,
// goes as application/json.
inline HttpReply http_request_at(
    const std::string& host, uint16_t port, const std::string& method, const std::string& path,
    const std::string& body = "",
    std::chrono::milliseconds timeout = std::chrono::milliseconds(2000),
    const std::string& extra_headers = "") {
  using std::chrono::milliseconds;
  HttpReply reply;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left_ms = [&]() {
    const auto ms =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now())
            .count();
    return static_cast<int>(std::max<int64_t>(0, ms));
  };
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (s < 0) return reply;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{s};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::connect(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINPROGRESS) return reply;
    pollfd p{s, POLLOUT, 0};
    if (::poll(&p, 1, left_ms()) != 1) return reply;
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) return reply;
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: " + host +
                    "\r\nConnection: close\r\n" + extra_headers;
  if (!body.empty() || method == "POST") {
    req +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  size_t sent = 0;
  while (sent < req.size()) {
    pollfd p{s, POLLOUT, 0};
    if (::poll(&p, 1, left_ms()) != 1) return reply;
    const ssize_t n = ::send(s, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) return reply;
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string in;
  char buf[16384];
  size_t header_end = std::string::npos;
  size_t content_length = std::string::npos;
  bool chunked = false;
  for (;;) {
    if (header_end != std::string::npos && content_length != std::string::npos &&
        in.size() >= header_end + content_length) {
      break;
    }
    pollfd p{s, POLLIN, 0};
    if (::poll(&p, 1, left_ms()) != 1) return reply;
    const ssize_t n = ::recv(s, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return reply;
    }
    in.append(buf, static_cast<size_t>(n));
    if (header_end == std::string::npos) {
      const size_t e = in.find("\r\n\r\n");
      if (e == std::string::npos) continue;
      header_end = e + 4;
      std::string head = in.substr(0, e);
      std::transform(head.begin(), head.end(), head.begin(),
                     [](char c) { return static_cast<char>(std::tolower(c)); });
      if (const size_t cl = head.find("\r\ncontent-length:"); cl != std::string::npos) {
        content_length = std::strtoull(head.c_str() + cl + 17, nullptr, 10);
      }
      chunked = head.find("transfer-encoding: chunked") != std::string::npos;
    }
  }
  if (header_end == std::string::npos || in.compare(0, 9, "HTTP/1.1 ") != 0) return reply;
  // The header lines after the status line: "name: value", the name lower-cased.
  for (size_t at = in.find("\r\n") + 2; at < header_end - 2;) {
    const size_t eol = in.find("\r\n", at);
    const std::string line = in.substr(at, eol - at);
    at = eol + 2;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(),
                   [](char c) { return static_cast<char>(std::tolower(c)); });
    const size_t value = line.find_first_not_of(' ', colon + 1);
    reply.headers[name] = value == std::string::npos ? std::string() : line.substr(value);
  }
  std::string payload = in.substr(header_end);
  if (content_length != std::string::npos && payload.size() > content_length) {
    payload.resize(content_length);
  }
  if (chunked) {
    std::string plain;
    size_t pos = 0;
    while (pos < payload.size()) {
      const size_t eol = payload.find("\r\n", pos);
      if (eol == std::string::npos) break;
      const size_t n = std::strtoull(payload.c_str() + pos, nullptr, 16);
      if (n == 0) break;
      plain += payload.substr(eol + 2, n);
      pos = eol + 2 + n + 2;
    }
    payload = std::move(plain);
  }
  reply.status = static_cast<unsigned>(std::strtoul(in.c_str() + 9, nullptr, 10));
  reply.body = std::move(payload);
  return reply;
}

// The same on loopback.
inline HttpReply http_request(uint16_t port, const std::string& method, const std::string& path,
                              const std::string& body = "",
                              std::chrono::milliseconds timeout = std::chrono::milliseconds(2000),
                              const std::string& extra_headers = "") {
  return http_request_at("127.0.0.1", port, method, path, body, timeout, extra_headers);
}

}  // namespace sluice::testing
