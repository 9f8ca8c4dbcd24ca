// sluicectl's command line (sluicectl_args.h).
#include "sluicectl_args.h"

#include <CLI/CLI.hpp>

#include <sstream>

#include "base/release.h"

namespace sluice::ctl {

using nlohmann::json;

std::string descriptors_json(const std::vector<std::string>& pairs, json& out) {
  out = json::object();
  for (const auto& p : pairs) {
    const auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) return "'" + p + "' is not key=value";
    out[p.substr(0, eq)] = p.substr(eq + 1);
  }
  if (out.empty()) return "name at least one key=value descriptor entry";
  return "";
}

namespace {

// The subcommands, built on `app` and bound to `inv`'s fields; each is returned so the caller can
// tell which one ran.
struct Subcommands {
  CLI::App *check, *status, *ovr, *ovr_set, *ovr_get, *ovr_del, *ovr_list, *plan_cmd, *plan_assign,
      *insp, *top, *snap, *ring, *drain, *convert;
};

Subcommands build(CLI::App& app, Invocation& inv, std::vector<std::string>& limits,
                  std::string& mode, std::string& ttl, std::string& plan, std::string& granularity,
                  std::vector<std::string>& assign_args) {
  Subcommands s{};
  app.set_version_flag("--version", "sluicectl " + std::string(kThisVersion),
                       "print the release (CHANGELOG.md) and exit");
  app.require_subcommand(1);
  app.add_flag("--json", inv.as_json, "print JSON (one object per line)");

  s.check = app.add_subcommand("check", "ask whether a request may go ahead");
  s.check->add_option("domain", inv.domain, "rules domain")->required();
  s.check->add_option("entries", inv.pairs, "descriptor entries key=value");
  s.check->add_option("--hits", inv.hits, "cost of the request (0 asks without counting)");
  s.check->add_option("--server", inv.server, "node check address host:port");
  s.check->add_flag("--tcp", inv.tcp, "use TCP instead of UDP");
  s.check
      ->add_option("--repeat", inv.repeat,
                   "send the check this many times in a row (exit code: last)")
      ->check(CLI::Range(1, 100'000));
  s.check->add_option("--timeout-ms", inv.timeout_ms, "give up after this long")
      ->check(CLI::Range(1, 60'000));
  s.check->add_flag("--json", inv.as_json, "print JSON");

  const char* kTokenHelp =
      "file holding the node's admin token, sent as Authorization: Bearer (default: the "
      "SLUICE_ADMIN_TOKEN environment variable)";
  s.status = app.add_subcommand("status", "show a node's counters and rule statistics");
  s.status->add_option("--admin", inv.admin, "node admin HTTP address host:port");
  s.status->add_option("--token-file", inv.token_file, kTokenHelp);
  s.status->add_flag("--json", inv.as_json, "print JSON");

  // Operator commands talk to the admin port.
  const auto admin_opt = [&](CLI::App* c) {
    c->add_option("--admin", inv.admin, "node admin HTTP address host:port");
    c->add_option("--token-file", inv.token_file, kTokenHelp);
    c->add_flag("--json", inv.as_json, "print JSON");
  };
  s.ovr = app.add_subcommand("override", "set, get, list or delete runtime overrides");
  s.ovr->require_subcommand(1);
  s.ovr_set = s.ovr->add_subcommand(
      "set", "new limits and/or mode for one key, stored (WAL synced) and applied at once");
  s.ovr_set->add_option("domain", inv.domain, "rules domain")->required();
  s.ovr_set->add_option("entries", inv.pairs, "the key's descriptor entries key=value")->required();
  s.ovr_set->add_option("--limit", limits, "N/window, e.g. 500/1m (repeatable)");
  s.ovr_set->add_option("--granularity", granularity,
                        "bucket size of the limits, e.g. 1s (default: the rule's)");
  s.ovr_set->add_option("--mode", mode, "enforce | dry-run | shadow");
  s.ovr_set->add_option("--ttl", ttl, "expire after e.g. 90s, 30m, 24h, 7d (default: never)");
  s.ovr_set->add_option("--plan", plan, "use this plan's limits");
  admin_opt(s.ovr_set);
  s.ovr_get = s.ovr->add_subcommand("get", "show the override of one key (exit 1: none)");
  s.ovr_get->add_option("domain", inv.domain, "rules domain")->required();
  s.ovr_get->add_option("entries", inv.pairs, "descriptor entries key=value")->required();
  admin_opt(s.ovr_get);
  s.ovr_del = s.ovr->add_subcommand("del", "delete the override of one key (exit 1: none)");
  s.ovr_del->alias("delete");
  s.ovr_del->add_option("domain", inv.domain, "rules domain")->required();
  s.ovr_del->add_option("entries", inv.pairs, "descriptor entries key=value")->required();
  admin_opt(s.ovr_del);
  s.ovr_list = s.ovr->add_subcommand("list", "every override in force");
  s.ovr_list->add_option("domain", inv.domain, "only this domain");
  admin_opt(s.ovr_list);

  s.plan_cmd = app.add_subcommand("plan", "subscription plans");
  s.plan_cmd->require_subcommand(1);
  s.plan_assign = s.plan_cmd->add_subcommand(
      "assign", "put one key on a plan of its domain: DOMAIN key=value PLAN");
  s.plan_assign->add_option("args", assign_args, "DOMAIN key=value... PLAN")
      ->required()
      ->expected(3, -1);
  s.plan_assign->add_option("--ttl", ttl, "expire after e.g. 30d (default: never)");
  admin_opt(s.plan_assign);

  s.insp =
      app.add_subcommand("inspect", "a key's rules, overrides, buckets and estimates on a node");
  s.insp->add_option("domain", inv.domain, "rules domain")->required();
  s.insp->add_option("entries", inv.pairs, "descriptor entries key=value")->required();
  admin_opt(s.insp);

  s.top = app.add_subcommand(
      "top", "keys nearest to or over their limits, and keys a dry-run rule would deny");
  s.top->add_option("-n,--limit", inv.top_n, "rows")->check(CLI::Range(1, 512));
  s.top->add_flag("--watch", inv.watch, "refresh until interrupted");
  s.top->add_option("--interval", inv.interval_s, "seconds between refreshes")
      ->check(CLI::Range(0.1, 3600.0));
  s.top->add_option("--count", inv.count, "with --watch: stop after this many refreshes");
  s.top->add_flag("--cluster", inv.cluster,
                  "the whole cluster instead: each rule's decisions summed over every member, "
                  "per member, and the members' states");
  s.top
      ->add_option("--member-timeout-ms", inv.cluster_timeout_ms,
                   "with --cluster: how long the node waits for each member's answer")
      ->check(CLI::Range(1, 10'000));
  admin_opt(s.top);

  s.snap = app.add_subcommand("snapshot", "write a snapshot of the node's counters now");
  s.snap->add_flag("--full", inv.full,
                   "write every counter, not only those changed since the last");
  admin_opt(s.snap);

  s.ring = app.add_subcommand(
      "ring", "each member's share of the keys, or the owners of a request's counters");
  s.ring->add_option("domain", inv.domain, "rules domain (omit for the members' shares)");
  s.ring->add_option("entries", inv.pairs, "descriptor entries key=value");
  admin_opt(s.ring);

  s.drain = app.add_subcommand(
      "drain",
      "make the node leave the cluster gracefully (its keys move to the others), then stop");
  admin_opt(s.drain);

  auto* rules_cmd = app.add_subcommand("rules", "work with rules files offline");
  rules_cmd->require_subcommand(1);
  s.convert = rules_cmd->add_subcommand(
      "convert", "print the Sluice rules equivalent of envoyproxy/ratelimit config files");
  s.convert->add_option("path", inv.convert_path, "a YAML file or a directory of them")->required();
  return s;
}

Invocation refused(Invocation inv, std::string why) {
  inv.command = Command::kNone;
  inv.exit_code = kError;
  inv.error = std::move(why);
  return inv;
}

}  // namespace

struct CommandLineParser::Impl {
  CLI::App app{"sluicectl: operate Sluice nodes\nexit codes: 0 allowed / ok, 1 denied, 2 error",
               "sluicectl"};
  Invocation inv;  // the options write here
  std::vector<std::string> limits, assign_args;
  std::string mode, ttl, plan, granularity;
  Subcommands s = build(app, inv, limits, mode, ttl, plan, granularity, assign_args);
};

CommandLineParser::CommandLineParser() : impl_(std::make_unique<Impl>()) {}
CommandLineParser::~CommandLineParser() = default;

Invocation parse_command_line(const std::vector<std::string>& argv) {
  return CommandLineParser().parse(argv);
}

Invocation CommandLineParser::parse(const std::vector<std::string>& argv) {
  // Back to the defaults: the options keep pointers to these, so they are assigned, not rebuilt.
  Impl& m = *impl_;
  m.inv = Invocation{};
  m.limits.clear();
  m.assign_args.clear();
  m.mode.clear();
  m.ttl.clear();
  m.plan.clear();
  m.granularity.clear();
  m.app.clear();
  CLI::App& app = m.app;
  Invocation& inv = m.inv;
  std::vector<std::string>& limits = m.limits;
  std::vector<std::string>& assign_args = m.assign_args;
  std::string &mode = m.mode, &ttl = m.ttl, &plan = m.plan, &granularity = m.granularity;
  const Subcommands& s = m.s;
  try {
    // CLI11 takes the arguments in reverse order, without the program name.
    std::vector<std::string> args(argv.rbegin(), argv.rend());
    if (!args.empty()) args.pop_back();
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    inv.exit_code = app.exit(e, out, err) == 0 ? kAllowed : kError;
    inv.output = out.str();
    inv.error = err.str();
    inv.command = Command::kNone;
    return inv;
  }

  inv.exit_code = kAllowed;
  if (*s.convert)
    inv.command = Command::kRulesConvert;
  else if (*s.drain)
    inv.command = Command::kDrain;
  else if (*s.check)
    inv.command = Command::kCheck;
  else if (*s.status)
    inv.command = Command::kStatus;
  else if (*s.top)
    inv.command = Command::kTop;
  else if (*s.snap)
    inv.command = Command::kSnapshot;
  else if (*s.ring) {
    inv.command = Command::kRing;
    if (!inv.domain.empty()) {
      json d;
      if (std::string why = descriptors_json(inv.pairs, d); !why.empty()) return refused(inv, why);
      inv.target = json{{"domain", inv.domain}, {"descriptors", d}};
    }
  } else if (*s.ovr_list) {
    inv.command = Command::kOverrideList;
  } else if (*s.ovr || *s.plan_cmd || *s.insp) {
    inv.target = json{{"domain", inv.domain}};
    if (*s.plan_assign) {
      inv.target["domain"] = assign_args.front();
      inv.pairs.assign(assign_args.begin() + 1, assign_args.end() - 1);
      plan = assign_args.back();
    }
    json d;
    if (std::string why = descriptors_json(inv.pairs, d); !why.empty()) return refused(inv, why);
    inv.target["descriptors"] = d;
    if (*s.ovr_set) {
      if (limits.empty() && mode.empty() && plan.empty()) {
        return refused(inv, "give --limit, --mode or --plan");
      }
      inv.command = Command::kOverrideSet;
      inv.admin_path = "/v1/overrides";
      inv.target["limits"] = limits;
      if (!granularity.empty()) inv.target["granularity"] = granularity;
      if (!mode.empty()) inv.target["mode"] = mode;
      if (!plan.empty()) inv.target["plan"] = plan;
      if (!ttl.empty()) inv.target["ttl"] = ttl;
    } else if (*s.plan_assign) {
      inv.command = Command::kPlanAssign;
      inv.admin_path = "/v1/plans";
      inv.target["plan"] = plan;
      if (!ttl.empty()) inv.target["ttl"] = ttl;
    } else if (*s.ovr_get) {
      inv.command = Command::kOverrideGet;
    } else if (*s.ovr_del) {
      inv.command = Command::kOverrideDel;
    } else {
      inv.command = Command::kInspect;
    }
  }
  if (inv.command == Command::kNone) return refused(inv, "a subcommand is required");
  return inv;
}

}  // namespace sluice::ctl
