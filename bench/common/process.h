// Child processes of the benchmarks: start, wait until they answer, stop. Nothing is left
// running when the benchmark ends, fails or is interrupted:
//   - every child gets PR_SET_PDEATHSIG(SIGKILL), so it dies even if the benchmark is killed -9;
//   - ChildProcess's destructor stops it (SIGTERM, then SIGKILL after a grace period);
//   - install_stop_signals() turns SIGINT/SIGTERM/SIGHUP into stop_requested(), which every
//     benchmark loop polls, so the normal unwinding path runs the destructors.
//
// Thread safety: spawn and stop from the main thread only (the death signal is tied to the
// thread that forked).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/proc_stats.h"
#include "temp_dir.h"

namespace sluice::bench {

void install_stop_signals();
bool stop_requested();

// The body of a scenario that runs child processes: installs the stop signals, runs `run` and
// returns its exit status, or prints "<program>: <what>" and returns 1 when it throws.
int run_stoppable(const char* program, const std::function<int()>& run);

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess() { stop(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts argv[0] (looked up in PATH when it has no '/') with stdout and stderr appended to
  // log_path. With run_as non-empty (and only when running as root), the child switches to that
  // user before exec: a server that switched by itself (memcached -u) would lose its death
  // signal, which the kernel clears on any change of credentials. Returns "" or why it could not
  // start.
  std::string start(const std::vector<std::string>& argv, const std::string& log_path,
                    const std::string& run_as = "");
  // True while the child has not exited (reaps it when it has).
  bool running();
  // SIGTERM, wait up to `grace`, then SIGKILL and reap. Idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(3000));

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  const std::string& log_path() const { return log_path_; }
  // How the child ended ("exit 2", "signal 9"), once it has.
  const std::string& exit_status() const { return exit_status_; }

 private:
  // Reaps the child if it has exited (block: waits until it has); true when it is gone.
  bool reap(bool block);

  pid_t pid_ = -1;
  std::string name_;
  std::string log_path_;
  std::string exit_status_;
};

// A loopback port for a child, free for TCP and UDP (tests/support/free_port.h); throws if none.
uint16_t free_loopback_port();

// The last `max_bytes` of a file, for error messages.
std::string file_tail(const std::string& path, size_t max_bytes = 2000);

// Path of the running executable (/proc/self/exe), "" if unknown; the sluiced of the same build
// tree (<build>/bench/<this program> -> <build>/daemon/sluiced).
std::string self_exe_path();
std::string sibling_sluiced();

// Waits until probe() returns "" (bounded by timeout_ms, polled every 20 ms). Throws
// std::runtime_error with the child's log tail when it exits first or does not answer in time.
void wait_ready(ChildProcess& child, const std::function<std::string()>& probe, int timeout_ms);

// The tests' TempDir (tests/support/temp_dir.h), named sluice-bench-load-*, with a file "pid"
// naming the benchmark's process; the constructor also removes directories of earlier runs whose
// process is gone (killed -9, so their destructor never ran).
struct TempDir : testing::TempDir {
  TempDir();
};

}  // namespace sluice::bench
