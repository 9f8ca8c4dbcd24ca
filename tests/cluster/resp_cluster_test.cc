// The RESP door of a 3-node cluster of real sluiced processes (tests/support/cluster_process.h),
// through a blocking RESP2 client of its own: CL.THROTTLE keys are decided by their owner (cell
// keys are never synced), so one key throttled through every node's door admits exactly what
// redis-cell's GCRA allows on one Redis; a pipeline of keys owned by different nodes is answered
// in request order; DEL through any node resets the owner's state; a key throttled while the
// nodes are still joining keeps its count once they route by the final ring.
//
// The allowance (lib/window/cell.h states the arithmetic). With emission interval
// T = trunc(period x 10^9 / count) ns and limit L = max_burst + 1, a fresh key admits its first
// request at t0, and the n-th admitted request (quantity 1) moves the arrival time to t0 + n x T,
// which is admitted only while t0 + n x T - L x T <= now. Every decision of the test falls within
// [first send, last reply], E long, give or take the node clock's millisecond (a check carries no
// time of its own), so the cluster admits at most L + floor((E + 1 ms) / T); with a period far
// longer than the test, exactly L.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cluster_process.h"
#include "metrics_text.h"

namespace {

using namespace sluice::testing;
using std::chrono::milliseconds;

// One RESP2 reply: `+` simple, `-` error, `:` integer, `$` bulk (null: `is_null`), `*` array.
struct Reply {
  char type = 0;
  int64_t integer = 0;
  std::string text;
  bool is_null = false;
  std::vector<Reply> elems;

  std::string show() const {
    switch (type) {
      case ':':
        return std::to_string(integer);
      case '*': {
        std::string s = "[";
        for (size_t i = 0; i < elems.size(); ++i)
          s += (i ? " " : "") + elems[i].show();
        return s + "]";
      }
      case '$':
        return is_null ? "(nil)" : "\"" + text + "\"";
      default:
        return std::string(1, type) + text;
    }
  }
  // CL.THROTTLE's five integers, or nothing when the reply is not that.
  std::optional<std::vector<int64_t>> throttle() const {
    if (type != '*' || elems.size() != 5) return std::nullopt;
    std::vector<int64_t> out;
    for (const Reply& e : elems) {
      if (e.type != ':') return std::nullopt;
      out.push_back(e.integer);
    }
    return out;
  }
};

std::string command(const std::vector<std::string>& args) {
  std::string f = "*" + std::to_string(args.size()) + "\r\n";
  for (const std::string& a : args)
    f += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  return f;
}

std::string throttle_command(const std::string& key, int64_t burst, int64_t count, int64_t period,
                             int64_t quantity = 1) {
  return command({"CL.THROTTLE", key, std::to_string(burst), std::to_string(count),
                  std::to_string(period), std::to_string(quantity)});
}

// A blocking RESP2 connection to a node's door on loopback; every read is bounded in time.
class RespConn {
 public:
  explicit RespConn(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    const sockaddr_in a = loopback_addr(port);
    REQUIRE(::connect(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  }
  ~RespConn() { ::close(fd_); }
  RespConn(const RespConn&) = delete;
  RespConn& operator=(const RespConn&) = delete;

  void send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      REQUIRE(n > 0);
      sent += static_cast<size_t>(n);
    }
  }

  // The next `n` replies, in the order they came; fewer when the node closed or 5 s passed.
  std::vector<Reply> read(size_t n) {
    std::vector<Reply> out;
    const auto until = SteadyClock::now() + milliseconds(5000);
    while (out.size() < n) {
      size_t pos = 0;
      Reply r;
      if (parse(pos, r)) {
        in_.erase(0, pos);
        out.push_back(std::move(r));
        continue;
      }
      const auto left =
          std::chrono::duration_cast<milliseconds>(until - SteadyClock::now()).count();
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) != 1) break;
      char buf[16384];
      const ssize_t got = ::recv(fd_, buf, sizeof buf, 0);
      if (got <= 0) break;
      in_.append(buf, static_cast<size_t>(got));
    }
    return out;
  }

  Reply call(const std::vector<std::string>& args) {
    send(command(args));
    std::vector<Reply> r = read(1);
    REQUIRE(r.size() == 1);
    return r[0];
  }

 private:
  // One whole reply from in_ at `pos`; false when it is not all there yet.
  bool parse(size_t& pos, Reply& r) const {
    const size_t eol = in_.find("\r\n", pos);
    if (eol == std::string::npos) return false;
    r.type = in_[pos];
    const std::string line = in_.substr(pos + 1, eol - pos - 1);
    pos = eol + 2;
    switch (r.type) {
      case ':':
        r.integer = std::strtoll(line.c_str(), nullptr, 10);
        return true;
      case '$': {
        const int64_t len = std::strtoll(line.c_str(), nullptr, 10);
        if (len < 0) {
          r.is_null = true;
          return true;
        }
        if (in_.size() < pos + static_cast<size_t>(len) + 2) return false;
        r.text = in_.substr(pos, static_cast<size_t>(len));
        pos += static_cast<size_t>(len) + 2;
        return true;
      }
      case '*': {
        const int64_t len = std::strtoll(line.c_str(), nullptr, 10);
        for (int64_t i = 0; i < len; ++i) {
          Reply e;
          if (!parse(pos, e)) return false;
          r.elems.push_back(std::move(e));
        }
        return true;
      }
      default:
        r.text = line;
        return true;
    }
  }

  int fd_ = -1;
  std::string in_;
};

ClusterSpec resp_spec() {
  ClusterSpec s;
  s.sluiced_bin = SLUICED_BIN;
  s.nodes = 3;
  // A forwarded check waits this long for the key's owner before it goes to the key's replica,
  // which would decide from state of its own: generous, so a slow owner on a loaded 2-core
  // machine is waited for rather than bypassed (docs/architecture.md, "Owner mode").
  s.forward_timeout_ms = 1000;
  return s;
}

// A counter of node i's /metrics (the unlabelled sample); nullopt when absent.
std::optional<uint64_t> metric(const LocalCluster& c, size_t i, const std::string& name) {
  const HttpReply r = c.get(i, "/metrics");
  const std::optional<double> v = metric_value(r.body, name);
  if (r.status != 200 || !v) return std::nullopt;
  return static_cast<uint64_t>(*v);
}

uint64_t forwarded_parts(const LocalCluster& c, size_t i) {
  const auto v = metric(c, i, "sluice_forwarded_parts_total");
  REQUIRE(v.has_value());
  return *v;
}

// The index of the node that decides CL.THROTTLE key `key`: the one through which a peek
// (quantity 0: nothing consumed) is not forwarded. SIZE_MAX unless exactly one node is.
size_t cell_owner(const LocalCluster& c, std::vector<std::unique_ptr<RespConn>>& conns,
                  const std::string& key) {
  size_t owner = SIZE_MAX, local = 0;
  for (size_t i = 0; i < conns.size(); ++i) {
    const uint64_t before = forwarded_parts(c, i);
    const Reply r = conns[i]->call({"CL.THROTTLE", key, "1", "1", "3600", "0"});
    REQUIRE_MESSAGE(r.throttle().has_value(), r.show());
    if (forwarded_parts(c, i) == before) {
      owner = i;
      ++local;
    }
  }
  return local == 1 ? owner : SIZE_MAX;
}

// A connection to every node's door.
std::vector<std::unique_ptr<RespConn>> connect_all(const LocalCluster& c) {
  std::vector<std::unique_ptr<RespConn>> conns;
  for (size_t i = 0; i < c.size(); ++i)
    conns.push_back(std::make_unique<RespConn>(c.node(i).resp_port));
  return conns;
}

// Waits until the cluster routes by its final ring: right after they meet, joining nodes send the
// keys they own on to their previous owner for a few sync intervals (docs/architecture.md,
// "Joining"), so a key is forwarded by every node, its owner included, until then. Bounded: 10 s.
void settle(const LocalCluster& c, std::vector<std::unique_ptr<RespConn>>& conns) {
  const bool settled = wait_until(
      [&] {
        for (const char* key : {"settle-a", "settle-b", "settle-c", "settle-d"}) {
          if (cell_owner(c, conns, key) == SIZE_MAX) return false;
        }
        return true;
      },
      milliseconds(10000), milliseconds(100));
  REQUIRE_MESSAGE(settled, "every node still forwards keys it owns");
}

// connect_all, then settle.
std::vector<std::unique_ptr<RespConn>> connect_settled(const LocalCluster& c) {
  auto conns = connect_all(c);
  settle(c, conns);
  return conns;
}

// Rounds of `per_node` pipelined CL.THROTTLE of `key` sent to every node's door before any reply
// is read, until `rounds` rounds or `min_duration` passed (whichever is later, at most
// `max_rounds`). Counts what the cluster admitted and checks each reply's shape; `elapsed_ns`:
// from the first send to the last reply.
struct Throttled {
  size_t sent = 0, admitted = 0, bad = 0;
  int64_t elapsed_ns = 0;
  std::multiset<int64_t> remaining_when_admitted;
};
Throttled throttle_through_all(std::vector<std::unique_ptr<RespConn>>& conns,
                               const std::string& key, int64_t burst, int64_t count, int64_t period,
                               size_t per_node, size_t rounds, milliseconds min_duration,
                               size_t max_rounds) {
  Throttled t;
  const std::string frame = throttle_command(key, burst, count, period);
  std::string pipeline;
  for (size_t k = 0; k < per_node; ++k)
    pipeline += frame;
  const auto start = SteadyClock::now();
  for (size_t round = 0; round < max_rounds; ++round) {
    if (round >= rounds && SteadyClock::now() - start >= min_duration) break;
    // Start at another node each round, so no node is always first to reach the owner.
    for (size_t k = 0; k < conns.size(); ++k)
      conns[(round + k) % conns.size()]->send(pipeline);
    for (size_t k = 0; k < conns.size(); ++k) {
      const std::vector<Reply> replies = conns[(round + k) % conns.size()]->read(per_node);
      t.sent += per_node;
      t.bad += per_node - replies.size();
      for (const Reply& r : replies) {
        const auto v = r.throttle();
        if (!v || (*v)[1] != burst + 1 || ((*v)[0] != 0 && (*v)[0] != 1)) {
          ++t.bad;
          MESSAGE("unexpected reply: " << r.show());
          continue;
        }
        // Allowed: retry_after -1. Limited (quantity 1 <= limit): a retry_after >= 0.
        if (((*v)[0] == 0) != ((*v)[3] == -1)) {
          ++t.bad;
          MESSAGE("retry_after does not match limited: " << r.show());
        }
        if ((*v)[0] == 0) {
          ++t.admitted;
          t.remaining_when_admitted.insert((*v)[2]);
        }
      }
    }
  }
  t.elapsed_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start).count();
  return t;
}

}  // namespace

TEST_CASE(
    "owner mode over 3 nodes' RESP doors: one CL.THROTTLE key throttled through every door, "
    "interleaved and pipelined, admits exactly what redis-cell's GCRA allows") {
  LocalCluster c(resp_spec());
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  auto conns = connect_settled(c);

  // A period far longer than the test: exactly max_burst + 1 admitted, one after another with
  // remaining max_burst, max_burst - 1, ..., 0 (one owner decided them all, in some order).
  {
    const int64_t burst = 9, count = 1, period = 3600;
    const Throttled t =
        throttle_through_all(conns, "long-period", burst, count, period, 3, 8, milliseconds(0), 8);
    MESSAGE("burst " << burst << ", " << count << " per " << period << " s: sent " << t.sent
                     << " through 3 doors in " << static_cast<double>(t.elapsed_ns) / 1e6
                     << " ms, admitted " << t.admitted << " (GCRA allows exactly " << burst + 1
                     << ")");
    CHECK(t.bad == 0);
    CHECK(t.admitted == static_cast<size_t>(burst + 1));
    std::multiset<int64_t> expected;
    for (int64_t r = 0; r <= burst; ++r)
      expected.insert(r);
    CHECK(t.remaining_when_admitted == expected);
  }

  // A 50 ms emission interval over at least 1 s: at most L + floor((E + 1 ms) / T); and, under
  // continuous traffic, more than the burst alone (the interval does refill).
  {
    const int64_t burst = 4, count = 20, period = 1;
    const int64_t interval_ns = period * 1'000'000'000 / count;
    const Throttled t = throttle_through_all(conns, "short-period", burst, count, period, 2, 10,
                                             milliseconds(1000), 20000);
    const int64_t allowance = burst + 1 + (t.elapsed_ns + 1'000'000) / interval_ns;
    MESSAGE("burst " << burst << ", " << count << " per " << period << " s: sent " << t.sent
                     << " through 3 doors in " << static_cast<double>(t.elapsed_ns) / 1e6
                     << " ms, admitted " << t.admitted << " (GCRA allows at most " << allowance
                     << ")");
    CHECK(t.bad == 0);
    CHECK(static_cast<int64_t>(t.admitted) <= allowance);
    CHECK(static_cast<int64_t>(t.admitted) > burst + 1);
  }

  for (size_t i = 0; i < c.size(); ++i) {
    CHECK(metric(c, i, "sluice_forward_failovers_total").value_or(1) == 0);
    CHECK(metric(c, i, "sluice_forward_fallbacks_total").value_or(1) == 0);
  }
}

TEST_CASE(
    "owner mode over RESP: a pipeline mixing keys owned by different nodes is answered in request "
    "order, and DEL through a non-owner resets the owner's state") {
  LocalCluster c(resp_spec());
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  auto conns = connect_settled(c);

  // On each node's door, one write: 12 CL.THROTTLE of fresh keys, each with a limit of its own
  // (max_burst i + 1, so limit i + 2 and remaining i + 1), each followed by an ECHO (answered by
  // the session at once), every third one by a SLUICE.CHECK of the owner-mode rule (limit 100)
  // on the same key, and in the middle an unknown command and a zero rate (errors answered
  // without the node); then a MULTI/EXEC of two more keys. Some keys are forwarded to their
  // owner, some decided here: the replies still follow the requests.
  constexpr size_t kKeys = 12;
  for (size_t n = 0; n < conns.size(); ++n) {
    CAPTURE(n);
    const std::string prefix = "order-" + std::to_string(n) + "-";
    std::string pipeline;
    std::vector<std::pair<std::string, std::function<bool(const Reply&)>>> expected;
    const auto throttled = [](int64_t limit, int64_t remaining) {
      return [limit, remaining](const Reply& r) {
        const auto v = r.throttle();
        return v && (*v)[0] == 0 && (*v)[1] == limit && (*v)[2] == remaining && (*v)[3] == -1;
      };
    };
    size_t routed = 0;
    for (size_t i = 0; i < kKeys; ++i) {
      const std::string key = prefix + std::to_string(i);
      const auto limit = static_cast<int64_t>(i) + 2;
      pipeline += throttle_command(key, limit - 1, 1, 3600);
      expected.emplace_back("CL.THROTTLE " + key, throttled(limit, limit - 1));
      ++routed;
      const std::string echo = "e" + std::to_string(i);
      pipeline += command({"ECHO", echo});
      expected.emplace_back("ECHO " + echo, [echo](const Reply& r) { return r.text == echo; });
      if (i % 3 == 0) {
        pipeline += command({"SLUICE.CHECK", "o", "k", key});
        expected.emplace_back("SLUICE.CHECK " + key, [](const Reply& r) {
          return r.type == '*' && r.elems.size() == 7 && r.elems[0].integer == 1 &&
                 r.elems[1].integer == 100 && r.elems[2].integer == 99;
        });
        ++routed;
      }
      if (i == kKeys / 2) {
        pipeline += command({"GET", key});
        expected.emplace_back("GET", [](const Reply& r) {
          return r.type == '-' && r.text.starts_with("ERR unknown command 'GET'");
        });
        pipeline += throttle_command(key, 1, 0, 1);
        expected.emplace_back("CL.THROTTLE zero rate", [](const Reply& r) {
          return r.show() == "-Cell error: Store error: Zero rates are not supported";
        });
      }
    }
    pipeline += command({"MULTI"}) + throttle_command(prefix + "m0", 20, 1, 3600, 2) +
                throttle_command(prefix + "m1", 30, 1, 3600, 3) + command({"EXEC"});
    routed += 2;
    expected.emplace_back("MULTI", [](const Reply& r) { return r.show() == "+OK"; });
    for (const char* m : {"m0", "m1"})
      expected.emplace_back(m, [](const Reply& r) { return r.show() == "+QUEUED"; });
    // quantity 2 of limit 21: remaining 19; quantity 3 of limit 31: remaining 28.
    expected.emplace_back("EXEC", [throttled](const Reply& r) {
      return r.type == '*' && r.elems.size() == 2 && throttled(21, 19)(r.elems[0]) &&
             throttled(31, 28)(r.elems[1]);
    });

    const uint64_t forwarded_before = forwarded_parts(c, n);
    conns[n]->send(pipeline);
    const std::vector<Reply> replies = conns[n]->read(expected.size());
    const uint64_t forwarded = forwarded_parts(c, n) - forwarded_before;
    MESSAGE("node " << n + 1 << ": " << forwarded << " of " << routed
                    << " CL.THROTTLE and SLUICE.CHECK forwarded to their owner");
    // Both kinds in one pipeline (every key owned by one node: (1/3)^13).
    CHECK(forwarded > 0);
    CHECK(forwarded < routed);
    REQUIRE(replies.size() == expected.size());
    for (size_t i = 0; i < replies.size(); ++i) {
      CHECK_MESSAGE(expected[i].second(replies[i]),
                    "reply " << i << " (" << expected[i].first << "): " << replies[i].show());
    }
  }

  // DEL through a non-owner: the owner's state is gone, whichever node asks next.
  const std::string key = "reset-me";
  const size_t owner = cell_owner(c, conns, key);
  REQUIRE_MESSAGE(owner != SIZE_MAX, "no single node decides " << key);
  const size_t other = (owner + 1) % conns.size();
  MESSAGE(key << " is owned by node " << owner + 1 << "; DEL through node " << other + 1);
  for (int i = 0; i < 3; ++i) {
    const auto v = conns[owner]->call({"CL.THROTTLE", key, "2", "1", "3600"}).throttle();
    REQUIRE(v.has_value());
    CHECK((*v)[0] == 0);
    CHECK((*v)[2] == 2 - i);
  }
  for (size_t n : {owner, other}) {
    const auto v = conns[n]->call({"CL.THROTTLE", key, "2", "1", "3600"}).throttle();
    REQUIRE(v.has_value());
    CHECK((*v)[0] == 1);
  }
  CHECK(conns[other]->call({"DEL", key, "never-throttled"}).show() == "1");
  CHECK(conns[other]->call({"DEL", key}).show() == "0");
  const auto fresh =
      conns[(other + 1) % conns.size()]->call({"CL.THROTTLE", key, "2", "1", "3600"});
  const auto fresh_values = fresh.throttle();
  REQUIRE(fresh_values.has_value());
  const std::vector<int64_t> fresh_head(fresh_values->begin(), fresh_values->begin() + 4);
  const std::vector<int64_t> full = {0, 3, 2, -1};
  CHECK_MESSAGE(fresh_head == full, fresh.show());
}

TEST_CASE(
    "owner mode over RESP: a CL.THROTTLE key throttled while the nodes are still joining and "
    "after admits exactly max_burst + 1 over a long period") {
  LocalCluster c(resp_spec());
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  auto conns = connect_all(c);
  const int64_t burst = 9, count = 1, period = 3600;
  // Right away: each node may still send the keys it now owns to their previous owner (then
  // every node forwards this key, its owner under the final ring included).
  uint64_t forwarded_before = 0;
  for (size_t i = 0; i < c.size(); ++i)
    forwarded_before += forwarded_parts(c, i);
  const Throttled joining =
      throttle_through_all(conns, "joining", burst, count, period, 1, 2, milliseconds(0), 2);
  uint64_t forwarded_joining = 0;
  for (size_t i = 0; i < c.size(); ++i)
    forwarded_joining += forwarded_parts(c, i);
  forwarded_joining -= forwarded_before;
  settle(c, conns);
  const Throttled after =
      throttle_through_all(conns, "joining", burst, count, period, 2, 6, milliseconds(0), 6);
  MESSAGE("admitted " << joining.admitted << " of " << joining.sent << " while joining ("
                      << forwarded_joining << " parts forwarded between nodes), then "
                      << after.admitted << " of " << after.sent << " (GCRA allows exactly "
                      << burst + 1 << " in all)");
  CHECK(joining.bad == 0);
  CHECK(after.bad == 0);
  CHECK(joining.admitted + after.admitted == static_cast<size_t>(burst + 1));
}
