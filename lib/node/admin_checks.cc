// The admin port's checks (admin_checks.h).
#include "node/admin_checks.h"

#include <algorithm>
#include <charconv>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "node/admin_input.h"
#include "node/node.h"
#include "wire/protocol.h"
#include "wire/ratelimit_headers.h"

namespace sluice::node {
namespace {

using front::admin::Access;
using front::admin::Later;
using front::admin::Reply;
using front::admin::Request;
using front::admin::Route;
using front::admin::Runs;
using wire::ceil_seconds;

enum class Kind { kCheck, kAuth, kRelease };

// Per thread (connection threads, and workers for a cluster node's answers), reused.
struct Scratch {
  std::vector<wire::Entry> entries;
  CheckInput input;
  std::vector<std::pair<std::string_view, std::string_view>> headers;
  std::vector<uint8_t> request;
  std::vector<uint8_t> answer;
  wire::Answer decoded;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// ---- reading the common /v1/check body ---------------------------------------------------------

// A cursor over a JSON text that takes only what the fast path reads.
struct Cursor {
  std::string_view s;
  size_t i = 0;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
      ++i;
  }
  bool eat(char c) {
    ws();
    if (i >= s.size() || s[i] != c) return false;
    ++i;
    return true;
  }
  // A string without escapes, of printable ASCII only.
  bool plain_string(std::string_view& out) {
    if (!eat('"')) return false;
    const size_t start = i;
    while (i < s.size() && s[i] != '"') {
      const auto u = static_cast<unsigned char>(s[i]);
      if (u < 0x20 || u > 0x7e || s[i] == '\\') return false;
      ++i;
    }
    if (i >= s.size()) return false;
    out = s.substr(start, i - start);
    ++i;
    return true;
  }
  // A non-negative integer without leading zeros, at most kMaxHits.
  bool small_uint(uint64_t& out) {
    ws();
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9')
      ++i;
    const size_t n = i - start;
    if (n == 0 || n > 10 || (n > 1 && s[start] == '0')) return false;
    if (i < s.size() && (s[i] == '.' || s[i] == 'e' || s[i] == 'E')) return false;
    uint64_t v = 0;
    std::from_chars(s.data() + start, s.data() + i, v);
    if (v > kMaxHits) return false;
    out = v;
    return true;
  }
};

// The common shape of a /v1/check body, read without allocating: an object of "domain" (a
// string), "descriptors" (an object of strings) and "hits" (a non-negative integer), each once,
// every string printable ASCII without escapes, descriptor keys distinct. Entries come sorted by
// key, as parse_check_body gives them. False for anything else: parse_check_body reads it then,
// and answers its errors, so both paths give the same answer to every body.
bool parse_check_fast(std::string_view body, std::string_view& domain,
                      std::vector<wire::Entry>& entries, uint64_t& hits) {
  Cursor c{body};
  bool has_domain = false, has_descriptors = false, has_hits = false;
  if (!c.eat('{')) return false;
  if (c.eat('}')) return false;  // no domain: the slow path says so
  do {
    std::string_view key;
    if (!c.plain_string(key) || !c.eat(':')) return false;
    if (key == "domain" && !has_domain) {
      if (!c.plain_string(domain)) return false;
      has_domain = true;
    } else if (key == "hits" && !has_hits) {
      if (!c.small_uint(hits)) return false;
      has_hits = true;
    } else if (key == "descriptors" && !has_descriptors) {
      has_descriptors = true;
      if (!c.eat('{')) return false;
      if (!c.eat('}')) {
        do {
          wire::Entry e;
          if (!c.plain_string(e.key) || !c.eat(':') || !c.plain_string(e.value)) return false;
          entries.push_back(e);
        } while (c.eat(','));
        if (!c.eat('}')) return false;
      }
    } else {
      return false;
    }
  } while (c.eat(','));
  if (!c.eat('}')) return false;
  c.ws();
  if (c.i != body.size() || !has_domain) return false;
  std::sort(entries.begin(), entries.end(),
            [](const wire::Entry& a, const wire::Entry& b) { return a.key < b.key; });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].key == entries[i - 1].key) return false;  // the last one wins: slow path
  }
  return true;
}

// ---- writing answers ---------------------------------------------------------------------------

// A JSON string as nlohmann::json dumps it: '"', '\' and control characters escaped.
void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out += kHex[u >> 4];
          out += kHex[u & 0xf];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void append_int(std::string& out, int64_t n) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, n);
  out.append(buf, static_cast<size_t>(r.ptr - buf));
}

void append_uint(std::string& out, uint64_t n) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, n);
  out.append(buf, static_cast<size_t>(r.ptr - buf));
}

void append_bool(std::string& out, bool b) {
  out += b ? "true" : "false";
}

void append_lease(std::string& out, uint64_t lease) {
  static constexpr char kDigits[] = "0123456789abcdef";
  char text[16];
  for (int i = 15; i >= 0; --i, lease >>= 4)
    text[i] = kDigits[lease & 0xf];
  out.append(text, sizeof text);
}

// The body of a decided check, keys in the order nlohmann::json (a sorted map) writes them.
void append_decision_json(std::string& out, const wire::Decision& d) {
  out += "{\"allowed\":";
  append_bool(out, d.allowed);
  out += ",\"allowlisted\":";
  append_bool(out, d.allowlisted);
  out += ",\"code\":";
  append_json_string(out, wire::to_string(d.code));
  // A concurrency limit admitted the check: the caller gives the lease back with /v1/release.
  if (d.lease != 0) {
    out += ",\"lease\":\"";
    append_lease(out, d.lease);
    out += '"';
  }
  out += ",\"limits\":[";
  bool first = true;
  for (const wire::LimitStatus& l : d.limits) {
    out += first ? "{\"exceeded\":" : ",{\"exceeded\":";
    first = false;
    append_bool(out, l.exceeded);
    out += ",\"limit\":";
    append_uint(out, l.limit);
    out += ",\"mode\":";
    append_json_string(out, wire::to_string(l.mode));
    out += ",\"name\":";
    append_json_string(out, l.name);
    out += ",\"remaining\":";
    append_uint(out, l.remaining);
    out += ",\"reset_s\":";
    append_int(out, ceil_seconds(l.reset_ms));
    out += ",\"retry_after_s\":";
    if (l.retry_after_ms < 0) {
      out += "null";
    } else {
      append_int(out, ceil_seconds(l.retry_after_ms));
    }
    out += ",\"window_s\":";
    append_int(out, ceil_seconds(l.window_ms));
    out += '}';
  }
  out += "],\"shadow\":";
  append_bool(out, d.shadow);
  out += ",\"would_deny\":";
  append_bool(out, d.would_deny);
  out += "}\n";
}

void json(Reply& r, unsigned status) {
  r.status = status;
  r.content_type = "application/json";
}

// /v1/release: 200 when it freed the lease's slots; 409 when it changed nothing (released
// before, expired, or not known for these entries); 503 when the memory cap left no room to
// count the release (nothing changed); 400 for a request error (unknown domain, ...).
void answer_release(const wire::Decision& d, Reply& r) {
  if (d.code == wire::Code::kOk) {
    json(r, 200);
    r.body = "{\"released\":true}\n";
    return;
  }
  switch (d.code) {
    case wire::Code::kLeaseUnknown:
    case wire::Code::kLeaseExpired:
    case wire::Code::kLeaseReleased:
      json(r, 409);
      break;
    case wire::Code::kNoRoom:  // the lease stays held; try again, or it expires
      json(r, 503);
      break;
    default:
      json(r, 400);
      break;
  }
  r.body = "{\"code\":";
  append_json_string(r.body, wire::to_string(d.code));
  r.body += ",\"released\":false}\n";
}

void answer_decision(Kind kind, HttpCheckCounters& counters, const wire::Decision& d, Reply& r);

// The HTTP answer to a check decided on the routed path (the check protocol's answer, `bytes`).
void answer(Kind kind, HttpCheckCounters& counters, std::span<const uint8_t> bytes, Reply& r) {
  wire::Answer& a = scratch().decoded;
  if (bytes.empty() || wire::decode_answer(bytes, a) != wire::Code::kOk ||
      a.decisions.size() != 1) {
    r.json_error(503, "no decision: the node is stopping");
    return;
  }
  answer_decision(kind, counters, a.decisions[0], r);
}

// A decision made on this thread (Node::decide_here) in the shape of the check protocol's answer,
// into the scratch's decision (its vectors and strings reused).
const wire::Decision& owned(const wire::DecisionView& v) {
  wire::Answer& a = scratch().decoded;
  a.decisions.resize(1);
  wire::Decision& d = a.decisions[0];
  wire::assign(d, v);
  return d;
}

// The HTTP answer to a decided check: docs/http.md.
void answer_decision(Kind kind, HttpCheckCounters& counters, const wire::Decision& d, Reply& r) {
  counters.decided.fetch_add(1, std::memory_order_relaxed);
  if (kind == Kind::kRelease) return answer_release(d, r);
  if (d.code != wire::Code::kOk && d.code != wire::Code::kNoRoom) {  // nothing was counted
    json(r, 400);
    r.body = "{\"allowed\":false,\"code\":";
    append_json_string(r.body, wire::to_string(d.code));
    r.body += "}\n";
    return;
  }
  bool enforce_denied = false;
  for (const wire::LimitStatus& l : d.limits)
    enforce_denied = enforce_denied || (l.exceeded && l.mode == wire::Mode::kEnforce);
  enforce_denied = enforce_denied && !d.allowed;
  wire::append_ratelimit_headers(d.limits, enforce_denied, r.headers);
  if (kind == Kind::kCheck || enforce_denied) {
    json(r, !enforce_denied ? 200 : kind == Kind::kCheck ? 429 : 403);
    append_decision_json(r.body, d);
    return;
  }
  // auth_request lets the request through on any 2xx. A shadow denial passes too (the caller
  // must fail silently); the header lets nginx hand the verdict to the upstream. So does a lease
  // (nginx cannot release it; an upstream that can, may).
  r.status = 204;
  if (d.shadow) r.add_header("Sluice-Shadow", "1");
  if (d.lease != 0) {
    r.headers += "Sluice-Lease: ";
    append_lease(r.headers, d.lease);
    r.headers += "\r\n";
  }
}

// Reads the request into s.entries (views into the request or s.input), or the 400's error.
Status read_input(Kind kind, const Request& req, Scratch& s, wire::Check& check) {
  s.entries.clear();
  uint64_t hits = 1;
  if (kind == Kind::kCheck && parse_check_fast(req.body, check.domain, s.entries, hits)) {
    check.hits = static_cast<int64_t>(hits);
    return {};
  }
  s.entries.clear();
  s.input = CheckInput{};
  Status err;
  if (kind == Kind::kCheck) {
    err = parse_check_body(req.body, s.input);
  } else if (kind == Kind::kRelease) {
    err = parse_release_body(req.body, s.input);
  } else {
    s.headers.clear();
    for (const front::admin::Header& h : req.headers)
      s.headers.emplace_back(h.name, h.value);
    err = parse_auth_input(req.query, s.headers, s.input);
  }
  if (!err.ok()) return err;
  for (const auto& [k, v] : s.input.entries)
    s.entries.push_back({k, v});
  check.domain = s.input.domain;
  check.hits = static_cast<int64_t>(s.input.hits);
  check.is_release = s.input.release != 0;
  check.release = s.input.release;
  return {};
}

// Decides on this thread when the node can (on its own); else on the routed path, answering
// through `later`.
void serve(Kind kind, Node& node, HttpCheckCounters& counters, const Request& req, Reply& r,
           Later& later) {
  Scratch& s = scratch();
  wire::Check check;
  if (Status err = read_input(kind, req, s, check); !err.ok()) {
    return r.json_error(400, err.message());
  }
  check.entries = s.entries;
  std::span<const wire::DecisionView> decided;
  if (node.decide_here(std::span<const wire::Check>(&check, 1), decided) && decided.size() == 1) {
    return answer_decision(kind, counters, owned(decided[0]), r);
  }
  wire::encode_request(counters.next_id.fetch_add(1, std::memory_order_relaxed) + 1,
                       std::span<const wire::Check>(&check, 1), 0, s.request);
  if (node.check_here(s.request, s.answer)) return answer(kind, counters, s.answer, r);
  node.check_async(s.request,
                   [done = later.take(), kind, &counters](std::span<const uint8_t> bytes) {
                     Reply reply;
                     answer(kind, counters, bytes, reply);
                     done(std::move(reply));
                   });
}

}  // namespace

void add_check_routes(std::vector<Route>& routes, Node& node, HttpCheckCounters& counters) {
  const auto row = [&](std::string_view method, std::string_view path, Kind kind) {
    routes.push_back(Route{method, path, Access::kOpen, Runs::kConnectionThread,
                           [kind, &node, &counters](const Request& req, Reply& r, Later& later) {
                             serve(kind, node, counters, req, r, later);
                           }});
  };
  row("POST", "/v1/check", Kind::kCheck);
  row("GET", "/v1/auth", Kind::kAuth);
  row("POST", "/v1/release", Kind::kRelease);
}

}  // namespace sluice::node
