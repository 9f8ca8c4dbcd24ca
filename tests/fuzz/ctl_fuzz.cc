// libFuzzer target for sluicectl's command line (daemon/sluicectl_args.h): what an operator, or
// a script built on sluicectl, types.
//
// Input: the arguments after the program name, separated by NUL bytes (at most 64).
//
// Properties beyond "no crash, no sanitizer report, no exception":
//  - a parser reused across inputs answers as a fresh one (checked on every 16th input);
//  - a refused command line runs nothing and exits 2 (0 only for --help);
//  - an accepted one holds what its command needs: a domain and at least one key=value entry for
//    the commands that name a key, a limit, mode or plan for `override set`, options in range.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "sluicectl_args.h"

namespace {

using namespace sluice::ctl;

void require_target(const Invocation& inv) {
  FUZZ_REQUIRE(inv.target.is_object());
  FUZZ_REQUIRE(inv.target["domain"].is_string());
  const auto& d = inv.target["descriptors"];
  FUZZ_REQUIRE(d.is_object() && !d.empty());
  for (const auto& [k, v] : d.items()) {
    FUZZ_REQUIRE(!k.empty());
    FUZZ_REQUIRE(v.is_string());
  }
}

void fuzz_ctl(std::span<const uint8_t> in) {
  std::vector<std::string> argv{"sluicectl"};
  std::string arg;
  for (const uint8_t b : in) {
    if (b == 0) {
      argv.push_back(arg);
      arg.clear();
      if (argv.size() > 64) return;
    } else {
      arg.push_back(static_cast<char>(b));
    }
  }
  argv.push_back(arg);
  // One parser for every input (building CLI11's option tree costs more than a parse); every
  // 16th input is also parsed fresh, and the two must agree.
  static CommandLineParser parser;
  const Invocation inv = parser.parse(argv);
  if (in.size() % 16 == 0) {
    const Invocation fresh = parse_command_line(argv);
    FUZZ_REQUIRE(fresh.command == inv.command && fresh.exit_code == inv.exit_code);
    FUZZ_REQUIRE(fresh.error == inv.error && fresh.target == inv.target);
  }
  switch (inv.command) {
    case Command::kNone:
      FUZZ_REQUIRE(inv.exit_code == kError || (inv.exit_code == kAllowed && !inv.output.empty()));
      break;
    case Command::kCheck:
      FUZZ_REQUIRE(inv.repeat >= 1 && inv.repeat <= 100'000);
      FUZZ_REQUIRE(inv.timeout_ms >= 1 && inv.timeout_ms <= 60'000);
      break;
    case Command::kOverrideSet:
      require_target(inv);
      FUZZ_REQUIRE(!inv.target["limits"].empty() || inv.target.contains("mode") ||
                   inv.target.contains("plan"));
      FUZZ_REQUIRE(inv.admin_path == "/v1/overrides");
      break;
    case Command::kPlanAssign:
      require_target(inv);
      FUZZ_REQUIRE(inv.target["plan"].is_string());
      FUZZ_REQUIRE(inv.admin_path == "/v1/plans");
      break;
    case Command::kOverrideGet:
    case Command::kOverrideDel:
    case Command::kInspect:
      require_target(inv);
      break;
    case Command::kRing:
      if (!inv.target.is_null()) require_target(inv);
      break;
    case Command::kTop:
      FUZZ_REQUIRE(inv.top_n >= 1 && inv.top_n <= 512);
      FUZZ_REQUIRE(inv.interval_s >= 0.1 && inv.interval_s <= 3600.0);
      break;
    default:
      break;
  }
}

void write_seeds(const std::string& dir) {
  const auto seed = [&](const std::string& name, const std::vector<std::string>& args) {
    std::string bytes;
    for (size_t i = 0; i < args.size(); ++i) {
      if (i > 0) bytes.push_back('\0');
      bytes += args[i];
    }
    sluice::fuzz::write_seed(dir, name, bytes);
  };
  seed("check", {"check", "api", "api_key=k1", "path=/a", "--hits", "3", "--tcp", "--repeat", "2",
                 "--timeout-ms", "50", "--json"});
  seed("override-set", {"override", "set", "oauth", "client_id=shop-17", "--limit", "2000/1m",
                        "--limit", "50/1s", "--ttl", "24h", "--granularity", "1s", "--mode",
                        "enforce", "--admin", "127.0.0.1:7351", "--token-file", "/x"});
  seed("override-del", {"override", "delete", "oauth", "client_id=shop-17"});
  seed("override-list", {"--json", "override", "list", "oauth"});
  seed("plan-assign", {"plan", "assign", "dns", "user=7", "tier=a", "pro", "--ttl", "30d"});
  seed("inspect", {"inspect", "api", "user=42"});
  seed("top", {"top", "-n", "5", "--watch", "--interval", "0.5", "--count", "3"});
  seed("ring", {"ring", "api", "user=1"});
  seed("help", {"override", "set", "--help"});
  seed("convert", {"rules", "convert", "/etc/ratelimit/config"});
}

}  // namespace

SLUICE_FUZZ_TARGET(fuzz_ctl, write_seeds)
