// The cluster on one screen (cluster_view.h): every member asked for its counts at once, the
// answers summed per rule.
#include "node/cluster_view.h"

#include <utility>  // before Asio: Boost 1.74 with g++ 12 in C++20 needs std::exchange declared

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <functional>
#include <map>

#include "cluster/membership.h"
#include "engine/engine.h"
#include "node/admin_input.h"
#include "node/node.h"
#include "node/node_cluster.h"

namespace sluice::node {

namespace {

using Json = nlohmann::json;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using Clock = std::chrono::steady_clock;

// A member's /v1/status grows with its rules; more than this is not a status.
constexpr uint64_t kMaxStatusBytes = 4 * 1024 * 1024;

uint64_t count_of(const Json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

std::string read_member_status(std::string_view body, MemberAnswer& out) {
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "its /v1/status is not a JSON object";
  const auto rules = j.find("rules");
  if (rules == j.end() || !rules->is_array()) return "its /v1/status has no \"rules\" list";
  out.rules.clear();
  for (const Json& r : *rules) {
    const auto name = r.is_object() ? r.find("name") : r.end();
    if (!r.is_object() || name == r.end() || !name->is_string()) {
      return "its /v1/status has a rule without a name";
    }
    out.rules.push_back(RuleCounts{name->get<std::string>(), count_of(r, "allowed"),
                                   count_of(r, "denied"), count_of(r, "shadow_denied"),
                                   count_of(r, "would_deny")});
  }
  if (const auto n = j.find("node"); n != j.end() && n->is_object()) {
    out.uptime_s = static_cast<int64_t>(count_of(*n, "uptime_s"));
  }
  if (const auto e = j.find("engine"); e != j.end() && e->is_object()) {
    out.checks = count_of(*e, "checks");
  }
  if (const auto c = j.find("cluster"); c != j.end() && c->is_object()) {
    if (const auto ready = c->find("ready"); ready != c->end() && ready->is_boolean()) {
      out.ready = ready->get<bool>();
    }
    if (const auto why = c->find("not_ready"); why != c->end() && why->is_string()) {
      out.not_ready = why->get<std::string>();
    }
  }
  return "";
}

Json cluster_top_json(const std::vector<MemberAnswer>& members, bool cluster, int64_t now_ms,
                      int64_t timeout_ms) {
  // Rules in the order first met (this node's first), each with its sums and one row per member
  // that answered (0 where the member has not seen the rule).
  std::vector<std::string> names;
  std::map<std::string, size_t, std::less<>> index;
  for (const MemberAnswer& m : members) {
    for (const RuleCounts& r : m.rules) {
      if (index.emplace(r.rule, names.size()).second) names.push_back(r.rule);
    }
  }
  std::vector<RuleCounts> sums(names.size());
  std::vector<Json> per_node(names.size(), Json::array());
  Json out_members = Json::array();
  size_t answered = 0;
  for (const MemberAnswer& m : members) {
    Json jm{{"id", m.id},
            {"name", m.name},
            {"address", m.address},
            {"state", m.state},
            {"self", m.self},
            {"answered", m.answered},
            {"error", m.answered ? Json(nullptr) : Json(m.error)},
            {"latency_ms", m.latency_ms}};
    if (m.answered) {
      jm["uptime_s"] = m.uptime_s;
      jm["checks"] = m.checks;
      jm["ready"] = m.ready ? Json(*m.ready) : Json(nullptr);
      jm["not_ready"] = m.not_ready.empty() ? Json(nullptr) : Json(m.not_ready);
    }
    out_members.push_back(std::move(jm));
    if (!m.answered) continue;
    ++answered;
    std::vector<RuleCounts> mine(names.size());
    for (const RuleCounts& r : m.rules) {
      RuleCounts& c = mine[index.find(r.rule)->second];
      c.allowed += r.allowed;
      c.denied += r.denied;
      c.shadow_denied += r.shadow_denied;
      c.would_deny += r.would_deny;
    }
    for (size_t i = 0; i < names.size(); ++i) {
      sums[i].allowed += mine[i].allowed;
      sums[i].denied += mine[i].denied;
      sums[i].shadow_denied += mine[i].shadow_denied;
      sums[i].would_deny += mine[i].would_deny;
      per_node[i].push_back(Json{{"id", m.id},
                                 {"name", m.name},
                                 {"allowed", mine[i].allowed},
                                 {"denied", mine[i].denied},
                                 {"shadow_denied", mine[i].shadow_denied},
                                 {"would_deny", mine[i].would_deny}});
    }
  }
  Json rules = Json::array();
  for (size_t i = 0; i < names.size(); ++i) {
    rules.push_back(Json{{"rule", names[i]},
                         {"allowed", sums[i].allowed},
                         {"denied", sums[i].denied},
                         {"shadow_denied", sums[i].shadow_denied},
                         {"would_deny", sums[i].would_deny},
                         {"nodes", std::move(per_node[i])}});
  }
  return Json{{"now_ms", now_ms},
              {"cluster", cluster},
              {"timeout_ms", timeout_ms},
              {"members_total", members.size()},
              {"members_answered", answered},
              {"members", std::move(out_members)},
              {"rules", std::move(rules)}};
}

namespace {

// One gathering: the answers, filled as the members answer, and the reply once the last has.
// Admin thread only.
struct Gather {
  std::vector<MemberAnswer> answers;
  size_t pending = 0;
  bool cluster = false;
  int64_t now_ms = 0, timeout_ms = 0;
  std::function<void(front::admin::Reply&&)> finish;

  void done_one() {
    if (--pending > 0) return;
    front::admin::Reply r;
    r.status = 200;
    r.content_type = "application/json";
    // Names come from other nodes: a byte that is not UTF-8 is replaced, not a failure.
    r.body = cluster_top_json(answers, cluster, now_ms, timeout_ms)
                 .dump(-1, ' ', false, Json::error_handler_t::replace);
    r.body += '\n';
    r.add_header("Cache-Control", "no-store");
    finish(std::move(r));
  }
};

// GET /v1/status of one member, within the gathering's timeout (connect, write and read
// together: beast::tcp_stream's one deadline).
struct Fetch : std::enable_shared_from_this<Fetch> {
  Fetch(asio::io_context& io, std::shared_ptr<Gather> g, size_t i)
      : gather(std::move(g)), index(i), stream(io) {}

  std::shared_ptr<Gather> gather;
  size_t index;
  beast::tcp_stream stream;
  http::request<http::empty_body> req;
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  Clock::time_point started = Clock::now();
  bool over = false;

  MemberAnswer& answer() { return gather->answers[index]; }

  void finish(std::string error) {
    if (over) return;
    over = true;
    MemberAnswer& a = answer();
    a.latency_ms = ms_since(started);
    a.answered = error.empty();
    a.error = std::move(error);
    stream.close();  // the socket and the deadline's timer: nothing of it waits on
    gather->done_one();
  }

  void fail(const char* step, beast::error_code ec) {
    if (ec == beast::error::timeout) {
      return finish("timed out after " + std::to_string(gather->timeout_ms) + " ms");
    }
    if (ec == asio::error::operation_aborted) return finish("cancelled: this node is stopping");
    finish(std::string(step) + ": " + ec.message());
  }

  void start(const asio::ip::tcp::endpoint& at, const std::string& host,
             std::optional<std::string_view> authorization) {
    req.method(http::verb::get);
    req.target("/v1/status");
    req.version(11);
    req.set(http::field::host, host);
    req.set(http::field::connection, "close");
    if (authorization) {
      req.set(http::field::authorization,
              beast::string_view(authorization->data(), authorization->size()));
    }
    parser.body_limit(kMaxStatusBytes);
    stream.expires_after(std::chrono::milliseconds(gather->timeout_ms));
    stream.async_connect(at, [self = shared_from_this()](beast::error_code ec) {
      if (ec) return self->fail("connect", ec);
      http::async_write(self->stream, self->req, [self](beast::error_code wec, size_t) {
        if (wec) return self->fail("send", wec);
        http::async_read(self->stream, self->buffer, self->parser,
                         [self](beast::error_code rec, size_t) {
                           if (rec) return self->fail("answer", rec);
                           self->read_answer();
                         });
      });
    });
  }

  void read_answer() {
    const auto& res = parser.get();
    if (res.result_int() != 200) {
      std::string why = "HTTP " + std::to_string(res.result_int());
      const Json j = Json::parse(res.body(), nullptr, false);
      if (j.is_object() && j.contains("error") && j["error"].is_string()) {
        why += ": " + j["error"].get<std::string>();
      }
      return finish(why);
    }
    std::string why = read_member_status(res.body(), answer());
    finish(why);
  }
};

}  // namespace

struct ClusterView::Impl {
  Impl(asio::io_context& io_, Node& node_) : io(io_), node(node_) {}

  asio::io_context& io;
  Node& node;
  bool stopped = false;
  std::vector<std::weak_ptr<Fetch>> in_flight;  // to cancel at stop(); pruned as they end

  // This node's own counts, read directly.
  MemberAnswer self_answer(const std::string& not_ready) {
    MemberAnswer a;
    a.self = true;
    a.answered = true;
    a.state = "alive";
    for (const engine::RuleStats& r : node.engine().stats().rules) {
      a.rules.push_back(RuleCounts{r.name, r.allowed, r.denied, r.shadow_denied, r.would_deny});
    }
    a.checks = node.engine().stats().checks;
    const int64_t now = node.now_ms(), started = node.started_ms();
    a.uptime_s = now > started ? (now - started) / 1000 : 0;
    a.ready = not_ready.empty();
    a.not_ready = not_ready;
    return a;
  }

  void gather(const front::admin::Request& req, front::admin::Later& later, int64_t timeout_ms) {
    auto g = std::make_shared<Gather>();
    g->now_ms = node.now_ms();
    g->timeout_ms = timeout_ms;
    const ClusterStatus c = node.cluster_status();
    g->cluster = c.enabled;
    if (!c.enabled) {
      g->answers.push_back(self_answer(node.not_ready()));
      g->answers.back().address = "127.0.0.1:" + std::to_string(node.admin_port());
    } else {
      std::vector<const MemberStatus*> members;
      for (const MemberStatus& m : c.members)
        members.push_back(&m);
      // This node first, then by id.
      std::sort(members.begin(), members.end(), [&](const MemberStatus* a, const MemberStatus* b) {
        return std::make_pair(a->member.id != c.self, a->member.id) <
               std::make_pair(b->member.id != c.self, b->member.id);
      });
      for (const MemberStatus* m : members) {
        const cluster::Member& mb = m->member;
        MemberAnswer a = mb.id == c.self ? self_answer(c.not_ready) : MemberAnswer{};
        a.id = mb.id;
        a.name = mb.name;
        a.state = std::string(cluster::to_string(mb.state));
        const bool v6 = mb.host.find(':') != std::string::npos;
        if (mb.admin_port != 0) {
          a.address = (v6 ? "[" + mb.host + "]" : mb.host) + ":" + std::to_string(mb.admin_port);
        }
        g->answers.push_back(std::move(a));
      }
    }
    g->finish = later.take();
    // Counted before any fetch starts: one that fails at once must not finish the gathering.
    g->pending = 1;
    const auto authorization = req.header("Authorization");
    std::erase_if(in_flight, [](const std::weak_ptr<Fetch>& f) { return f.expired(); });
    for (size_t i = 0; i < g->answers.size(); ++i) {
      MemberAnswer& a = g->answers[i];
      if (a.self) continue;
      if (a.address.empty()) {
        a.error = "advertises no admin port";
        continue;
      }
      if (stopped) {
        a.error = "not asked: this node is stopping";
        continue;
      }
      const cluster::Member* mb = nullptr;
      for (const MemberStatus& m : c.members) {
        if (m.member.id == a.id) mb = &m.member;
      }
      boost::system::error_code ec;
      const auto ip = asio::ip::make_address(mb->host, ec);
      if (ec) {
        a.error = "its address " + mb->host + " is not an IP address";
        continue;
      }
      ++g->pending;
      auto f = std::make_shared<Fetch>(io, g, i);
      in_flight.push_back(f);
      f->start(asio::ip::tcp::endpoint(ip, mb->admin_port), a.address, authorization);
    }
    g->done_one();
  }
};

ClusterView::ClusterView(asio::io_context& admin, Node& node)
    : impl_(std::make_shared<Impl>(admin, node)) {}

ClusterView::~ClusterView() {
  stop();
}

void ClusterView::stop() {
  impl_->stopped = true;
  for (const auto& weak : impl_->in_flight) {
    // Its handlers run with operation_aborted and finish it; the timer goes with the socket, so
    // the admin io_context does not wait out the deadline.
    if (const auto f = weak.lock()) f->stream.close();
  }
  impl_->in_flight.clear();
}

void ClusterView::add_routes(std::vector<front::admin::Route>& routes) {
  using front::admin::Later;
  using front::admin::Reply;
  using front::admin::Request;
  const auto handler = [impl = impl_](const Request& req, Reply& r, Later& later) {
    int64_t timeout_ms = kDefaultTimeoutMs;
    Entries params;
    if (!parse_query(req.query, params)) {
      return r.json_error(400, "malformed percent-escape in the query string");
    }
    for (const auto& [k, v] : params) {
      if (k != "timeout_ms") continue;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), timeout_ms);
      if (ec != std::errc() || end != v.data() + v.size() || timeout_ms < 1 ||
          timeout_ms > kMaxTimeoutMs) {
        return r.json_error(
            400, "timeout_ms must be an integer from 1 to " + std::to_string(kMaxTimeoutMs));
      }
    }
    impl->gather(req, later, timeout_ms);
  };
  for (const std::string_view path : {"/v1/cluster/top", "/v1/ui/cluster/top"}) {
    routes.push_back(front::admin::Route{"GET", path, front::admin::Access::kRead,
                                         front::admin::Runs::kAdminThread, handler});
  }
}

}  // namespace sluice::node
