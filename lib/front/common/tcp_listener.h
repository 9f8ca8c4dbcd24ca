// What the TCP fronts (the admin port, the Redis door) share about their listener: opening it on
// a configured address, and what an accept error does. Private to lib/front: it includes Asio,
// which each front links PRIVATE.
#pragma once

#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <stdexcept>
#include <string>

#include "base/host_port.h"

namespace sluice::front {

// Opens, binds and listens `a` on `listen` ("127.0.0.1:7351", "[::1]:0"; an IP literal):
// SO_REUSEADDR, IPV6_V6ONLY on an IPv6 address (so "[::]" and "0.0.0.0" can both be bound), the
// system's largest backlog. Returns the bound endpoint (the port the kernel chose for 0). Throws
// std::runtime_error naming `what` ("admin HTTP", "RESP"), the address and the step that failed:
// the node's run() is the program's edge for the operating system's refusals.
inline boost::asio::ip::tcp::endpoint open_listener(boost::asio::ip::tcp::acceptor& a,
                                                    const std::string& listen,
                                                    const std::string& what) {
  namespace asio = boost::asio;
  const auto fail = [&](const std::string& why) {
    throw std::runtime_error(what + " listen address \"" + listen + "\": " + why);
  };
  StatusOr<HostPort> hp = split_host_port(listen);
  if (!hp.ok()) fail(hp.message());
  boost::system::error_code ec;
  const asio::ip::address addr = asio::ip::make_address(hp->host, ec);
  if (ec) fail("not an IP address (" + ec.message() + ")");
  const asio::ip::tcp::endpoint ep(addr, hp->port);
  const auto step = [&](const char* name) { fail(std::string(name) + ": " + ec.message()); };
  if (a.open(ep.protocol(), ec)) step("open");
  if (a.set_option(asio::socket_base::reuse_address(true), ec)) step("SO_REUSEADDR");
  if (addr.is_v6() && a.set_option(asio::ip::v6_only(true), ec)) step("IPV6_V6ONLY");
  if (a.bind(ep, ec)) step("bind");
  if (a.listen(asio::socket_base::max_listen_connections, ec)) step("listen");
  const asio::ip::tcp::endpoint bound = a.local_endpoint(ec);
  if (ec) step("local address");
  return bound;
}

// An accept that failed (out of descriptors and the like; not a cancel): `resume` runs on the
// timer's context after 100 ms, rather than accepting again at once and spinning.
template <class Resume>
void retry_accept_later(boost::asio::steady_timer& retry, Resume resume) {
  retry.expires_after(std::chrono::milliseconds(100));
  retry.async_wait([resume = std::move(resume)](boost::system::error_code ec) {
    if (!ec) resume();
  });
}

}  // namespace sluice::front
