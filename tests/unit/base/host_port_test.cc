// base/host_port.h: the one reading of "host:port" that every listener, seed and client uses.
#include "base/host_port.h"

#include <doctest/doctest.h>

namespace {

using sluice::HostPort;
using sluice::split_host_port;
using sluice::StatusCode;

TEST_CASE("host:port: IPv4, names, bracketed IPv6, an empty host, ports 0..65535") {
  const struct {
    const char* text;
    const char* host;
    uint16_t port;
    bool bracketed;
  } good[] = {
      {"127.0.0.1:7350", "127.0.0.1", 7350, false},
      {"node-1.example:7946", "node-1.example", 7946, false},
      {"[::1]:0", "::1", 0, true},
      {"[fe80::1%eth0]:65535", "fe80::1%eth0", 65535, true},
      {":7350", "", 7350, false},
      {"::1:7350", "::1", 7350, false},  // the last ':' splits; the client refuses this form
  };
  for (const auto& g : good) {
    CAPTURE(g.text);
    const sluice::StatusOr<HostPort> hp = split_host_port(g.text);
    REQUIRE(hp.ok());
    CHECK(hp->host == g.host);
    CHECK(hp->port == g.port);
    CHECK(hp->bracketed == g.bracketed);
  }
}

TEST_CASE("host:port: each malformed form is invalid_argument saying what was expected") {
  const struct {
    const char* text;
    const char* message;
  } bad[] = {
      {"127.0.0.1", "expected HOST:PORT"},
      {"", "expected HOST:PORT"},
      {"[::1]", "expected [IPv6]:PORT"},
      {"[::1:7350", "expected [IPv6]:PORT"},
      {"[::1]7350", "expected [IPv6]:PORT"},
      {"host:", "bad port ''"},
      {"host:65536", "bad port '65536'"},
      {"host:-1", "bad port '-1'"},
      {"host:12x", "bad port '12x'"},
      {"host: 80", "bad port ' 80'"},
      {"host:99999999999999999999", "bad port '99999999999999999999'"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.text);
    const sluice::StatusOr<HostPort> hp = split_host_port(b.text);
    REQUIRE_FALSE(hp.ok());
    CHECK(hp.code() == StatusCode::invalid_argument);
    CHECK(hp.message() == b.message);
  }
}

}  // namespace
