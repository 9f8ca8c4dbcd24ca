// CPU accounting and pinning for the benchmarks: what a process, this process and the whole
// machine have spent on the CPU so far (read before and after a row; the difference over the
// row's wall time is in cores), a process's memory, and which CPUs a process or a thread may run
// on.
//
// The readers return 0 when the process or the file is gone (a row then reports 0 cores rather
// than failing). Pinning returns "" or why it failed (a CPU the machine does not have, a process
// that has exited); it never throws.
//
// Thread safety: every function may be called from any thread. pin_process() sets each thread of
// the process that exists at the call; threads started later inherit their creator's set.
#pragma once

#include <sched.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace sluice::bench {

// The text after "<key>:" on the first line of a /proc file that starts with key, blanks
// skipped ("" when there is none): /proc/PID/status, /proc/cpuinfo.
inline std::string proc_field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(key)) continue;
    const size_t colon = line.find(':');
    const size_t value = line.find_first_not_of(" \t", colon + 1);
    return colon == std::string::npos || value == std::string::npos ? "" : line.substr(value);
  }
  return "";
}

// CPU seconds (user + system) used so far by process `pid`, all its threads (/proc/PID/stat).
inline double process_cpu_seconds(pid_t pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  unsigned long utime = 0, stime = 0;    // fields 14 and 15; field 3 (the state) follows the name
  if (close == std::string::npos ||
      std::sscanf(stat.c_str() + close + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                  &utime, &stime) != 2)
    return 0;
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// CPU seconds of a clock_gettime clock.
inline double clock_seconds(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// CPU seconds (user + system) used so far by this process, all its threads.
inline double self_cpu_seconds() {
  return clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
}

// CPU ms used so far by the calling thread: a pass's cost on its thread.
inline double thread_cpu_ms() {
  return clock_seconds(CLOCK_THREAD_CPUTIME_ID) * 1e3;
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

// Lets thread `tid` (0: the calling thread) run only on `cpus` (empty: every online CPU); "" or
// why not. Threads it starts afterwards inherit the set, so pinning the thread that calls drive()
// pins the generator's threads.
inline std::string pin_thread(pid_t tid, const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (long c = 0, n = ::sysconf(_SC_NPROCESSORS_ONLN); cpus.empty() && c < n; ++c)
    CPU_SET(static_cast<size_t>(c), &set);
  for (int c : cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(static_cast<size_t>(c), &set);
  }
  // A thread that exits between a listing of threads and here is not an error.
  if (::sched_setaffinity(tid, sizeof set, &set) != 0 && (tid == 0 || errno != ESRCH))
    return "sched_setaffinity(" + std::to_string(tid) + "): " + std::strerror(errno);
  return "";
}

inline std::string pin_this_thread(const std::vector<int>& cpus) {
  return pin_thread(0, cpus);
}

// Lets every thread of process `pid` run only on `cpus` (empty: on every CPU), as
// `taskset -a -p` does: each thread (/proc/PID/task/TID) gets the set.
inline std::string pin_process(pid_t pid, const std::vector<int>& cpus) {
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/task", ec);
  if (ec) return "process " + std::to_string(pid) + ": " + ec.message();
  size_t pinned = 0;
  for (const auto& task : it) {
    const auto tid = static_cast<pid_t>(std::strtol(task.path().filename().c_str(), nullptr, 10));
    if (tid <= 0) continue;
    if (std::string why = pin_thread(tid, cpus); !why.empty()) return why;
    ++pinned;
  }
  return pinned == 0 ? "process " + std::to_string(pid) + " has no threads" : "";
}

// A memory figure of a process in KiB from /proc/<pid>/status ("VmRSS", "VmHWM": the peak RSS),
// or 0 when the process or the field is gone.
inline uint64_t proc_status_kb(pid_t pid, const char* field = "VmRSS") {
  if (pid <= 0) return 0;
  const std::string path = "/proc/" + std::to_string(pid) + "/status";
  return std::strtoull(proc_field(path, std::string(field) + ":").c_str(), nullptr, 10);
}

// The machine's CPU model (/proc/cpuinfo "model name"), for the report's header.
inline std::string cpu_model() {
  const std::string model = proc_field("/proc/cpuinfo", "model name");
  return model.empty() ? "unknown CPU" : model;
}

}  // namespace sluice::bench
