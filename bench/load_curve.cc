#include "load_curve.h"

#include <algorithm>
#include <exception>

#include "common/proc_stats.h"
#include "common/process.h"
#include "load/grpc_target.h"
#include "load/http_target.h"

namespace sluice::bench {

namespace {

struct DoorDef {
  Door door;
  std::string_view name;
};
constexpr DoorDef kDoors[] = {{Door::kUdp, "udp"},
                              {Door::kTcp, "tcp"},
                              {Door::kHttp, "http"},
                              {Door::kGrpc, "grpc"},
                              {Door::kRedis, "redis"}};

// How the generator drives one door: its connections and what each keeps in flight.
struct DoorLoad {
  ConnFactory factory;
  unsigned conns = 0;
  std::string in_flight;
  std::string error;  // the door cannot be driven
};

DoorLoad door_load(const CurveOptions& o, const DoorEndpoints& at, const Keyspace& keys, Door d) {
  DoorLoad l;
  switch (d) {
    case Door::kUdp:
    case Door::kTcp: {
      SluiceConnOptions so;
      so.port = at.check_port;
      so.batch = 1;
      so.keys = &keys;
      if (d == Door::kUdp) {
        so.window = o.udp_window;
        so.udp_room_per_check = o.udp_room;
        l.conns = o.udp_sockets;
        l.in_flight = std::to_string(l.conns) + " sock x " + std::to_string(so.window) + " dgram";
        l.factory = [so](ThreadContext& ctx) { return make_sluice_udp(so, ctx); };
      } else {
        so.window = o.tcp_window;
        l.conns = o.tcp_connections;
        l.in_flight = std::to_string(l.conns) + " conn x " + std::to_string(so.window) + " frame";
        l.factory = [so](ThreadContext& ctx) { return make_sluice_tcp(so, ctx); };
      }
      break;
    }
    case Door::kHttp: {
      HttpConnOptions ho;
      ho.port = at.admin_port;
      ho.scheme = HttpScheme::kSluiceCheck;
      ho.window = o.http_window;
      ho.keys = &keys;
      l.conns = o.http_connections;
      l.in_flight = std::to_string(l.conns) + " conn x " + std::to_string(ho.window) + " request";
      l.factory = [ho](ThreadContext& ctx) { return make_http(ho, ctx); };
      break;
    }
    case Door::kGrpc: {
      if (at.grpc_port == 0) {
        l.error = "sluiced was started without its gRPC door";
        break;
      }
      GrpcConnOptions go;
      go.port = at.grpc_port;
      go.window = o.grpc_window;
      go.keys = &keys;
      l.conns = o.grpc_connections;
      l.in_flight = std::to_string(l.conns) + " h2 conn x " + std::to_string(go.window) + " call";
      l.factory = [go](ThreadContext& ctx) { return make_grpc(go, ctx); };
      break;
    }
    case Door::kRedis: {
      if (at.redis_port == 0) {
        l.error = "sluiced was started without its Redis-protocol door";
        break;
      }
      RedisConnOptions ro;
      ro.port = at.redis_port;
      ro.batch = 1;
      ro.window = o.resp_window;
      ro.scheme = RedisScheme::kClThrottle;
      ro.gcra_burst = o.resp_burst;
      ro.gcra_count = o.resp_count;
      ro.gcra_period_s = o.resp_period_s;
      ro.keys = &keys;
      l.conns = o.resp_connections;
      l.in_flight = std::to_string(l.conns) + " conn x " + std::to_string(ro.window) + " command";
      l.factory = [ro](ThreadContext& ctx) { return make_redis(ro, ctx); };
      break;
    }
  }
  return l;
}

// Where sluiced's threads and the generator's may run: the CPUs each had when the curves
// started (unpinned; every CPU unless the benchmark itself was started under taskset), or one
// CPU each (pinned).
struct Placement {
  std::vector<int> server;
  std::vector<int> generator;
};

Placement placement(const CurveOptions& o, const Placement& unpinned, bool pinned) {
  if (!pinned) return unpinned;
  return {{o.server_cpu}, {o.generator_cpu}};
}

// Every thread of sluiced, and this thread (so the generator's threads, which it starts).
std::string pin(const DoorEndpoints& at, const Placement& where) {
  if (std::string e = pin_process(at.sluiced, where.server); !e.empty()) return "sluiced: " + e;
  if (std::string e = pin_this_thread(where.generator); !e.empty()) return "generator: " + e;
  return "";
}

CurvePoint measure(const CurveOptions& o, const DoorEndpoints& at, const DoorLoad& load,
                   const Placement& where, CurvePoint p) {
  p.in_flight = load.in_flight;
  if (!load.error.empty()) {
    p.error = load.error;
    return p;
  }
  if (p.pinned && o.server_cpu == o.generator_cpu) {
    p.error = "pinned: --server-cpu and --generator-cpu are the same CPU";
    return p;
  }
  if (std::string e = pin(at, where); !e.empty()) {
    p.error = e;
    return p;
  }
  DriveOptions d;
  d.threads = o.gen_threads;
  d.conns = load.conns;
  d.batch = 1;
  d.rate = p.offered_per_sec;
  d.latency_from_schedule = p.offered_per_sec > 0;
  d.warmup_s = o.warmup;
  d.seconds = o.seconds;
  d.keys = o.keys;
  d.zipf = o.zipf;
  const double g0 = self_cpu_seconds(), s0 = process_cpu_seconds(at.sluiced);
  const double m0 = machine_busy_seconds();
  const int64_t w0 = now_ns();
  try {
    p.stats = drive(d, load.factory);
  } catch (const std::exception& e) {
    p.error = e.what();
    return p;
  }
  const double wall = static_cast<double>(now_ns() - w0) * 1e-9;
  p.generator_cores = (self_cpu_seconds() - g0) / wall;
  p.server_cores = (process_cpu_seconds(at.sluiced) - s0) / wall;
  p.other_cores =
      std::max(0.0, (machine_busy_seconds() - m0) / wall - p.generator_cores - p.server_cores);
  return p;
}

std::string fmt(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string load_label(const CurvePoint& p) {
  return p.is_max() ? "max" : std::to_string(p.load_pct) + "%";
}

}  // namespace

std::string_view door_name(Door d) {
  for (const DoorDef& def : kDoors) {
    if (def.door == d) return def.name;
  }
  return "?";
}

std::optional<Door> door_from_name(std::string_view name) {
  for (const DoorDef& def : kDoors) {
    if (def.name == name) return def.door;
  }
  return std::nullopt;
}

bool door_available(Door d, [[maybe_unused]] std::string& why) {
  switch (d) {
    case Door::kUdp:
    case Door::kTcp:
    case Door::kHttp:
      return true;
    case Door::kGrpc:
    case Door::kRedis:
      return true;
  }
  return false;
}

double CurvePoint::checks_per_sec() const {
  return stats.seconds > 0 ? static_cast<double>(stats.checks) / stats.seconds : 0;
}

double CurvePoint::us(double q) const {
  return static_cast<double>(stats.latency.quantile_ns(q)) / 1000.0;
}

double CurvePoint::server_cpu_us_per_check() const {
  const double cps = checks_per_sec();
  return cps > 0 ? server_cores / cps * 1e6 : 0;
}

std::vector<CurvePoint> run_curves(const CurveOptions& o, const DoorEndpoints& at,
                                   const Keyspace& keys,
                                   const std::function<void(const CurvePoint&)>& on_point) {
  std::vector<CurvePoint> points;
  const Placement unpinned{cpus_allowed(at.sluiced), cpus_allowed(0)};
  auto done = [&](CurvePoint p) {
    on_point(p);
    points.push_back(std::move(p));
    return &points.back();
  };
  for (Door door : o.doors) {
    const DoorLoad load = door_load(o, at, keys, door);
    for (bool pinned : o.pinnings) {
      if (stop_requested()) break;
      CurvePoint max_point;
      max_point.door = door;
      max_point.pinned = pinned;
      const Placement where = placement(o, unpinned, pinned);
      const CurvePoint* max = done(measure(o, at, load, where, max_point));
      const double max_cps = max->error.empty() ? max->checks_per_sec() : 0;
      for (int pct : o.load_pct) {
        if (stop_requested()) break;
        CurvePoint p;
        p.door = door;
        p.pinned = pinned;
        p.load_pct = pct;
        p.offered_per_sec = max_cps * pct / 100.0;
        if (max_cps <= 0) {
          p.in_flight = load.in_flight;
          p.error = "no max to take a share of";
          done(std::move(p));
          continue;
        }
        done(measure(o, at, load, where, std::move(p)));
      }
    }
  }
  pin(at, unpinned);  // best effort: sluiced may be gone
  return points;
}

std::string describe_point(const CurvePoint& p) {
  std::string s =
      std::string(door_name(p.door)) + (p.pinned ? " pinned " : " unpinned ") + load_label(p);
  if (!p.error.empty()) return s + ": failed: " + p.error;
  s += ": " + fmt(p.checks_per_sec(), 0) + " checks/s";
  if (!p.is_max()) s += " of " + fmt(p.offered_per_sec, 0) + " offered";
  return s + ", p50/p99/p99.9 " + fmt(p.us(0.5), 0) + "/" + fmt(p.us(0.99), 0) + "/" +
         fmt(p.us(0.999), 0) + " us, sluiced " + fmt(p.server_cpu_us_per_check(), 2) + " us/check";
}

void print_curve_table(const std::vector<CurvePoint>& points, std::FILE* out) {
  std::fprintf(out,
               "| door | pinned | load | offered/s | checks/s | p50 us | p99 us | p99.9 us | "
               "max us | srv us/check | cpu gen/srv/other | errors/lost/unsent | in flight |\n"
               "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|\n");
  for (const CurvePoint& p : points) {
    const std::string door(door_name(p.door));
    const char* pinned = p.pinned ? "yes" : "no";
    if (!p.error.empty()) {
      std::fprintf(out, "| %s | %s | %s | | failed | | | | | | | | %s: %s |\n", door.c_str(),
                   pinned, load_label(p).c_str(), p.in_flight.c_str(), p.error.c_str());
      continue;
    }
    const RowStats& st = p.stats;
    std::fprintf(
        out,
        "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s/%s/%s | %llu/%llu/%llu | %s |\n",
        door.c_str(), pinned, load_label(p).c_str(),
        p.is_max() ? "closed loop" : fmt(p.offered_per_sec, 0).c_str(),
        fmt(p.checks_per_sec(), 0).c_str(), fmt(p.us(0.5), 1).c_str(), fmt(p.us(0.99), 1).c_str(),
        fmt(p.us(0.999), 1).c_str(),
        fmt(static_cast<double>(st.latency.max_ns()) / 1000.0, 0).c_str(),
        fmt(p.server_cpu_us_per_check(), 2).c_str(), fmt(p.generator_cores, 2).c_str(),
        fmt(p.server_cores, 2).c_str(), fmt(p.other_cores, 2).c_str(),
        static_cast<unsigned long long>(st.errors + st.conn_failures),
        static_cast<unsigned long long>(st.lost), static_cast<unsigned long long>(st.unsent),
        p.in_flight.c_str());
  }
}

void append_curve_json(const std::vector<CurvePoint>& points, nlohmann::json& rows) {
  for (const CurvePoint& p : points) {
    if (!p.error.empty()) continue;
    const std::string door(door_name(p.door));
    const RowStats& st = p.stats;
    rows.push_back({
        {"row", "curve-" + door + (p.pinned ? "-pinned-" : "-unpinned-") +
                    (p.is_max() ? std::string("max") : std::to_string(p.load_pct))},
        {"target", door},
        {"phase", p.is_max() ? "max" : "curve"},
        {"load_pct", p.load_pct},
        {"pinned", p.pinned},
        {"checks_per_sec", p.checks_per_sec()},
        {"offered_per_sec", p.offered_per_sec},
        {"p50_us", p.us(0.5)},
        {"p99_us", p.us(0.99)},
        {"p999_us", p.us(0.999)},
        {"max_us", static_cast<double>(st.latency.max_ns()) / 1000.0},
        {"latency_from", p.is_max() ? "send" : "schedule"},
        {"server_cpu_us_per_check", p.server_cpu_us_per_check()},
        {"server_cores", p.server_cores},
        {"generator_cores", p.generator_cores},
        {"other_cores", p.other_cores},
        {"errors", st.errors},
        {"lost", st.lost},
        {"unsent", st.unsent},
        {"conn_failures", st.conn_failures},
        {"send_lag_p99_us", static_cast<double>(st.send_lag.quantile_ns(0.99)) / 1000.0},
        {"in_flight", p.in_flight},
        {"seconds", st.seconds},
    });
  }
}

}  // namespace sluice::bench
