// The service manager's readiness protocol (systemd's sd_notify(3)), without libsystemd: one
// AF_UNIX datagram of newline-separated VAR=value lines to the socket named by $NOTIFY_SOCKET.
//
// Contract: a path socket ("/run/systemd/notify") or an abstract one ("@name": the '@' stands for
// the leading NUL byte). With NOTIFY_SOCKET unset or empty, sluiced was not started by a service
// manager that waits for it: notify() does nothing and succeeds. Any other form (vsock, a relative
// path, a name too long for sun_path) is an error returned by notify(), never a crash.
//
// Thread safety: notify() opens a socket of its own per call; any thread may call it at any time.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace sluice::daemon {

class ServiceNotifier {
 public:
  // Reads NOTIFY_SOCKET from the environment.
  static ServiceNotifier from_environment();
  explicit ServiceNotifier(std::string socket_name) : socket_(std::move(socket_name)) {}

  bool enabled() const { return !socket_.empty(); }
  // Sends `state`, e.g. "READY=1\nSTATUS=serving". Returns "" or why it could not be sent.
  std::string notify(std::string_view state) const;

 private:
  std::string socket_;  // as given in NOTIFY_SOCKET; "" when unset
};

// CLOCK_MONOTONIC in microseconds, for "MONOTONIC_USEC=" next to "RELOADING=1".
unsigned long long monotonic_usec();

}  // namespace sluice::daemon
