#include "sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace sluice::daemon {

ServiceNotifier ServiceNotifier::from_environment() {
  const char* s = std::getenv("NOTIFY_SOCKET");
  return ServiceNotifier(s ? s : "");
}

std::string ServiceNotifier::notify(std::string_view state) const {
  if (socket_.empty()) return {};
  if (socket_[0] != '/' && socket_[0] != '@') {
    return "NOTIFY_SOCKET=" + socket_ +
           ": only path (/...) and abstract (@...) sockets are supported";
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_.size() >= sizeof addr.sun_path) {
    return "NOTIFY_SOCKET=" + socket_ + ": longer than a socket address allows";
  }
  std::memcpy(addr.sun_path, socket_.data(), socket_.size());
  // A path is NUL-terminated (addr is zeroed); an abstract name is exactly its bytes after NUL.
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_.size());
  if (socket_[0] == '@') {
    addr.sun_path[0] = '\0';
  } else {
    len = static_cast<socklen_t>(len + 1);
  }
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::string("NOTIFY_SOCKET: socket: ") + std::strerror(errno);
  const ssize_t sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                                reinterpret_cast<const sockaddr*>(&addr), len);
  const int err = errno;
  ::close(fd);
  if (sent < 0) return "NOTIFY_SOCKET=" + socket_ + ": " + std::strerror(err);
  if (static_cast<size_t>(sent) != state.size()) return "NOTIFY_SOCKET=" + socket_ + ": short send";
  return {};
}

unsigned long long monotonic_usec() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<unsigned long long>(ts.tv_sec) * 1'000'000ull +
         static_cast<unsigned long long>(ts.tv_nsec) / 1'000ull;
}

}  // namespace sluice::daemon
