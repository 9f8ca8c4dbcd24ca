#include "common/process.h"

#include "free_port.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
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
  for (const int sig : {SIGINT, SIGTERM, SIGHUP})
    sigaction(sig, &sa, nullptr);
  // A peer that closes while we write must be an error value, not a dead benchmark.
  signal(SIGPIPE, SIG_IGN);
}

bool stop_requested() {
  return g_stop != 0;
}

std::string ChildProcess::start(const std::vector<std::string>& argv, const std::string& log_path,
                                const std::string& run_as) {
  if (argv.empty()) return "empty command";
  const passwd* pw = nullptr;  // looked up before fork: getpwnam is not async-signal-safe
  if (!run_as.empty() && ::geteuid() == 0 && (pw = ::getpwnam(run_as.c_str())) == nullptr)
    return "no user " + run_as;
  name_ = argv[0];
  log_path_ = log_path;
  std::vector<char*> args;
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
    if (pw != nullptr &&
        (::setgroups(0, nullptr) != 0 || ::setgid(pw->pw_gid) != 0 || ::setuid(pw->pw_uid) != 0))
      ::_exit(126);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE})
      ::signal(sig, SIG_DFL);
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

bool ChildProcess::reap(bool block) {
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  if (r == pid_)
    exit_status_ = describe_status(status);
  else if (r == 0 || errno != ECHILD)
    return false;
  pid_ = -1;
  return true;
}

bool ChildProcess::running() {
  return pid_ > 0 && !reap(false);
}

void ChildProcess::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  // Bounded: at most grace / 10 ms polls.
  while (!reap(false)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      reap(true);
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

uint16_t free_loopback_port() {
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
  std::error_code ec;  // on error: an empty path
  return std::filesystem::read_symlink("/proc/self/exe", ec).string();
}

std::string sibling_sluiced() {
  const std::filesystem::path self = self_exe_path();
  return self.empty() ? "" : (self.parent_path().parent_path() / "daemon" / "sluiced").string();
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

TempDir::TempDir() : testing::TempDir("sluice-bench-load") {
  std::ofstream(path + "/pid") << ::getpid() << "\n";
  // Directories of earlier runs whose process is gone; bounded by the directory's entries.
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(path).parent_path(), ec)) {
    std::ifstream in(e.path() / "pid");
    long pid = 0;
    if (!e.path().filename().string().starts_with("sluice-bench-load-") || !(in >> pid) || pid <= 0)
      continue;  // not ours, or still being set up
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)
      std::filesystem::remove_all(e.path(), ec);
  }
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
