// The load generator's engine: a few threads, each with its own epoll set of non-blocking
// connections ("Conn"s) to the server under test, keeping requests in flight.
//
// A request ("unit") carries `batch` checks: one datagram, one frame, or a group of pipelined
// commands written together. Each connection keeps at most its own window of units in flight.
//
// Closed loop (rate 0): every connection is refilled to its window as soon as answers come back,
// so the figure is the most the server answers with that many requests in flight.
// Open loop (rate R checks/s): units are due at fixed intervals (R / threads / batch per second
// per thread) and sent on a connection with room. The generator wakes at most every
// kOpenLoopTickNs and sends what has come due (so its own wake-ups do not eat the CPU the server
// needs); how late each unit left against its schedule is kept apart (`send_lag`), and units
// still unsent at the end (every window full: the server is not keeping up) are `unsent`.
//
// Latency of a unit is answer time minus send time (std::chrono::steady_clock); each check of a
// batch is recorded with its unit's latency. Only answers that arrive inside the measured window
// (after the warm-up, before the end) count towards checks/s and the histogram.
//
// Threads: each generator thread owns its connections, KeyStream and RowStats; the driver merges
// the stats after joining the threads. Nothing is shared while a row runs, except for intervals:
//
// Intervals (DriveOptions::interval_s > 0, for long runs such as the soak): the measured window is
// cut into intervals of interval_s from its start. At each boundary every thread hands what it
// counted since the last one (answers, latencies, errors, losses) to an IntervalMerge and starts
// afresh; when the last thread has handed interval i, `on_interval(i, by_thread)` runs once, on
// that generator thread, with one RowStats per thread (so a caller that gives each thread its own
// transport can tell them apart). Calls never overlap (they run under the merge's lock) and come
// in index order (every thread hands interval i in before i + 1), so a caller needs no lock or
// sort of its own. Keep it short: the thread is not sending while it runs. Errors
// and losses seen during the warm-up land in interval 0; a last, shorter interval is reported
// when the window does not divide evenly. drive() still returns the whole row's totals.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/json_rows.h"
#include "load/histogram.h"

namespace sluice::bench {

class ChildProcess;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Wall-clock time for the protocols that carry it (Lua ARGV, minute buckets).
inline int64_t epoch_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline constexpr int64_t kOpenLoopTickNs = 50'000;

struct RowStats {
  LatencyHistogram latency;
  LatencyHistogram send_lag;   // open loop: send time minus scheduled time, per unit
  LatencyHistogram arrival;    // UDP: send -> the answer's kernel receive timestamp, per check
  uint64_t checks = 0;         // checks answered inside the measured window
  uint64_t units = 0;          // requests (datagrams, frames, command groups) answered in it
  uint64_t denied = 0;         // checks answered "not allowed" (should stay 0)
  uint64_t errors = 0;         // error replies, malformed or unexpected answers
  uint64_t lost = 0;           // UDP requests unanswered within the timeout
  uint64_t send_failures = 0;  // UDP sends refused by the local kernel (EAGAIN, ENOBUFS)
  uint64_t late_answers = 0;   // UDP answers that came after their request was given up
  uint64_t conn_failures = 0;  // connections that closed or failed during the row
  uint64_t unsent = 0;         // open loop: units due but never sent
  // Payload bytes of the units answered in the window (requests as sent, answers as received:
  // UDP datagrams, TCP bytes with their framing), for bytes on the wire per check.
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  double seconds = 0;       // length of the measured window
  std::string first_error;  // the first error seen, for the report

  void merge(const RowStats& o);
  void note_error(const std::string& what) {
    ++errors;
    if (first_error.empty()) first_error = what;
  }
};

// The sequence of key indices one thread draws from: uniform or Zipf(s) over [0, keys),
// pre-drawn into a ring so sampling costs nothing while timing.
class KeyStream {
 public:
  KeyStream(uint32_t keys, bool zipf, double zipf_s, uint64_t seed);
  uint32_t next() { return ring_[pos_++ & (ring_.size() - 1)]; }

 private:
  std::vector<uint32_t> ring_;
  size_t pos_ = 0;
};

// Where a connection reports completions; only those inside the measured window count.
struct Recorder {
  RowStats* stats = nullptr;
  int64_t measure_from_ns = 0;
  int64_t measure_to_ns = 0;
  bool in_window(int64_t now) const { return now >= measure_from_ns && now < measure_to_ns; }
  // Returns whether it counted (the answer came inside the window).
  bool complete(int64_t start_ns, int64_t now, uint32_t checks) {
    if (!in_window(now)) return false;
    stats->checks += checks;
    stats->units += 1;
    stats->latency.record(static_cast<uint64_t>(now > start_ns ? now - start_ns : 0), checks);
    return true;
  }
  // complete(), and the unit's bytes each way when it counted.
  bool complete(int64_t start_ns, int64_t now, uint32_t checks, size_t sent, size_t received) {
    if (!complete(start_ns, now, checks)) return false;
    stats->bytes_sent += sent;
    stats->bytes_received += received;
    return true;
  }
};

// Per-thread context handed to connection factories.
struct ThreadContext {
  unsigned thread_index = 0;
  KeyStream* keys = nullptr;
  Recorder* recorder = nullptr;
};

// One connection (TCP) or socket (UDP) and the protocol spoken on it.
class Conn {
 public:
  virtual ~Conn();
  int fd() const { return fd_; }
  bool failed() const { return failed_; }

  // True when another unit may be started now (the window has room).
  virtual bool has_room() const = 0;
  // Starts one unit timed from start_ns. TCP output may stay buffered until flush().
  virtual void send(int64_t start_ns) = 0;
  // Writes buffered output as far as the socket takes it.
  virtual void flush() {}
  virtual bool wants_write() const { return false; }
  // Reads and handles everything available now.
  virtual void on_readable(int64_t now) = 0;
  // Gives up on requests older than their timeout (UDP).
  virtual void expire(int64_t /*now*/) {}

 protected:
  explicit Conn(int fd) : fd_(fd) {}
  void fail() { failed_ = true; }
  int fd_;
  bool failed_ = false;
};

using ConnFactory = std::function<std::unique_ptr<Conn>(ThreadContext&)>;

struct DriveOptions {
  unsigned threads = 1;  // generator threads (1 or 2)
  unsigned conns = 16;   // connections or sockets, spread over the threads
  uint32_t batch = 1;    // checks per unit (for open-loop pacing)
  double rate = 0;       // offered checks/s; 0 = closed loop
  double warmup_s = 0.5;
  double seconds = 5;
  uint32_t keys = 10'000;
  bool zipf = false;
  double zipf_s = 0.99;
  uint64_t seed = 1;
  // Open loop: time each unit from its scheduled send time instead of the moment it left, so a
  // unit that waited for a free window is charged the wait (no coordinated omission). Off: the
  // wait is only in `send_lag`.
  bool latency_from_schedule = false;
  // > 0: report the stats of every interval of this many seconds to on_interval (see above).
  double interval_s = 0;
  std::function<void(unsigned index, const std::vector<RowStats>& by_thread)> on_interval;
};

// Runs one row. Throws std::runtime_error when connections cannot be made at all.
RowStats drive(const DriveOptions& opt, const ConnFactory& make_conn);

// The CPU each side used over a row, in cores: this process (the generator), the server under
// test (every thread of `server`) and everything else on the machine, kernel included.
struct Cores {
  double generator = 0, server = 0, other = 0;
};
// drive(), and the cores each side used while it ran.
RowStats drive(const DriveOptions& opt, const ConnFactory& make_conn, pid_t server, Cores& cores);

// Stops a server after its rows: says on stderr when it exited during them, and prints the tail of
// its log (what it logged at warn and above).
void stop_server(ChildProcess& p, const std::string& program, const std::string& name);

// The end of a run whose servers are stopped: 130 after SIGINT/SIGTERM (saying so on stderr),
// else 0 after the --json line of `out`.
int finish_run(const Rows& out, const std::string& program);

// The first line of a run, on stdout: "# <program>, <date>: the machine, who shares it, what the
// rows drive (from d), and `server` (the server under test's settings).
void print_run_header(const std::string& program, const DriveOptions& d, const std::string& server);

// A row's "notes": "what N" for each count above 0 of the driver's (denied, late, send-EAGAIN)
// and then of `more` (the scenario's own), the UDP answers' latency at the socket, the first error.
std::string row_notes(const RowStats& st, const std::vector<std::pair<std::string, double>>& more);

// The figures every scenario reports of a row, as JSON fields: checks_per_sec, p50_us, p99_us,
// p999_us, max_us, server_cpu_us_per_check (the server's CPU per answered check), server_cores,
// generator_cores, other_cores, errors, lost, unsent, conn_failures, seconds.
Row row_figures(const RowStats& st, const Cores& cores);

}  // namespace sluice::bench
