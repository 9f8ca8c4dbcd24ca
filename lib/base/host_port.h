// "host:port" and "[v6-address]:port": the one reading of an address with a port, for every
// listener (check, admin, RESP), the cluster's listen address and seeds, and the client's server.
//
// The port is the text after the last ':' (after "]:" when the host is bracketed): decimal
// digits, 0..65535. The host is what comes before, brackets removed; it may be empty (":7350")
// and is not checked here: a listener requires an IP literal, a seed may be a DNS name, the client
// refuses an empty host and port 0. Each caller adds its rule and names the setting in its message.
//
// Header-only, no dependencies beyond the standard library.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace sluice {

struct HostPort {
  std::string host;  // brackets removed
  uint16_t port = 0;
  bool bracketed = false;  // written as "[host]:port"
};

// invalid_argument: "expected HOST:PORT", "expected [IPv6]:PORT" or "bad port '<text>'".
inline StatusOr<HostPort> split_host_port(std::string_view text) {
  HostPort hp;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return Status::InvalidArgument("expected [IPv6]:PORT");
    }
    hp.host.assign(text.substr(1, close - 1));
    hp.bracketed = true;
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return Status::InvalidArgument("expected HOST:PORT");
    hp.host.assign(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65'535) {
    return Status::InvalidArgument("bad port '" + std::string(port) + "'");
  }
  hp.port = static_cast<uint16_t>(value);
  return hp;
}

}  // namespace sluice
