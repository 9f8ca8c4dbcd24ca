#include "load/driver.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "common/proc_stats.h"
#include "common/process.h"

namespace sluice::bench {

Conn::~Conn() {
  if (fd_ >= 0) ::close(fd_);
}

void RowStats::merge(const RowStats& o) {
  latency.merge(o.latency);
  send_lag.merge(o.send_lag);
  arrival.merge(o.arrival);
  checks += o.checks;
  units += o.units;
  denied += o.denied;
  errors += o.errors;
  lost += o.lost;
  send_failures += o.send_failures;
  late_answers += o.late_answers;
  conn_failures += o.conn_failures;
  unsent += o.unsent;
  bytes_sent += o.bytes_sent;
  bytes_received += o.bytes_received;
  if (first_error.empty()) first_error = o.first_error;
}

KeyStream::KeyStream(uint32_t keys, bool zipf, double zipf_s, uint64_t seed) {
  constexpr size_t kRing = size_t{1} << 20;
  ring_.resize(kRing);
  std::mt19937_64 rng(seed);
  if (!zipf) {
    std::uniform_int_distribution<uint32_t> d(0, keys - 1);
    for (uint32_t& k : ring_)
      k = d(rng);
    return;
  }
  // Zipf(s) by inverse CDF: rank r (0-based) has weight 1 / (r + 1)^s. Ranks are scattered over
  // the key indices so the hot keys are not neighbours.
  std::vector<double> cdf(keys);
  double sum = 0;
  for (uint32_t r = 0; r < keys; ++r) {
    sum += 1.0 / std::pow(static_cast<double>(r) + 1.0, zipf_s);
    cdf[r] = sum;
  }
  std::vector<uint32_t> perm(keys);
  for (uint32_t i = 0; i < keys; ++i)
    perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_real_distribution<double> u(0.0, sum);
  for (uint32_t& k : ring_) {
    const auto it = std::lower_bound(cdf.begin(), cdf.end(), u(rng));
    const auto r = static_cast<size_t>(std::min<ptrdiff_t>(it - cdf.begin(), keys - 1));
    k = perm[r];
  }
}

namespace {

struct ThreadResult {
  RowStats stats;
  std::string fatal;
};

// Collects each thread's stats of an interval; the last thread to hand interval i in calls
// on_interval. `mu` guards `pending` (by interval: the stats by thread, and how many handed in).
struct IntervalMerge {
  const DriveOptions& opt;
  std::mutex mu;
  std::map<unsigned, std::pair<std::vector<RowStats>, unsigned>> pending;

  void hand_in(unsigned index, unsigned thread, const RowStats& s) {
    std::lock_guard<std::mutex> lock(mu);
    auto& [by_thread, handed] = pending[index];
    by_thread.resize(opt.threads);
    by_thread[thread] = s;
    if (++handed < opt.threads) return;
    if (opt.on_interval) opt.on_interval(index, by_thread);
    pending.erase(index);
  }
};

void run_thread(const DriveOptions& opt, const ConnFactory& make_conn, unsigned t, unsigned nconns,
                int64_t t0, ThreadResult& out, IntervalMerge* intervals) {
  KeyStream keys(opt.keys, opt.zipf, opt.zipf_s, opt.seed * 1'000'003u + t);
  const int64_t from = t0 + static_cast<int64_t>(opt.warmup_s * 1e9);  // the measured window
  Recorder rec{&out.stats, from, from + static_cast<int64_t>(opt.seconds * 1e9)};
  ThreadContext ctx{t, &keys, &rec};

  struct Slot {
    std::unique_ptr<Conn> conn;
    bool out_registered = false;
    bool dead = false;
  };
  std::vector<Slot> conns;
  try {
    for (unsigned i = 0; i < nconns; ++i)
      conns.push_back(Slot{make_conn(ctx)});
  } catch (const std::exception& e) {
    out.fatal = e.what();
    return;
  }
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) {
    out.fatal = "epoll_create1 failed";
    return;
  }
  for (Slot& s : conns) {
    epoll_event ev{EPOLLIN, {.ptr = &s}};
    ::epoll_ctl(ep, EPOLL_CTL_ADD, s.conn->fd(), &ev);
  }
  // After any I/O on a connection: retires it when it failed, else watches EPOLLOUT while it has
  // output waiting.
  auto settle = [&](Slot& s) {
    if (s.dead) return;
    if (s.conn->failed()) {
      s.dead = true;
      ++out.stats.conn_failures;
      ::epoll_ctl(ep, EPOLL_CTL_DEL, s.conn->fd(), nullptr);
      return;
    }
    const bool want = s.conn->wants_write();
    if (want == s.out_registered) return;
    epoll_event ev{EPOLLIN | (want ? EPOLLOUT : 0u), {.ptr = &s}};
    ::epoll_ctl(ep, EPOLL_CTL_MOD, s.conn->fd(), &ev);
    s.out_registered = want;
  };
  // Closed loop: sends until the connection's window is full.
  auto refill = [&](Slot& s, int64_t now) {
    settle(s);
    if (s.dead) return;
    for (int guard = 0; guard < 4096 && s.conn->has_room(); ++guard)
      s.conn->send(now);
    s.conn->flush();
    settle(s);
  };

  const bool open_loop = opt.rate > 0;
  // Open loop: unit k (from 0) is due at sched(k); units 0 .. due_by(t)-1 are due by t.
  const double unit_rate = open_loop ? opt.rate / opt.threads / opt.batch : 0;
  auto sched = [&](uint64_t k) {
    return t0 + static_cast<int64_t>(static_cast<double>(k) / unit_rate * 1e9);
  };
  auto due_by = [&](int64_t time) -> uint64_t {
    return time < t0 ? 0
                     : static_cast<uint64_t>(static_cast<double>(time - t0) * 1e-9 * unit_rate) + 1;
  };
  const int64_t end = rec.measure_to_ns;
  uint64_t sent_units = 0;
  size_t rr = 0;
  std::vector<Slot*> touched;  // open loop: connections written to in this pass
  touched.reserve(conns.size());

  int64_t now = now_ns();
  if (!open_loop) {
    for (Slot& s : conns)
      refill(s, now);
  }

  constexpr int kMaxEvents = 256;
  epoll_event events[kMaxEvents];
  int64_t next_expire = now + 10'000'000;
  // Intervals: the stats since the last boundary live in out.stats (the connections write there);
  // at a boundary they move to `total` and out.stats starts afresh.
  const auto interval_ns = static_cast<int64_t>(opt.interval_s * 1e9);
  unsigned interval_index = 0;
  int64_t next_boundary = intervals != nullptr ? rec.measure_from_ns + interval_ns : INT64_MAX;
  RowStats total;
  auto close_interval = [&] {
    intervals->hand_in(interval_index++, t, out.stats);
    total.merge(out.stats);
    out.stats = RowStats{};
  };
  // Every loop is bounded in time (the row's end) and in count (max_iterations).
  const uint64_t max_iterations = static_cast<uint64_t>((opt.warmup_s + opt.seconds) * 2e6) + 1000;
  for (uint64_t iter = 0; iter < max_iterations; ++iter) {
    now = now_ns();
    if (now >= end || stop_requested()) break;
    if (now >= next_boundary) {
      close_interval();
      next_boundary += interval_ns;
    }

    int64_t wait_ns = 1'000'000;
    if (open_loop) {
      touched.clear();
      for (const uint64_t due = due_by(now); sent_units < due; ++sent_units) {
        Slot* pick = nullptr;
        for (size_t k = 0; k < conns.size() && pick == nullptr; ++k) {
          Slot& s = conns[(rr + k) % conns.size()];
          if (!s.dead && s.conn->has_room()) {
            pick = &s;
            rr = (rr + k + 1) % conns.size();
          }
        }
        if (pick == nullptr) break;  // every window is full: the backlog waits (and ages)
        const int64_t due_at = sched(sent_units);
        if (rec.in_window(now))
          out.stats.send_lag.record(static_cast<uint64_t>(std::max<int64_t>(now - due_at, 0)));
        pick->conn->send(opt.latency_from_schedule ? due_at : now);
        if (std::find(touched.begin(), touched.end(), pick) == touched.end())
          touched.push_back(pick);
      }
      for (Slot* s : touched) {
        s->conn->flush();
        settle(*s);
      }
      wait_ns = std::clamp<int64_t>(sched(sent_units) - now_ns(), kOpenLoopTickNs, 1'000'000);
    }

    timespec ts{0, static_cast<long>(wait_ns)};
    const int n = ::epoll_pwait2(ep, events, kMaxEvents, &ts, nullptr);
    now = now_ns();
    for (int i = 0; i < n; ++i) {
      Slot& s = *static_cast<Slot*>(events[i].data.ptr);
      if (s.dead) continue;
      if (events[i].events & EPOLLOUT) s.conn->flush();
      if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) s.conn->on_readable(now);
      if (open_loop) {
        settle(s);
      } else {
        refill(s, now);
      }
    }
    if (now >= next_expire) {
      next_expire = now + 10'000'000;
      size_t alive = 0;
      for (Slot& s : conns) {
        if (s.dead) continue;
        s.conn->expire(now);
        if (!open_loop) refill(s, now);
        alive += s.dead ? 0 : 1;
      }
      if (alive == 0) {
        out.fatal = "every connection failed" +
                    (out.stats.first_error.empty() ? "" : ": " + out.stats.first_error);
        break;
      }
    }
  }
  // Open loop: units due up to one tick before the end were late; later ones were not, the row
  // just ended.
  if (open_loop)
    out.stats.unsent = std::max(due_by(end - kOpenLoopTickNs), sent_units) - sent_units;
  ::close(ep);
  if (intervals != nullptr) {
    // The last interval, shorter when the window does not divide evenly; a stop or a fatal error
    // hands in what was counted so far, so every thread reaches the same count of intervals.
    const auto planned = static_cast<unsigned>((end - rec.measure_from_ns + interval_ns - 1) /
                                               std::max<int64_t>(interval_ns, 1));
    do {
      close_interval();
    } while (interval_index < planned);
    out.stats = std::move(total);
  }
}

}  // namespace

RowStats drive(const DriveOptions& opt, const ConnFactory& make_conn) {
  const unsigned threads = std::max(1u, std::min(opt.threads, opt.conns));
  std::vector<ThreadResult> results(threads);
  std::vector<std::thread> pool;
  // Every thread starts on the same clock (after time to connect), so open-loop pacing and the
  // windows line up.
  const int64_t t0 = now_ns() + 50'000'000;
  DriveOptions o = opt;
  o.threads = threads;
  std::unique_ptr<IntervalMerge> intervals;
  if (o.interval_s > 0) intervals = std::make_unique<IntervalMerge>(o);
  for (unsigned t = 0; t < threads; ++t) {
    const unsigned n = opt.conns / threads + (t < opt.conns % threads ? 1 : 0);
    pool.emplace_back([&o, &make_conn, t, n, t0, &results, &intervals] {
      run_thread(o, make_conn, t, n, t0, results[t], intervals.get());
    });
  }
  for (std::thread& th : pool)
    th.join();
  RowStats total;
  for (const ThreadResult& r : results) {
    if (!r.fatal.empty()) throw std::runtime_error(r.fatal);
    total.merge(r.stats);
  }
  total.seconds = opt.seconds;
  return total;
}

RowStats drive(const DriveOptions& opt, const ConnFactory& make_conn, pid_t server, Cores& cores) {
  const double g0 = self_cpu_seconds(), s0 = process_cpu_seconds(server);
  const double m0 = machine_busy_seconds();
  const int64_t w0 = now_ns();
  RowStats st = drive(opt, make_conn);
  const double wall = static_cast<double>(now_ns() - w0) * 1e-9;
  cores.generator = (self_cpu_seconds() - g0) / wall;
  cores.server = (process_cpu_seconds(server) - s0) / wall;
  cores.other =
      std::max(0.0, (machine_busy_seconds() - m0) / wall - cores.generator - cores.server);
  return st;
}

void stop_server(ChildProcess& p, const std::string& program, const std::string& name) {
  if (p.pid() <= 0) return;
  if (!p.running()) {
    std::fprintf(stderr, "%s: %s exited during the run (%s)\n", program.c_str(), name.c_str(),
                 p.exit_status().c_str());
  }
  p.stop();
  const std::string tail = file_tail(p.log_path(), 1500);
  if (!tail.empty()) std::fprintf(stderr, "%s log:\n%s\n", name.c_str(), tail.c_str());
}

int finish_run(const Rows& out, const std::string& program) {
  if (stop_requested()) {
    std::fprintf(stderr, "%s: interrupted; servers stopped\n", program.c_str());
    return 130;
  }
  out.finish();
  return 0;
}

void print_run_header(const std::string& program, const DriveOptions& d,
                      const std::string& server) {
  char date[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M %Z", std::localtime(&t));
  std::printf(
      "# %s, %s: %u CPUs (%s) shared by the generator (%u thread(s)) and the server under test, "
      "%s; %u keys %s, %.1f s per row after %.1f s warm-up\n",
      program.c_str(), date, std::thread::hardware_concurrency(), cpu_model().c_str(), d.threads,
      server.c_str(), d.keys, d.zipf ? "zipf(0.99)" : "uniform", d.seconds, d.warmup_s);
}

std::string row_notes(const RowStats& st, const std::vector<std::pair<std::string, double>>& more) {
  std::string notes;
  auto add = [&](const std::string& what, const std::string& value) {
    notes += (notes.empty() ? "" : ", ") + what + " " + value;
  };
  std::vector<std::pair<std::string, double>> counts = {
      {"denied", static_cast<double>(st.denied)},
      {"late", static_cast<double>(st.late_answers)},
      {"send-EAGAIN", static_cast<double>(st.send_failures)}};
  counts.insert(counts.end(), more.begin(), more.end());
  for (const auto& [what, v] : counts)
    if (v > 0) add(what, std::to_string(std::llround(v)));
  if (st.arrival.count() > 0) {
    auto us = [&](double q) {
      return std::to_string(std::llround(static_cast<double>(st.arrival.quantile_ns(q)) / 1e3));
    };
    add("at-socket p50/p99/p99.9 us", us(0.5) + "/" + us(0.99) + "/" + us(0.999));
  }
  if (!st.first_error.empty()) add("first error:", st.first_error);
  return notes;
}

Row row_figures(const RowStats& st, const Cores& cores) {
  const double cps = st.seconds > 0 ? static_cast<double>(st.checks) / st.seconds : 0;
  auto us = [](const LatencyHistogram& h, double q) {
    return static_cast<double>(h.quantile_ns(q)) / 1000.0;
  };
  return {{"checks_per_sec", cps},
          {"p50_us", us(st.latency, 0.5)},
          {"p99_us", us(st.latency, 0.99)},
          {"p999_us", us(st.latency, 0.999)},
          {"max_us", static_cast<double>(st.latency.max_ns()) / 1000.0},
          {"server_cpu_us_per_check", cps > 0 ? cores.server / cps * 1e6 : 0},
          {"server_cores", cores.server},
          {"generator_cores", cores.generator},
          {"other_cores", cores.other},
          {"errors", st.errors},
          {"lost", st.lost},
          {"unsent", st.unsent},
          {"conn_failures", st.conn_failures},
          {"seconds", st.seconds}};
}

}  // namespace sluice::bench
