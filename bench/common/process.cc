#include "common/process.h"

#include "free_port.h"

#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string_view>
#include <thread>

namespace sluice::bench {

namespace {

volatile sig_atomic_t g_stop = 0;

extern "C" void on_stop_signal(int) {
  g_stop = 1;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking call returns EINTR and the loop sees the flag
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  // A peer that closes while we write must be an error value, not a dead benchmark.
  signal(SIGPIPE, SIG_IGN);
}

bool stop_requested() {
  return g_stop != 0;
}

std::string ChildProcess::start(const std::vector<std::string>& argv, const std::string& log_path,
                                const std::string& run_as) {
  if (argv.empty()) return "empty command";
  bool switch_user = false;
  uid_t uid = 0;
  gid_t gid = 0;
  if (!run_as.empty() && ::geteuid() == 0) {
    const passwd* pw = ::getpwnam(run_as.c_str());  // before fork: not async-signal-safe
    if (pw == nullptr) return "no user " + run_as;
    switch_user = true;
    uid = pw->pw_uid;
    gid = pw->pw_gid;
  }
  name_ = argv[0];
  log_path_ = log_path;
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return "cannot open " + log_path + ": " + std::strerror(errno);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    return std::string("fork: ") + std::strerror(errno);
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec. Credentials first: changing them clears
    // the death signal.
    if (switch_user && (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0)) {
      ::_exit(126);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGINT, &dfl, nullptr);
    ::sigaction(SIGTERM, &dfl, nullptr);
    ::sigaction(SIGHUP, &dfl, nullptr);
    ::sigaction(SIGPIPE, &dfl, nullptr);
    ::setpgid(0, 0);  // a terminal's Ctrl-C reaches the benchmark only; it stops the children
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execvp(args[0], args.data());
    const char msg[] = "exec failed\n";
    [[maybe_unused]] const ssize_t w = ::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(log_fd);
  pid_ = pid;
  exit_status_.clear();
  return "";
}

bool ChildProcess::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_status_ = describe_status(status);
    pid_ = -1;
    return false;
  }
  return true;
}

void ChildProcess::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  // Bounded: at most grace / 10 ms polls.
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      if (r == pid_) exit_status_ = describe_status(status);
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  int status = 0;
  if (::waitpid(pid_, &status, 0) == pid_) exit_status_ = describe_status(status);
  pid_ = -1;
}

uint16_t free_loopback_port() {
  // Below the ephemeral range, never the same port twice (tests/support/free_port.h says why a
  // port the kernel picks for a bind to port 0 is not safe to hand to a child).
  const uint16_t port = testing::free_loopback_port();
  if (port == 0) throw std::runtime_error("no free loopback port");
  return port;
}

std::string file_tail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (s.size() > max_bytes) s = "..." + s.substr(s.size() - max_bytes);
  return s;
}

std::string self_exe_path() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

std::string sibling_sluiced() {
  const std::filesystem::path self = self_exe_path();
  if (self.empty()) return "";
  return (self.parent_path().parent_path() / "daemon" / "sluiced").string();
}

void wait_ready(ChildProcess& child, const std::function<std::string()>& probe, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string last = "not started";
  while (std::chrono::steady_clock::now() < deadline && !stop_requested()) {
    if (!child.running()) {
      throw std::runtime_error(child.name() + " exited (" + child.exit_status() + "); log:\n" +
                               file_tail(child.log_path()));
    }
    last = probe();
    if (last.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw std::runtime_error(child.name() + " did not answer within " + std::to_string(timeout_ms) +
                           " ms (" + last + "); log:\n" + file_tail(child.log_path()));
}

uint64_t proc_status_kb(pid_t pid, const char* field) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  const std::string want = std::string(field) + ":";
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(want)) return std::strtoull(line.c_str() + want.size(), nullptr, 10);
  }
  return 0;
}

namespace {

constexpr std::string_view kTempPrefix = "sluice-bench-load-";

void remove_stale_temp_dirs(const std::filesystem::path& base) {
  std::error_code ec;
  // Bounded by the directory's entries.
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    if (!e.path().filename().string().starts_with(kTempPrefix)) continue;
    std::ifstream in(e.path() / "pid");
    long pid = 0;
    if (!(in >> pid) || pid <= 0) continue;  // not ours, or still being set up
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) continue;  // still running
    std::error_code rm;
    std::filesystem::remove_all(e.path(), rm);
  }
}

}  // namespace

TempDir::TempDir() : testing::TempDir(std::string(kTempPrefix.substr(0, kTempPrefix.size() - 1))) {
  std::ofstream(path + "/pid") << ::getpid() << "\n";
  remove_stale_temp_dirs(std::filesystem::path(path).parent_path());
}

int run_stoppable(const char* program, const std::function<int()>& run) {
  install_stop_signals();
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace sluice::bench
