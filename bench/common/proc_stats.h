// CPU accounting and pinning for the benchmarks: what a process, this process and the whole
// machine have spent on the CPU so far (read before and after a row; the difference over the
// row's wall time is in cores), and which CPUs a process or a thread may run on.
//
// The readers return 0 when the process or the file is gone (a row then reports 0 cores rather
// than failing). Pinning returns "" or why it failed (a CPU the machine does not have, a process
// that has exited); it never throws.
//
// Thread safety: every function may be called from any thread. pin_process() sets each thread of
// the process that exists at the call; threads started later inherit their creator's set.
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace sluice::bench {

// CPU seconds (user + system) used so far by process `pid`, all its threads (/proc/PID/stat).
inline double process_cpu_seconds(pid_t pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 > stat.size()) return 0;
  std::istringstream f(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  // Fields after the name start at 3 (state); utime is 14, stime 15.
  for (int i = 3; i <= 15 && f >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::strtod(field.c_str(), nullptr);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// CPU seconds (user + system) used so far by this process, all its threads.
inline double self_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return s(u.ru_utime) + s(u.ru_stime);
}

// CPU ms used so far by the calling thread (CLOCK_THREAD_CPUTIME_ID): a pass's cost on its thread.
inline double thread_cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// CPU seconds every CPU of the machine spent busy so far (/proc/stat: user, nice, system, irq,
// softirq and steal; not idle or iowait).
inline double machine_busy_seconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;
  double v[8] = {};
  for (double& x : v)
    in >> x;
  return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// The CPUs this machine has online, by number (0, 1, ...).
inline std::vector<int> online_cpus() {
  std::vector<int> cpus;
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  for (long i = 0; i < n; ++i)
    cpus.push_back(static_cast<int>(i));
  return cpus;
}

// The CPUs thread (or process) `tid` may run on; 0: the calling thread. Empty when unknown.
inline std::vector<int> cpus_allowed(pid_t tid) {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(tid, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(static_cast<size_t>(c), &set)) cpus.push_back(c);
  }
  return cpus;
}

// A CPU set of `cpus`; empty means every online CPU.
inline cpu_set_t cpu_set_of(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus.empty() ? online_cpus() : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(static_cast<size_t>(c), &set);
  }
  return set;
}

// Lets the calling thread run only on `cpus` (empty: on every CPU). Threads it starts afterwards
// inherit the set, so pinning the thread that calls drive() pins the generator's threads.
inline std::string pin_this_thread(const std::vector<int>& cpus) {
  const cpu_set_t set = cpu_set_of(cpus);
  if (::sched_setaffinity(0, sizeof set, &set) != 0) {
    return std::string("sched_setaffinity: ") + std::strerror(errno);
  }
  return "";
}

// Lets every thread of process `pid` run only on `cpus` (empty: on every CPU), as
// `taskset -a -p` does: each thread (/proc/PID/task/TID) gets the set.
inline std::string pin_process(pid_t pid, const std::vector<int>& cpus) {
  const cpu_set_t set = cpu_set_of(cpus);
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/task", ec);
  if (ec) return "process " + std::to_string(pid) + ": " + ec.message();
  size_t pinned = 0;
  for (const auto& task : it) {
    const pid_t tid = static_cast<pid_t>(std::strtol(task.path().filename().c_str(), nullptr, 10));
    if (tid <= 0) continue;
    // A thread that exits between the listing and here is not an error.
    if (::sched_setaffinity(tid, sizeof set, &set) != 0 && errno != ESRCH) {
      return "sched_setaffinity(" + std::to_string(tid) + "): " + std::strerror(errno);
    }
    ++pinned;
  }
  if (pinned == 0) return "process " + std::to_string(pid) + " has no threads";
  return "";
}

// The machine's CPU model (/proc/cpuinfo "model name"), for the report's header.
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("model name")) {
      const size_t p = line.find(':');
      return p == std::string::npos ? "" : line.substr(p + 2);
    }
  }
  return "unknown CPU";
}

}  // namespace sluice::bench
