// The RESP door's Backend (resp_backend.h).
#include <utility>  // before Asio: Boost 1.74 with g++ 12 in C++20 needs std::exchange declared

#include "node/resp_backend.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <charconv>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "node/node.h"
#include "window/cell.h"
#include "wire/protocol.h"
#include "wire/ratelimit_headers.h"

namespace sluice::node {
namespace {

namespace asio = boost::asio;
namespace resp = front::resp;

constexpr int64_t kNsPerMs = 1'000'000;

std::string cell_error(window::CellError e) {
  std::string text(window::kCellErrorPrefix);
  text += window::cell_error_message(e);
  return text;
}

// A request-level refusal (unknown domain, too many entries, ...) in Redis's error shape.
std::string code_error(wire::Code c) {
  std::string text = "ERR ";
  text += wire::to_string(c);
  return text;
}

// One outcome, made on any thread, filled into its Answer on the connection's thread.
template <class T>
struct Outcome {
  bool ok = false;
  T value{};
  std::string error;

  void fill(resp::Answer<T>& a) const {
    if (ok) {
      a.ok(value);
    } else {
      a.fail(error);
    }
  }
};

// CL.THROTTLE's reply from a decided cell check.
Outcome<resp::ThrottleAnswer> throttle_outcome(const wire::Decision& d, const window::CellParams& p,
                                               int64_t quantity) {
  Outcome<resp::ThrottleAnswer> o;
  if (d.code == wire::Code::kHitsTooLarge) {
    o.error = cell_error(window::CellError::kOverRefund);
    return o;
  }
  if (d.code == wire::Code::kMalformed) {
    o.error = cell_error(window::CellError::kOverflow);
    return o;
  }
  if (d.code != wire::Code::kOk || d.limits.size() != 1) {
    o.error = code_error(d.code != wire::Code::kOk ? d.code : wire::Code::kMalformed);
    return o;
  }
  const wire::LimitStatus& l = d.limits[0];
  const int64_t ttl_ns = l.reset_ms * kNsPerMs - l.reset_ns_short;
  const window::CellReply r = window::cell_reply(p, quantity, l.exceeded, ttl_ns);
  o.ok = true;
  o.value = {r.limited, r.limit, r.remaining, r.retry_after_s, r.reset_after_s};
  return o;
}

// SLUICE.CHECK's answer: the limit the RateLimit headers would describe (enforcing limits only;
// dry-run and shadow ones stay invisible to the caller).
Outcome<resp::LeaseAnswer> check_outcome(const wire::Decision& d) {
  Outcome<resp::LeaseAnswer> o;
  if (d.code != wire::Code::kOk && d.code != wire::Code::kNoRoom) {
    o.error = code_error(d.code);
    return o;
  }
  bool enforce_denied = false;
  for (const wire::LimitStatus& l : d.limits)
    enforce_denied = enforce_denied || (l.exceeded && l.mode == wire::Mode::kEnforce);
  enforce_denied = enforce_denied && !d.allowed;
  // TODO(perf): the headline alone, without building the header texts.
  const wire::RateLimitHeaders h = wire::ratelimit_headers(d.limits, enforce_denied);
  o.ok = true;
  resp::CheckAnswer& a = o.value.check;
  a.allowed = d.allowed;
  a.shadow = d.shadow;
  a.would_deny = d.would_deny;
  if (h.headline != nullptr) {
    const wire::LimitStatus& l = *h.headline;
    a.limit = static_cast<int64_t>(l.limit);
    a.remaining = static_cast<int64_t>(l.remaining);
    a.retry_after_s = !l.exceeded            ? 0
                      : l.retry_after_ms < 0 ? -1
                                             : wire::ceil_seconds(l.retry_after_ms);
    a.reset_s = wire::ceil_seconds(l.reset_ms);
  }
  o.value.lease = d.lease;
  return o;
}

Outcome<bool> release_outcome(const wire::Decision& d) {
  Outcome<bool> o;
  switch (d.code) {
    case wire::Code::kOk:
      o.ok = o.value = true;
      break;
    case wire::Code::kLeaseUnknown:
    case wire::Code::kLeaseExpired:
    case wire::Code::kLeaseReleased:
      o.ok = true;
      o.value = false;
      break;
    default:
      o.error = code_error(d.code);
  }
  return o;
}

// DEL: how many of the reset checks found state.
Outcome<int64_t> del_outcome(std::span<const wire::Decision> ds) {
  Outcome<int64_t> o;
  for (const wire::Decision& d : ds) {
    if (d.code != wire::Code::kOk) {
      o.error = code_error(d.code);
      return o;
    }
    o.value += d.allowed ? 1 : 0;
  }
  o.ok = true;
  return o;
}

class NodeRespBackend final : public resp::Backend {
 public:
  NodeRespBackend(Node& node, asio::io_context& io, std::string domain)
      : node_(node), io_(io), domain_(std::move(domain)) {}

  // Held until flush() (or the next other call, or kMaxHeld), then decided together: one pass of
  // the check path for a client's pipeline. A refused one is answered at once (it changes
  // nothing, so answering it before the held ones keeps every effect in request order).
  void throttle(const resp::ThrottleRequest& req,
                resp::Answer<resp::ThrottleAnswer> answer) override {
    window::CellParams p;
    if (const window::CellError e =
            window::make_cell(req.max_burst, req.count_per_period, req.period_s, p);
        e != window::CellError::kNone) {
      return answer.fail(cell_error(e));
    }
    wire::Check c;
    set_cell(c, p, req.quantity);
    if (wire::check_code(c) != wire::Code::kOk) {
      return answer.fail(cell_error(window::CellError::kOverflow));
    }
    held_.push_back(
        Held{p, req.quantity, req.db, held_keys_.size(), req.key.size(), std::move(answer)});
    held_keys_.append(req.key);
    if (held_.size() >= kMaxHeld) flush();
  }

  void flush() override {
    if (held_.empty()) return;
    checks_.clear();
    // Sized first: the checks' entries point into them.
    if (entries_.size() < held_.size() * 2) entries_.resize(held_.size() * 2);
    if (db_text_.size() < held_.size()) db_text_.resize(held_.size());
    for (size_t i = 0; i < held_.size(); ++i) {
      add_cell_check(held_[i].db, held_key(held_[i]), i);
      set_cell(checks_.back(), held_[i].params, held_[i].quantity);
    }
    std::span<const wire::DecisionView> views;
    if (node_.decide_here(checks_, views) && views.size() == checks_.size()) {
      decided_.resize(views.size());
      for (size_t i = 0; i < views.size(); ++i) {
        wire::assign(decided_[i], views[i]);
        throttle_outcome(decided_[i], held_[i].params, held_[i].quantity).fill(held_[i].answer);
      }
    } else {
      // A cluster node: each takes the routed path on its own, in order.
      for (Held& h : held_) {
        checks_.clear();
        add_cell_check(h.db, held_key(h), 0);
        set_cell(checks_.back(), h.params, h.quantity);
        const window::CellParams p = h.params;
        const int64_t quantity = h.quantity;
        decide(
            [p, quantity](std::span<const wire::Decision> ds) {
              return throttle_outcome(ds[0], p, quantity);
            },
            std::move(h.answer));
      }
    }
    held_.clear();
    held_keys_.clear();
  }

  void del(const resp::DelRequest& req, resp::Answer<int64_t> answer) override {
    flush();
    checks_.clear();
    // Sized first: the checks' entries point into them.
    if (entries_.size() < req.keys.size() * 2) entries_.resize(req.keys.size() * 2);
    if (db_text_.size() < req.keys.size()) db_text_.resize(req.keys.size());
    for (size_t i = 0; i < req.keys.size(); ++i) {
      add_cell_check(req.db, req.keys[i], i);
      wire::Check& c = checks_.back();
      c.cell_reset = true;
      c.cell_interval_ns = 1;
      c.cell_limit = 1;
    }
    decide([](std::span<const wire::Decision> ds) { return del_outcome(ds); }, std::move(answer));
  }

  void check(const resp::CheckRequest& req, resp::Answer<resp::CheckAnswer> answer) override {
    flush();
    rules_check(req.domain, req.entries, req.hits);
    decide(
        [](std::span<const wire::Decision> ds) {
          const Outcome<resp::LeaseAnswer> l = check_outcome(ds[0]);
          return Outcome<resp::CheckAnswer>{l.ok, l.value.check, l.error};
        },
        std::move(answer));
  }

  void acquire(const resp::CheckRequest& req, resp::Answer<resp::LeaseAnswer> answer) override {
    flush();
    rules_check(req.domain, req.entries, req.hits);
    decide([](std::span<const wire::Decision> ds) { return check_outcome(ds[0]); },
           std::move(answer));
  }

  void release(const resp::ReleaseRequest& req, resp::Answer<bool> answer) override {
    flush();
    rules_check(req.domain, req.entries, 0);
    checks_.back().is_release = true;
    checks_.back().release = req.lease;
    decide([](std::span<const wire::Decision> ds) { return release_outcome(ds[0]); },
           std::move(answer));
  }

 private:
  // A CL.THROTTLE waiting for flush(); its key is held_keys_[key_at, key_at + key_size).
  struct Held {
    window::CellParams params;
    int64_t quantity = 0;
    int db = 0;
    size_t key_at = 0, key_size = 0;
    resp::Answer<resp::ThrottleAnswer> answer;
  };
  // CL.THROTTLE commands decided together at most (far under wire::kMaxChecks).
  static constexpr size_t kMaxHeld = 64;

  std::string_view held_key(const Held& h) const {
    return std::string_view(held_keys_).substr(h.key_at, h.key_size);
  }

  static void set_cell(wire::Check& c, const window::CellParams& p, int64_t quantity) {
    c.has_cell_limit = true;
    c.cell_interval_ns = p.interval_ns;
    c.cell_limit = p.limit;
    c.cell_quantity = quantity;
  }

  // A cell check of `key` (in database `db`) into checks_, its entries in entries_ at `slot`.
  void add_cell_check(int db, std::string_view key, size_t slot) {
    if (entries_.size() < (slot + 1) * 2) entries_.resize((slot + 1) * 2);
    if (db_text_.size() <= slot) db_text_.resize(slot + 1);
    wire::Entry* e = &entries_[slot * 2];
    size_t n = 0;
    if (db != 0) {
      char buf[16];
      const auto r = std::to_chars(buf, buf + sizeof buf, db);
      db_text_[slot].assign(buf, r.ptr);
      e[n++] = {"db", db_text_[slot]};
    }
    e[n++] = {"key", key};
    wire::Check c;
    c.domain = domain_;
    c.entries = std::span<const wire::Entry>(e, n);
    c.has_cell_limit = true;
    checks_.push_back(c);
  }

  void rules_check(std::string_view domain, std::span<const std::string_view> pairs,
                   uint64_t hits) {
    entries_.clear();
    for (size_t i = 0; i + 1 < pairs.size(); i += 2)
      entries_.push_back({pairs[i], pairs[i + 1]});
    checks_.clear();
    wire::Check c;
    c.domain = domain;
    c.entries = entries_;
    c.hits = static_cast<int64_t>(hits);
    checks_.push_back(c);
  }

  // Decides checks_ here when the node decides alone, else on the routed path; `make` turns the
  // decisions into the outcome, which fills `answer` on this backend's thread.
  template <class T, class Make>
  void decide(Make make, resp::Answer<T> answer) {
    std::span<const wire::DecisionView> views;
    if (node_.decide_here(checks_, views) && views.size() == checks_.size()) {
      decided_.resize(views.size());
      for (size_t i = 0; i < views.size(); ++i)
        wire::assign(decided_[i], views[i]);
      make(std::span<const wire::Decision>(decided_)).fill(answer);
      return;
    }
    wire::encode_request(++next_id_, checks_, 0, request_);
    auto slot = std::make_shared<resp::Answer<T>>(std::move(answer));
    const size_t expected = checks_.size();
    node_.check_async(request_, [&io = io_, slot, make, expected](std::span<const uint8_t> bytes) {
      // On whichever worker got the answer: decode here, fill on the connection's thread.
      wire::Answer a;
      auto out = std::make_shared<decltype(make(std::span<const wire::Decision>()))>();
      if (bytes.empty() || wire::decode_answer(bytes, a) != wire::Code::kOk ||
          a.decisions.size() != expected) {
        out->error = "ERR no decision: the node is stopping";
      } else {
        *out = make(std::span<const wire::Decision>(a.decisions));
      }
      asio::post(io, [slot, out] { out->fill(*slot); });
    });
  }

  Node& node_;
  asio::io_context& io_;
  const std::string domain_;
  uint64_t next_id_ = 0;
  // Reused from call to call (this thread only).
  std::vector<wire::Check> checks_;
  std::vector<wire::Entry> entries_;
  std::vector<std::string> db_text_;
  std::vector<wire::Decision> decided_;
  std::vector<uint8_t> request_;
  std::vector<Held> held_;
  std::string held_keys_;
};

}  // namespace

std::shared_ptr<resp::Backend> make_resp_backend(Node& node, asio::io_context& io,
                                                 std::string domain) {
  return std::make_shared<NodeRespBackend>(node, io, std::move(domain));
}

}  // namespace sluice::node
