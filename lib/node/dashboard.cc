// The dashboard of the admin port (dashboard.h): the per-rule rate history, the page's assets
// and its JSON endpoints.
#include "node/dashboard.h"

#include <utility>  // before Asio: Boost 1.74 with g++ 12 in C++20 needs std::exchange declared

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <iterator>

#include "engine/engine.h"
#include "node/admin_ops.h"
#include "node/node.h"
#include "node_ui_assets.h"  // generated from lib/node/ui/ by lib/node/CMakeLists.txt

namespace sluice::node {

namespace {

using Json = nlohmann::json;

constexpr int64_t kSpanMs =
    Dashboard::kSampleIntervalMs * static_cast<int64_t>(Dashboard::kSamples - 1);

// The engine's cumulative counts of one rule at one sample.
struct Counts {
  uint64_t allowed = 0, denied = 0, shadow_denied = 0, would_deny = 0;
};

struct Sample {
  int64_t t_ms = 0;
  std::vector<Counts> rules;  // by index into Impl::rule_names; shorter: later rules had 0
};

Counts counts_of(const engine::RuleStats& r) {
  return {r.allowed, r.denied, r.shadow_denied, r.would_deny};
}

// Per second between two cumulative counts; 0 when a count went down (cannot, but a rate below 0
// would draw nonsense) or no time passed.
double per_second(uint64_t from, uint64_t to, int64_t dt_ms) {
  if (to < from || dt_ms <= 0) return 0;
  return static_cast<double>(to - from) * 1000.0 / static_cast<double>(dt_ms);
}

struct Asset {
  std::string_view path;
  std::string_view content_type;
  std::string_view body;
};

constexpr Asset kAssets[] = {
    {"/ui", "text/html; charset=utf-8", ui_assets::kIndexHtml},
    {"/ui/", "text/html; charset=utf-8", ui_assets::kIndexHtml},
    {"/ui/dashboard.js", "text/javascript; charset=utf-8", ui_assets::kDashboardJs},
    {"/ui/dashboard.css", "text/css; charset=utf-8", ui_assets::kDashboardCss},
};

}  // namespace

struct Dashboard::Impl {
  Impl(boost::asio::io_context& io_, Node& node_) : node(node_), timer(io_) {}

  Node& node;
  boost::asio::steady_timer timer;
  bool stopped = false;
  std::vector<std::string> rule_names;  // "<domain>/<rule>", in the order first seen
  std::deque<Sample> samples;           // oldest first, at most kSamples

  size_t rule_index(const std::string& name) {
    const auto it = std::find(rule_names.begin(), rule_names.end(), name);
    if (it != rule_names.end()) return static_cast<size_t>(it - rule_names.begin());
    rule_names.push_back(name);
    return rule_names.size() - 1;
  }

  // The engine's counts now, by rule index.
  std::vector<Counts> read_counts() {
    std::vector<Counts> out(rule_names.size());
    for (const engine::RuleStats& r : node.engine().stats().rules) {
      const size_t i = rule_index(r.name);
      if (i >= out.size()) out.resize(i + 1);
      out[i] = counts_of(r);
    }
    return out;
  }

  // Takes a sample when `now` is in a later 5 s slot than the last sample's (or there is none).
  void maybe_sample(int64_t now) {
    if (!samples.empty() && now / kSampleIntervalMs <= samples.back().t_ms / kSampleIntervalMs) {
      return;
    }
    samples.push_back(Sample{now, read_counts()});
    while (samples.size() > kSamples)
      samples.pop_front();
  }

  void schedule() {
    timer.expires_after(std::chrono::milliseconds(kSampleIntervalMs));
    timer.async_wait([weak = std::weak_ptr<Impl>(self)](boost::system::error_code ec) {
      if (ec) return;
      const auto impl = weak.lock();
      if (!impl || impl->stopped) return;
      impl->maybe_sample(impl->node.now_ms());
      impl->schedule();
    });
  }

  Json rates() {
    const int64_t now = node.now_ms();
    maybe_sample(now);
    const std::vector<Counts> current = read_counts();
    // Samples within the span (the ring may reach further back after a pause of the timer).
    auto first = samples.begin();
    while (first != samples.end() && first->t_ms < now - kSpanMs)
      ++first;
    const auto at = [](const Sample& s, size_t i) {
      return i < s.rules.size() ? s.rules[i] : Counts{};
    };

    Json t = Json::array();
    for (auto it = first; it != samples.end(); ++it) {
      if (it != first) t.push_back(it->t_ms);
    }
    Json rules = Json::array();
    for (size_t i = 0; i < rule_names.size(); ++i) {
      Json allowed = Json::array(), denied = Json::array(), shadow = Json::array(),
           would = Json::array();
      for (auto it = first; it != samples.end(); ++it) {
        if (it == first) continue;
        const Counts a = at(*std::prev(it), i), b = at(*it, i);
        const int64_t dt = it->t_ms - std::prev(it)->t_ms;
        allowed.push_back(per_second(a.allowed, b.allowed, dt));
        denied.push_back(per_second(a.denied, b.denied, dt));
        shadow.push_back(per_second(a.shadow_denied, b.shadow_denied, dt));
        would.push_back(per_second(a.would_deny, b.would_deny, dt));
      }
      // Totals from the oldest sample in the span to now: checks made since the last sample
      // count already, before the next sample draws them.
      const Counts base = first == samples.end() ? Counts{} : at(*first, i);
      const Counts& c = current[i];
      const auto since = [](uint64_t from, uint64_t to) { return to >= from ? to - from : 0; };
      rules.push_back(Json{{"rule", rule_names[i]},
                           {"allowed", std::move(allowed)},
                           {"denied", std::move(denied)},
                           {"shadow_denied", std::move(shadow)},
                           {"would_deny", std::move(would)},
                           {"totals",
                            {{"allowed", since(base.allowed, c.allowed)},
                             {"denied", since(base.denied, c.denied)},
                             {"shadow_denied", since(base.shadow_denied, c.shadow_denied)},
                             {"would_deny", since(base.would_deny, c.would_deny)}}}});
    }
    return Json{{"now_ms", now},      {"interval_ms", kSampleIntervalMs},
                {"span_ms", kSpanMs}, {"from_ms", first == samples.end() ? now : first->t_ms},
                {"t", std::move(t)},  {"rules", std::move(rules)}};
  }

  std::weak_ptr<Impl> self;
};

Dashboard::Dashboard(boost::asio::io_context& io, Node& node)
    : impl_(std::make_shared<Impl>(io, node)) {
  impl_->self = impl_;
}

Dashboard::~Dashboard() {
  stop();
}

void Dashboard::start() {
  impl_->stopped = false;
  impl_->maybe_sample(impl_->node.now_ms());
  impl_->schedule();
}

void Dashboard::stop() {
  impl_->stopped = true;
  impl_->timer.cancel();
}

namespace {

void no_store_json(front::admin::Reply& r, unsigned status, const Json& j) {
  r.status = status;
  r.content_type = "application/json";
  r.body = j.dump();
  r.body += '\n';
  r.add_header("Cache-Control", "no-store");
}

}  // namespace

void Dashboard::add_routes(std::vector<front::admin::Route>& routes) {
  using front::admin::Later;
  using front::admin::Reply;
  using front::admin::Request;
  using Fn = std::function<void(const Request&, Reply&)>;
  const auto row = [&](std::string_view path, Fn fn) {
    routes.push_back(front::admin::Route{
        "GET", path, front::admin::Access::kRead, front::admin::Runs::kAdminThread,
        [fn = std::move(fn)](const Request& req, Reply& r, Later&) { fn(req, r); }});
  };
  const auto asset = [](const Request& req, Reply& r) {
    for (const Asset& a : kAssets) {
      if (a.path != req.path) continue;
      r.text(200, a.content_type, a.body);
      r.add_header("Cache-Control", "no-cache");
      // Everything the page loads comes from this port; nothing inline runs.
      r.add_header("Content-Security-Policy",
                   "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
      r.add_header("X-Content-Type-Options", "nosniff");
      return;
    }
    no_store_json(r, 404, Json{{"error", "not found"}});
  };
  row("/ui", asset);
  row("/ui/*", asset);
  row("/v1/ui/rates",
      [impl = impl_](const Request&, Reply& r) { no_store_json(r, 200, impl->rates()); });
  // The other views are the operator endpoints' answers, under the dashboard's read-only paths.
  Node& node = impl_->node;
  row("/v1/ui/top", [&node](const Request& req, Reply& r) {
    const OpsReply o = top_keys(node, req.query);
    no_store_json(r, o.status, o.body);
  });
  row("/v1/ui/overrides", [&node](const Request& req, Reply& r) {
    const OpsReply o = list_overrides(node, req.query);
    no_store_json(r, o.status, o.body);
  });
  row("/v1/ui/cluster", [&node](const Request&, Reply& r) {
    const OpsReply o = cluster_members(node);
    no_store_json(r, o.status, o.body);
  });
  row("/v1/ui/*", [](const Request&, Reply& r) {
    no_store_json(r, 404, Json{{"error", "not found"}});
  });
}

}  // namespace sluice::node
