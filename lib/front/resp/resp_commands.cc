// The RESP door's commands (resp_session.h): the table COMMAND and the dispatcher read, the
// connection commands answered in redis-server 7.2's words, and the rate-limit commands'
// argument checks before the Backend. Texts: redis src/networking.c (HELLO, CLIENT), acl.c
// (AUTH), server.c (PING, INFO, COMMAND), db.c (SELECT), config.c (CONFIG GET), multi.c.
#include <algorithm>
#include <array>

#include "front/resp/session_core.h"

namespace sluice::front::resp::detail {
namespace {

using Args = std::span<const std::string_view>;

char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c | 0x20) : c;
}

bool iequals(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](char x, char y) { return lower(x) == lower(y); });
}

// Rust's i64::from_str, as redis-cell's parse_i64: an optional sign, then one or more digits
// (leading zeros allowed).
bool parse_cell_i64(std::string_view s, int64_t& out) {
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  return digits_to_int64(s, negative, out);
}

// Equal, in a time that depends on the lengths only.
bool constant_time_equals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const auto x = static_cast<unsigned char>(i < a.size() ? a[i] : 0);
    const auto y = static_cast<unsigned char>(i < b.size() ? b[i] : 0);
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

// redis's validateClientAttr: printable ASCII without spaces.
bool valid_client_attr(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '!' && c <= '~'; });
}

// Redis's ACL with one user, "default": any password without requirepass (the nopass user).
bool authenticate(SessionCore& s, std::string_view user, std::string_view password) {
  const bool ok = user == "default" &&
                  (s.config.password.empty() || constant_time_equals(password, s.config.password));
  if (ok) {
    s.authenticated = true;
  } else {
    s.counters.auth_failures.fetch_add(1, std::memory_order_relaxed);
  }
  return ok;
}

constexpr std::string_view kWrongPass =
    "WRONGPASS invalid username-password pair or user is disabled.";

void hello_map(SessionCore& s) {
  RespWriter w = s.writer();
  w.map(7);
  w.bulk("server");
  // "redis": clients compare this field with "redis" (Valkey says "valkey", and some clients
  // switch behaviour on it), and the door speaks Redis 7.2's protocol; INFO's sluice_version
  // says what answers.
  w.bulk("redis");
  w.bulk("version");
  w.bulk(kRedisVersion);
  w.bulk("proto");
  w.integer(static_cast<int64_t>(s.protocol));
  w.bulk("id");
  w.integer(static_cast<int64_t>(s.client_id));
  w.bulk("mode");
  w.bulk("standalone");
  w.bulk("role");
  w.bulk("master");
  w.bulk("modules");
  w.array(0);
}

void cmd_hello(SessionCore& s, Args args) {
  int64_t version = 0;
  size_t i = 1;
  if (args.size() >= 2) {
    if (!parse_redis_int(args[1], version))
      return s.writer().error("ERR Protocol version is not an integer or out of range");
    if (version < 2 || version > 3) return s.writer().error("NOPROTO unsupported protocol version");
    i = 2;
  }
  std::string_view user, password, name;
  bool has_auth = false, has_name = false;
  for (; i < args.size(); ++i) {
    const size_t more = args.size() - 1 - i;
    if (iequals(args[i], "AUTH") && more >= 2) {
      user = args[i + 1];
      password = args[i + 2];
      has_auth = true;
      i += 2;
    } else if (iequals(args[i], "SETNAME") && more >= 1) {
      name = args[++i];
      has_name = true;
      if (!valid_client_attr(name))
        return s.writer().error(
            "ERR Client names cannot contain spaces, newlines or special characters.");
    } else {
      std::string text = "ERR Syntax error in HELLO option '";
      text.append(args[i]);
      text.push_back('\'');
      return s.writer().error(text);
    }
  }
  if (has_auth && !authenticate(s, user, password)) return s.writer().error(kWrongPass);
  if (!s.authenticated)
    return s.writer().error(
        "NOAUTH HELLO must be called with the client already authenticated, otherwise the "
        "HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and "
        "select the RESP protocol version at the same time");
  if (has_name) s.name.assign(name);
  if (version != 0) s.protocol = version == 3 ? Protocol::kResp3 : Protocol::kResp2;
  hello_map(s);
}

void cmd_auth(SessionCore& s, Args args) {
  if (args.size() > 3) return s.writer().error("ERR syntax error");
  if (args.size() == 2 && s.config.password.empty())
    return s.writer().error(
        "ERR AUTH <password> called without any password configured for the default user. "
        "Are you sure your configuration is correct?");
  const bool ok =
      args.size() == 2 ? authenticate(s, "default", args[1]) : authenticate(s, args[1], args[2]);
  if (!ok) return s.writer().error(kWrongPass);
  s.writer().simple("OK");
}

void cmd_ping(SessionCore& s, Args args) {
  if (args.size() > 2) return s.writer().error("ERR wrong number of arguments for 'ping' command");
  if (args.size() == 1) return s.writer().simple("PONG");
  s.writer().bulk(args[1]);
}

void cmd_echo(SessionCore& s, Args args) {
  s.writer().bulk(args[1]);
}

void cmd_quit(SessionCore& s, Args) {
  s.writer().simple("OK");
  s.close_after_reply();
}

void cmd_select(SessionCore& s, Args args) {
  int64_t db = 0;
  if (!parse_redis_int(args[1], db) || db < INT32_MIN || db > INT32_MAX)
    return s.writer().error("ERR value is not an integer or out of range");
  if (db < 0 || db >= kDatabases) return s.writer().error("ERR DB index is out of range");
  s.db = static_cast<int>(db);
  s.writer().simple("OK");
}

void cmd_client_setname(SessionCore& s, Args args) {
  if (!valid_client_attr(args[2]))
    return s.writer().error(
        "ERR Client names cannot contain spaces, newlines or special characters.");
  s.name.assign(args[2]);
  s.writer().simple("OK");
}

void cmd_client_getname(SessionCore& s, Args) {
  if (s.name.empty()) return s.writer().null();
  s.writer().bulk(s.name);
}

void cmd_client_setinfo(SessionCore& s, Args args) {
  std::string text;
  if (!iequals(args[2], "lib-name") && !iequals(args[2], "lib-ver")) {
    text.append("ERR Unrecognized option '").append(args[2]).append("'");
    return s.writer().error(text);
  }
  if (!valid_client_attr(args[3])) {
    text.append("ERR ").append(args[2]).append(
        " cannot contain spaces, newlines or special characters.");
    return s.writer().error(text);
  }
  s.writer().simple("OK");  // remembered nowhere: CLIENT LIST and INFO do not show clients
}

void cmd_client_id(SessionCore& s, Args) {
  s.writer().integer(static_cast<int64_t>(s.client_id));
}

// CLIENT and CONFIG without a subcommand: never run, their arity (-2) refuses them first.
void cmd_container(SessionCore&, Args) {}

void cmd_info(SessionCore& s, Args args) {
  constexpr std::array<std::string_view, 3> kNames = {"server", "persistence", "replication"};
  std::array<bool, 3> want{};
  if (args.size() == 1) want.fill(true);
  for (size_t i = 1; i < args.size(); ++i) {
    if (iequals(args[i], "default") || iequals(args[i], "all") || iequals(args[i], "everything"))
      want.fill(true);
    for (size_t k = 0; k < kNames.size(); ++k)
      if (iequals(args[i], kNames[k])) want[k] = true;
  }
  std::string text;
  const auto section = [&](std::string_view head) {
    if (!text.empty()) text.append("\r\n");
    text.append(head);
  };
  if (want[0]) {
    section("# Server\r\nredis_version:");
    text.append(kRedisVersion).append("\r\nredis_mode:standalone\r\nsluice_version:");
    text.append(s.config.sluice_version).append("\r\narch_bits:64\r\n");
  }
  if (want[1]) section("# Persistence\r\nloading:0\r\nasync_loading:0\r\n");
  if (want[2]) section("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n");
  s.writer().verbatim("txt", text);
}

void cmd_command(SessionCore& s, Args) {
  RespWriter w = s.writer();
  const auto table = command_table();
  w.array(table.size());
  for (const CommandSpec& spec : table)
    write_command_info(w, spec);
}

void cmd_command_count(SessionCore& s, Args) {
  s.writer().integer(static_cast<int64_t>(command_table().size()));
}

void cmd_command_info(SessionCore& s, Args args) {
  if (args.size() == 2) return cmd_command(s, args);
  RespWriter w = s.writer();
  w.array(args.size() - 2);
  for (size_t i = 2; i < args.size(); ++i) {
    const CommandSpec* spec = find_command(args[i]);
    if (spec == nullptr) {
      w.null();
    } else {
      write_command_info(w, *spec);
    }
  }
}

// redis-benchmark reads `save` and `appendonly`; the rest are not settings of this door.
void cmd_config_get(SessionCore& s, Args args) {
  constexpr std::array<std::pair<std::string_view, std::string_view>, 2> kSettings = {
      {{"save", ""}, {"appendonly", "no"}}};
  std::array<bool, kSettings.size()> found{};
  for (size_t i = 2; i < args.size(); ++i)
    for (size_t k = 0; k < kSettings.size(); ++k)
      if (iequals(args[i], kSettings[k].first)) found[k] = true;
  RespWriter w = s.writer();
  w.map(static_cast<size_t>(std::count(found.begin(), found.end(), true)));
  for (size_t k = 0; k < kSettings.size(); ++k) {
    if (!found[k]) continue;
    w.bulk(kSettings[k].first);
    w.bulk(kSettings[k].second);
  }
}

void cmd_multi(SessionCore& s, Args) {
  if (s.in_multi) return s.writer().error("ERR MULTI calls can not be nested");
  s.in_multi = true;
  s.writer().simple("OK");
}

void cmd_exec(SessionCore& s, Args) {
  s.exec();
}

void cmd_discard(SessionCore& s, Args) {
  if (!s.in_multi) return s.writer().error("ERR DISCARD without MULTI");
  s.discard_multi();
  s.writer().simple("OK");
}

std::string_view throttle_arity(Args args) {
  if (args.size() == 5 || args.size() == 6) return {};
  return "Cell error: Store error: Usage: cl.throttle <key> <max_burst> <count per period> "
         "<period> [<quantity>]";
}

void cmd_throttle(SessionCore& s, Args args) {
  int64_t v[4] = {0, 0, 0, 1};
  for (size_t i = 2; i < args.size(); ++i) {
    if (!parse_cell_i64(args[i], v[i - 2])) {
      std::string text = "Cell error: Store error: Couldn't parse as integer: ";
      text.append(args[i]);
      return s.writer().error(text);
    }
  }
  const ThrottleRequest req{s.db, args[1], v[0], v[1], v[2], v[3]};
  s.backend.throttle(req, s.await<ThrottleAnswer>());
}

void cmd_del(SessionCore& s, Args args) {
  s.backend.del(DelRequest{s.db, args.subspan(1)}, s.await<int64_t>());
}

std::string_view check_arity(Args args) {
  if (args.size() >= 4 && args.size() % 2 == 0) return {};
  return iequals(args[0], "sluice.check")
             ? "ERR wrong number of arguments for 'sluice.check' command"
             : "ERR wrong number of arguments for 'sluice.acquire' command";
}

std::string_view release_arity(Args args) {
  if (args.size() >= 5 && args.size() % 2 == 1) return {};
  return "ERR wrong number of arguments for 'sluice.release' command";
}

// `domain key value ... [HITS n]` from args[1]. False: an error was answered.
bool parse_check(SessionCore& s, Args args, CheckRequest& req) {
  req.domain = args[1];
  Args entries = args.subspan(2);
  if (entries.size() >= 4 && iequals(entries[entries.size() - 2], "HITS")) {
    int64_t hits = 0;
    if (!parse_redis_int(entries.back(), hits) || hits < 0) {
      s.writer().error("ERR value is not an integer or out of range");
      return false;
    }
    req.hits = static_cast<uint64_t>(hits);
    entries = entries.first(entries.size() - 2);
  }
  req.entries = entries;
  return true;
}

void cmd_check(SessionCore& s, Args args) {
  CheckRequest req;
  if (parse_check(s, args, req)) s.backend.check(req, s.await<CheckAnswer>());
}

void cmd_acquire(SessionCore& s, Args args) {
  CheckRequest req;
  if (parse_check(s, args, req)) s.backend.acquire(req, s.await<LeaseAnswer>());
}

// A lease as answers spell it: 16 lowercase hex digits, not all zero.
bool parse_lease(std::string_view text, uint64_t& lease) {
  if (text.size() != 16) return false;
  lease = 0;
  for (const char c : text) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    lease = lease << 4 | static_cast<uint64_t>(d);
  }
  return lease != 0;
}

void cmd_release(SessionCore& s, Args args) {
  ReleaseRequest req;
  req.domain = args[1];
  if (!parse_lease(args[2], req.lease))
    return s.writer().error("ERR invalid lease: 16 lowercase hex digits expected");
  req.entries = args.subspan(3);
  s.backend.release(req, s.await<bool>());
}

constexpr uint32_t kConn = kNoScript | kLoading | kStale;

const CommandSpec kClientSubcommands[] = {
    {"client|getname", 2, kConn, 0, 0, 0, cmd_client_getname, {}, nullptr},
    {"client|id", 2, kConn, 0, 0, 0, cmd_client_id, {}, nullptr},
    {"client|setinfo", 4, kConn, 0, 0, 0, cmd_client_setinfo, {}, nullptr},
    {"client|setname", 3, kConn, 0, 0, 0, cmd_client_setname, {}, nullptr},
};

const CommandSpec kCommandSubcommands[] = {
    {"command|count", 2, kLoading | kStale, 0, 0, 0, cmd_command_count, {}, nullptr},
    {"command|info", -2, kLoading | kStale, 0, 0, 0, cmd_command_info, {}, nullptr},
};

const CommandSpec kConfigSubcommands[] = {
    {"config|get", -3, kAdmin | kConn, 0, 0, 0, cmd_config_get, {}, nullptr},
};

const CommandSpec kCommands[] = {
    {"auth", -2, kConn | kFast | kNoAuth, 0, 0, 0, cmd_auth, {}, nullptr},
    {"cl.throttle", -5, kWrite | kDenyOom | kFast, 1, 1, 1, cmd_throttle, {}, throttle_arity},
    {"client", -2, 0, 0, 0, 0, cmd_container, kClientSubcommands, nullptr},
    {"command", -1, kLoading | kStale, 0, 0, 0, cmd_command, kCommandSubcommands, nullptr},
    {"config", -2, 0, 0, 0, 0, cmd_container, kConfigSubcommands, nullptr},
    {"del", -2, kWrite, 1, -1, 1, cmd_del, {}, nullptr},
    {"discard", 1, kConn | kFast, 0, 0, 0, cmd_discard, {}, nullptr},
    {"echo", 2, kFast, 0, 0, 0, cmd_echo, {}, nullptr},
    {"exec", 1, kConn | kSkipSlowlog, 0, 0, 0, cmd_exec, {}, nullptr},
    {"hello", -1, kConn | kFast | kNoAuth, 0, 0, 0, cmd_hello, {}, nullptr},
    {"info", -1, kLoading | kStale, 0, 0, 0, cmd_info, {}, nullptr},
    {"multi", 1, kConn | kFast, 0, 0, 0, cmd_multi, {}, nullptr},
    {"ping", -1, kFast | kNoAuth, 0, 0, 0, cmd_ping, {}, nullptr},
    {"quit", -1, kConn | kFast | kNoAuth, 0, 0, 0, cmd_quit, {}, nullptr},
    {"select", 2, kLoading | kStale | kFast, 0, 0, 0, cmd_select, {}, nullptr},
    {"sluice.acquire", -4, kWrite | kFast, 0, 0, 0, cmd_acquire, {}, check_arity},
    {"sluice.check", -4, kWrite | kFast, 0, 0, 0, cmd_check, {}, check_arity},
    {"sluice.release", -5, kWrite | kFast, 0, 0, 0, cmd_release, {}, release_arity},
};

const CommandSpec* find_in(std::span<const CommandSpec> table, std::string_view name, size_t skip) {
  for (const CommandSpec& spec : table)
    if (iequals(spec.name.substr(skip), name)) return &spec;
  return nullptr;
}

void write_flags(RespWriter& w, uint32_t flags) {
  constexpr std::pair<uint32_t, std::string_view> kNames[] = {
      {kWrite, "write"},   {kReadonly, "readonly"},        {kDenyOom, "denyoom"},
      {kAdmin, "admin"},   {kNoScript, "noscript"},        {kLoading, "loading"},
      {kStale, "stale"},   {kSkipSlowlog, "skip_slowlog"}, {kFast, "fast"},
      {kNoAuth, "no_auth"}};
  size_t n = 0;
  for (const auto& [flag, name] : kNames)
    n += (flags & flag) != 0 ? 1 : 0;
  w.set(n);
  for (const auto& [flag, name] : kNames)
    if ((flags & flag) != 0) w.simple(name);
}

}  // namespace

std::span<const CommandSpec> command_table() {
  return kCommands;
}

const CommandSpec* find_command(std::string_view name) {
  return find_in(kCommands, name, 0);
}

const CommandSpec* find_subcommand(const CommandSpec& container, std::string_view name) {
  return find_in(container.subcommands, name, container.name.size() + 1);
}

// redis 7's COMMAND INFO entry: name, arity, flags, first key, last key, key step, ACL
// categories (from the flags: @write, @read, @fast or @slow), tips (none), key specifications
// (none given: the three key numbers before say where the keys are), subcommands.
void write_command_info(RespWriter& w, const CommandSpec& spec) {
  w.array(10);
  w.bulk(spec.name);
  w.integer(spec.arity);
  write_flags(w, spec.flags);
  w.integer(spec.first_key);
  w.integer(spec.last_key);
  w.integer(spec.key_step);
  const bool write = (spec.flags & kWrite) != 0, read = (spec.flags & kReadonly) != 0;
  w.set(size_t{write} + size_t{read} + 1);
  if (write) w.simple("@write");
  if (read) w.simple("@read");
  w.simple((spec.flags & kFast) != 0 ? "@fast" : "@slow");
  w.array(0);
  w.array(0);
  w.array(spec.subcommands.size());
  for (const CommandSpec& sub : spec.subcommands)
    write_command_info(w, sub);
}

}  // namespace sluice::front::resp::detail
