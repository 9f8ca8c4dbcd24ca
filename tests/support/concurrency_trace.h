// Randomized lease traces for concurrency limits, replayed through Engine::check and judged
// against the exact reference (concurrency_reference.h). Shared by
// tests/unit/engine/concurrency_test.cc and `sluice-bench-accuracy --mode concurrency`.
//
// A trace is generated up front from its LeaseTraceParams (a seeded std::mt19937_64, variates as
// in traces.h, no clock), so a seed names the same trace everywhere. Clients on `keys` keys of
// one rule (domain "bench", rule "r", key entry "k") send checks as Poisson arrivals whose rate
// steps through 0.5x, 1x, 2x and 4x of what keeps M leases busy (2 lease_ttls per step), hits
// mostly 1 (3% 0, 12% 2..M, 3% M + 1; at most kMaxTraceHits). Each check is planned a fate for the
// lease it may get: released within 0.9 W (most), never released (a client that crashed; half of
// them followed by probe checks at E - 1 and at E, when the lease must still hold and must have
// gone), released at E - 1, at E, around E, at the second its id names (floor(E / 1000) * 1000,
// before E when B is not whole seconds), twice, with another key's entries, or long after E.
// Besides, 5% forged releases: ids naming seconds just before, at or after now, or random 64-bit
// ids. A release names the check whose lease it gives back; on replay it is sent only if that check
// got one.
//
// Replay sends the operations of one millisecond as one batch (up to 64, in order, as the engine
// decides them), calls Engine::sweep between batches if asked, and judges each operation with
// shared history (concurrency_reference.h). Wrong:
//   a check admitted that the reference denies, or denied that it admits (hits 0 included);
//   a check answered with an error;
//   a lease: none on an admitted check of hits >= 1, one on a denied check or a check of 0 hits,
//     an id granted before for the key, or high 32 bits other than floor(E / 1000);
//   a release answered with another code than the reference's (kNone also needs `allowed`).
// `remaining` and `exceeded` of the limit are compared as well (remaining = M - in_flight after
// the decision, exceeded = denied) but only reported: the contract does not fix them.
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "concurrency_reference.h"
#include "engine/engine.h"
#include "rules/rules.h"
#include "traces.h"

namespace sluice::testing {

struct LeaseTraceParams {
  uint64_t max_in_flight = 10;
  int64_t lease_ttl_ms = 30'000;
  int64_t bucket_ms = 0;  // 0 = the default (concurrency_default_bucket_ms)
  bool count_denied = false;
  uint32_t keys = 3;
  size_t operations = 20'000;  // generation stops once this many are planned
  uint64_t seed = 1;
  int64_t start_ms = kTraceStartMs;
  // Replay calls Engine::sweep this often (0 = never), as the daemon does in the background:
  // dropping expired counters must change no answer.
  int64_t sweep_every_ms = 0;
};

struct LeaseOp {
  enum class Kind : uint8_t {
    kCheck,    // a check of `hits`
    kRelease,  // a release of the lease check number `check` got, with key `key`'s entries
    kForged,   // a release of `forged_id`
  };
  Kind kind = Kind::kCheck;
  int64_t t_ms = 0;
  uint32_t key = 0;
  uint64_t hits = 0;
  uint32_t check = 0;  // kCheck: its number; kRelease: the check whose lease it releases
  uint64_t forged_id = 0;
};

// Hits of one check at most (rules::InputLimits::max_hits): a larger M is never filled by one.
inline constexpr uint64_t kMaxTraceHits = 1'000'000'000;

inline std::vector<LeaseOp> make_lease_trace(const LeaseTraceParams& p) {
  using trace_detail::exponential;
  using trace_detail::uniform_below;
  std::mt19937_64 rng(p.seed);
  const ConcurrencyReference shape(p.max_in_flight, p.lease_ttl_ms, p.bucket_ms);
  const int64_t w = p.lease_ttl_ms;
  const int64_t b = shape.bucket_ms();
  const uint64_t m = p.max_in_flight;
  // A lease is held about half a ttl on average (fates below); hits average about 1.2 x 1.
  const double busy_rate = static_cast<double>(m) / (0.5 * static_cast<double>(w)) / 1.2;
  constexpr double kPhases[] = {0.5, 1.0, 2.0, 4.0};
  std::vector<LeaseOp> ops;
  ops.reserve(p.operations + 64);
  uint32_t checks = 0;
  // Uniform in [0, n), or 0 when n < 1.
  auto below = [&](int64_t n) {
    return n < 1 ? 0 : static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(n)));
  };
  auto check = [&](int64_t t, uint32_t key, uint64_t hits) {
    ops.push_back({LeaseOp::Kind::kCheck, t, key, hits, checks, 0});
    return checks++;
  };
  auto release = [&](int64_t t, uint32_t key, uint32_t c) {
    ops.push_back({LeaseOp::Kind::kRelease, t, key, 0, c, 0});
  };
  double t = 0;
  while (ops.size() < p.operations) {
    const double factor = kPhases[static_cast<size_t>(t / (2.0 * static_cast<double>(w))) % 4];
    t += exponential(rng, busy_rate * factor * static_cast<double>(p.keys));
    const int64_t now = p.start_ms + static_cast<int64_t>(t);
    const uint32_t key = static_cast<uint32_t>(uniform_below(rng, p.keys));
    const int64_t r = below(100);
    const uint64_t hits =
        r < 3    ? 0
        : r < 85 ? 1
        : r < 97 ? 2 + static_cast<uint64_t>(
                           below(static_cast<int64_t>(std::min<uint64_t>(m, kMaxTraceHits)) - 1))
                 : std::min<uint64_t>(m + 1, kMaxTraceHits);
    const uint32_t c = check(now, key, hits);
    if (hits > 0) {
      const int64_t e = shape.expiry_ms(now);
      const int64_t f = below(100);
      const auto after = [&](int64_t at) { return std::max(now + 1, at); };
      if (f < 55) {
        release(now + 1 + below(w * 9 / 10), key, c);
      } else if (f < 65) {  // crashed: never released
        if (f < 60) {
          for (const int64_t probe : {e - 1, e}) {
            if (probe <= now) continue;
            const uint32_t pc = check(probe, key, 1);
            release(probe + 1 + below(b), key, pc);
          }
        }
      } else if (f < 73) {
        release(after(e - 1), key, c);
      } else if (f < 78) {
        release(e, key, c);
      } else if (f < 83) {
        release(after(e - b + below(2 * b + 1)), key, c);
      } else if (f < 86) {
        release(after(floor_div(e, 1'000) * 1'000), key, c);
      } else if (f < 94) {
        const int64_t first = now + 1 + below(w * 9 / 10);
        release(first, key, c);
        release(first + 1 + below(w + b), key, c);
      } else if (f < 97 && p.keys > 1) {
        release(now + 1 + below(w + b), (key + 1) % p.keys, c);
        release(now + 1 + below(w * 9 / 10), key, c);
      } else {
        release(now + 1 + below(3 * w), key, c);
      }
    }
    if (below(100) < 5) {
      const int64_t s = floor_div(now, 1'000);
      const int64_t kind = below(5);
      const int64_t sec = kind == 0   ? s - 1 - below(5)
                          : kind == 1 ? s
                          : kind == 2 ? s + 1
                          : kind == 3 ? s + 2 + w / 1'000 + below(10)
                                      : -1;
      const uint64_t id = sec < 0 ? rng() : (static_cast<uint64_t>(sec) << 32) | (rng() >> 32);
      ops.push_back({LeaseOp::Kind::kForged, now, static_cast<uint32_t>(uniform_below(rng, p.keys)),
                     0, 0, id});
    }
  }
  std::stable_sort(ops.begin(), ops.end(),
                   [](const LeaseOp& x, const LeaseOp& y) { return x.t_ms < y.t_ms; });
  return ops;
}

// One rule "r" keyed by "k" in domain "bench" holding the concurrency limit of `p`; nullptr and
// the reason in `why` when parse_concurrency refuses it.
inline std::shared_ptr<const rules::Policy> concurrency_policy(const LeaseTraceParams& p,
                                                               uint64_t hash_seed,
                                                               std::string* why = nullptr) {
  rules::Limit lim;
  const Status err = rules::parse_concurrency(p.max_in_flight, p.lease_ttl_ms, p.bucket_ms, lim);
  if (!err.ok()) {
    if (why != nullptr) *why = err.message();
    return nullptr;
  }
  lim.name = "r:in-flight-" + std::to_string(p.max_in_flight);
  rules::Rule rule;
  rule.name = "r";
  rule.key = {"k"};
  rule.limits = {lim};
  rule.count_denied = p.count_denied;
  rules::Domain domain;
  domain.name = "bench";
  domain.rules.push_back(std::move(rule));
  rules::RuleSet set;
  set.domains.push_back(std::move(domain));
  return rules::Policy::compile(std::move(set), rules::Overrides{}, hash_seed);
}

struct LeaseTally {
  uint64_t operations = 0;  // sent: checks and releases
  uint64_t checks = 0;
  uint64_t admitted = 0;  // by the engine
  uint64_t releases = 0;
  // Releases by the reference's answer.
  uint64_t release_ok = 0, release_expired = 0, release_released = 0, release_unknown = 0;
  uint64_t wrongly_allowed = 0;
  uint64_t wrongly_denied = 0;
  uint64_t check_errors = 0;
  uint64_t bad_leases = 0;
  uint64_t wrong_releases = 0;
  uint64_t report_mismatches = 0;    // remaining / exceeded unlike the reference (not wrong)
  uint64_t max_held = 0;             // most hits one key held at once, as the reference counts
  size_t first_wrong_op = SIZE_MAX;  // index into the ops replayed
  std::string first_wrong;
  std::string first_report_mismatch;
  uint64_t wrong() const {
    return wrongly_allowed + wrongly_denied + check_errors + bad_leases + wrong_releases;
  }
};

namespace lease_detail {

inline std::string code_name(rules::CheckError e) {
  return e == rules::CheckError::kNone ? "ok" : std::string(rules::to_string(e));
}

inline std::string describe_op(const LeaseOp& op, int64_t start_ms, uint64_t id) {
  char buf[200];
  if (op.kind == LeaseOp::Kind::kCheck) {
    std::snprintf(buf, sizeof buf,
                  "t=start+%" PRId64 "ms key %" PRIu32 ": check #%" PRIu32 " hits %" PRIu64,
                  op.t_ms - start_ms, op.key, op.check, op.hits);
  } else if (op.kind == LeaseOp::Kind::kRelease) {
    std::snprintf(buf, sizeof buf,
                  "t=start+%" PRId64 "ms key %" PRIu32 ": release of check #%" PRIu32
                  "'s lease 0x%016" PRIx64,
                  op.t_ms - start_ms, op.key, op.check, id);
  } else {
    std::snprintf(buf, sizeof buf,
                  "t=start+%" PRId64 "ms key %" PRIu32 ": release of forged id 0x%016" PRIx64,
                  op.t_ms - start_ms, op.key, id);
  }
  return buf;
}

}  // namespace lease_detail

// Replays `ops` through `engine`, whose policy must be concurrency_policy(p, ...). With `log`,
// appends one line per operation sent: what was sent, the engine's answer and the reference's.
inline LeaseTally replay_lease_trace(engine::Engine& engine, const LeaseTraceParams& p,
                                     std::span<const LeaseOp> ops, std::string* log = nullptr) {
  constexpr size_t kMaxBatch = 64;
  LeaseTally tally;
  std::vector<ConcurrencyReference> ref(
      p.keys, ConcurrencyReference(p.max_in_flight, p.lease_ttl_ms, p.bucket_ms));
  std::vector<std::string> values(p.keys);
  for (uint32_t k = 0; k < p.keys; ++k)
    values[k] = std::to_string(k);
  uint32_t max_check = 0;
  for (const LeaseOp& op : ops)
    max_check = std::max(max_check, op.check);
  std::vector<uint64_t> lease_of(static_cast<size_t>(max_check) + 1, 0);
  std::vector<rules::Descriptor> descs(kMaxBatch);
  std::vector<rules::CheckRequest> batch(kMaxBatch);
  std::vector<size_t> index(kMaxBatch);  // the op each request of the batch sends
  std::vector<uint64_t> ids(kMaxBatch);
  engine::BatchResult out;

  auto wrong = [&](size_t i, uint64_t id, const std::string& what, uint32_t key, int64_t now) {
    if (tally.first_wrong_op != SIZE_MAX) return;
    tally.first_wrong_op = i;
    std::string held;
    for (const auto& h : ref[key].held(now)) {
      char buf[96];
      std::snprintf(buf, sizeof buf,
                    " [start+%" PRId64 "ms, %" PRIu64 " hits, E=start+%" PRId64 "ms]",
                    h.acquired_ms - p.start_ms, h.hits, h.expiry_ms - p.start_ms);
      held += buf;
    }
    tally.first_wrong = lease_detail::describe_op(ops[i], p.start_ms, id) + ": " + what +
                        "; the reference holds" + (held.empty() ? " nothing" : held);
  };

  int64_t swept_ms = ops.empty() ? 0 : ops.front().t_ms;
  for (size_t i = 0; i < ops.size();) {
    const int64_t now = ops[i].t_ms;
    if (p.sweep_every_ms > 0 && now - swept_ms >= p.sweep_every_ms) {
      engine.sweep(now);
      swept_ms = now;
    }
    size_t n = 0;
    size_t j = i;
    for (; j < ops.size() && n < kMaxBatch && ops[j].t_ms == now; ++j) {
      const LeaseOp& op = ops[j];
      rules::CheckRequest req{"bench", {&descs[n], 1}, op.hits};
      if (op.kind != LeaseOp::Kind::kCheck) {
        const uint64_t id = op.kind == LeaseOp::Kind::kForged ? op.forged_id : lease_of[op.check];
        if (id == 0) continue;  // its check got no lease: nothing to release
        req.is_release = true;
        req.release = id;
        req.hits = 1;
        ids[n] = id;
      } else {
        ids[n] = 0;
      }
      descs[n] = {"k", values[op.key]};
      batch[n] = req;
      index[n] = j;
      ++n;
    }
    engine.check({batch.data(), n}, now, out);
    for (size_t q = 0; q < n; ++q) {
      const size_t oi = index[q];
      const LeaseOp& op = ops[oi];
      const engine::Decision& d = out.decisions[q];
      ConcurrencyReference& r = ref[op.key];
      ++tally.operations;
      std::string line;
      const uint64_t id_sent = ids[q];
      if (op.kind == LeaseOp::Kind::kCheck) {
        ++tally.checks;
        const uint64_t before = r.in_flight(now);
        const bool exact = r.admits(now, op.hits);
        const int64_t e = r.expiry_ms(now);
        char what[240];
        std::snprintf(what, sizeof what,
                      "engine %s (error %s, lease 0x%016" PRIx64
                      "), reference %s (in flight %" PRIu64 " of %" PRIu64
                      ", E would be start+%" PRId64 "ms, id seconds %" PRIu64 ")",
                      d.allowed ? "allowed" : "denied", lease_detail::code_name(d.error).c_str(),
                      d.lease, exact ? "admits" : "denies", before, p.max_in_flight, e - p.start_ms,
                      r.id_seconds(now));
        if (log != nullptr) line = what;
        if (d.error != rules::CheckError::kNone) {
          ++tally.check_errors;
          wrong(oi, id_sent, what, op.key, now);
        } else {
          if (d.allowed) ++tally.admitted;
          if (d.allowed && !exact) {
            ++tally.wrongly_allowed;
            wrong(oi, id_sent, what, op.key, now);
          }
          if (!d.allowed && exact) {
            ++tally.wrongly_denied;
            wrong(oi, id_sent, what, op.key, now);
          }
          bool lease_ok = d.lease == 0;
          if (d.allowed && op.hits > 0) {
            // Shared history: the lease holds its hits whatever its id. 0, or an id granted
            // before for the key (the two leases cannot be told apart), holds them unreleasable.
            const bool fresh = d.lease != 0 && r.grant(d.lease, now, op.hits);
            if (fresh) {
              lease_of[op.check] = d.lease;
            } else {
              r.hold_unreleasable(now, op.hits);
            }
            lease_ok = fresh && (d.lease >> 32) == r.id_seconds(now);
            tally.max_held = std::max(tally.max_held, r.in_flight(now));
          }
          if (!lease_ok) {
            ++tally.bad_leases;
            wrong(oi, id_sent, std::string("bad lease: ") + what, op.key, now);
          }
          // What the limit reports, compared but not judged.
          if (d.num_limits == 1) {
            const engine::LimitResult& l = out.limits_of(d)[0];
            const uint64_t after = r.in_flight(now);
            const uint64_t remaining = after >= p.max_in_flight ? 0 : p.max_in_flight - after;
            if (l.remaining != remaining || l.exceeded != !d.allowed) {
              if (tally.report_mismatches++ == 0) {
                char buf[160];
                std::snprintf(buf, sizeof buf,
                              ": remaining %" PRIu64 " exceeded %d, reference remaining %" PRIu64
                              " exceeded %d",
                              l.remaining, l.exceeded ? 1 : 0, remaining, d.allowed ? 0 : 1);
                tally.first_report_mismatch = lease_detail::describe_op(op, p.start_ms, 0) + buf;
              }
            }
          }
        }
      } else {
        ++tally.releases;
        const rules::CheckError want = r.release_answer(id_sent, now);
        switch (want) {
          case rules::CheckError::kNone:
            ++tally.release_ok;
            break;
          case rules::CheckError::kLeaseExpired:
            ++tally.release_expired;
            break;
          case rules::CheckError::kLeaseReleased:
            ++tally.release_released;
            break;
          default:
            ++tally.release_unknown;
            break;
        }
        const std::string what = "engine " + lease_detail::code_name(d.error) +
                                 (d.allowed ? " (allowed)" : " (not allowed)") + ", reference " +
                                 lease_detail::code_name(want);
        if (log != nullptr) line = what;
        if (d.error != want || (want == rules::CheckError::kNone && !d.allowed)) {
          ++tally.wrong_releases;
          wrong(oi, id_sent, what, op.key, now);
        }
        if (d.error == rules::CheckError::kNone) r.release(id_sent, now);  // shared history
      }
      if (log != nullptr) {
        *log += lease_detail::describe_op(op, p.start_ms, id_sent) + " -> " + line + "\n";
      }
    }
    i = j;
  }
  return tally;
}

// The smallest part of `ops` found (ddmin over operations, at most `max_replays` replays, each on
// a fresh engine from `make_engine`) on which the engine still decides something wrongly. `ops`
// must show a wrong decision; the result ends with the first one.
inline std::vector<LeaseOp> shrink_lease_trace(
    const std::function<std::unique_ptr<engine::Engine>()>& make_engine, const LeaseTraceParams& p,
    std::vector<LeaseOp> ops, size_t max_replays = 3'000) {
  auto first_wrong = [&](const std::vector<LeaseOp>& v) {
    const auto e = make_engine();
    return replay_lease_trace(*e, p, v).first_wrong_op;
  };
  size_t at = first_wrong(ops);
  if (at == SIZE_MAX) return ops;
  ops.resize(at + 1);
  size_t replays = 1;
  // Keys are independent: first try the failing operation's key alone.
  std::vector<LeaseOp> one_key;
  for (const LeaseOp& op : ops) {
    if (op.key == ops.back().key) one_key.push_back(op);
  }
  ++replays;
  if (one_key.size() < ops.size() && (at = first_wrong(one_key)) != SIZE_MAX) {
    one_key.resize(at + 1);
    ops = std::move(one_key);
  }
  size_t parts = 2;
  while (ops.size() >= 2 && replays < max_replays) {
    const size_t chunk = (ops.size() + parts - 1) / parts;
    bool reduced = false;
    for (size_t start = 0; start < ops.size() && replays < max_replays; start += chunk) {
      std::vector<LeaseOp> candidate(ops.begin(), ops.begin() + static_cast<ptrdiff_t>(start));
      candidate.insert(candidate.end(),
                       ops.begin() + static_cast<ptrdiff_t>(std::min(ops.size(), start + chunk)),
                       ops.end());
      ++replays;
      at = first_wrong(candidate);
      if (at != SIZE_MAX) {
        candidate.resize(at + 1);
        ops = std::move(candidate);
        parts = std::max<size_t>(parts - 1, 2);
        reduced = true;
        break;
      }
    }
    if (!reduced) {
      if (parts >= ops.size()) break;
      parts = std::min(ops.size(), parts * 2);
    }
  }
  return ops;
}

// A readable replay of `ops` on a fresh engine: one line per operation sent.
inline std::string lease_trace_text(engine::Engine& fresh, const LeaseTraceParams& p,
                                    std::span<const LeaseOp> ops) {
  char head[200];
  std::snprintf(head, sizeof head,
                "max_in_flight %" PRIu64 ", lease_ttl %" PRId64 "ms, bucket %" PRId64
                "ms, count_denied %s, start %" PRId64 " (epoch ms, a whole day)\n",
                p.max_in_flight, p.lease_ttl_ms,
                ConcurrencyReference(p.max_in_flight, p.lease_ttl_ms, p.bucket_ms).bucket_ms(),
                p.count_denied ? "true" : "false", p.start_ms);
  std::string log = head;
  replay_lease_trace(fresh, p, ops, &log);
  return log;
}

}  // namespace sluice::testing
