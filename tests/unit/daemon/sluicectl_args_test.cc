// sluicectl's command line (daemon/sluicectl_args.h): what each command becomes, and how a bad
// command line is refused (exit 2, a message, nothing run).
#include "sluicectl_args.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/release.h"

using namespace sluice::ctl;

namespace {
Invocation parse(std::vector<std::string> args) {
  args.insert(args.begin(), "sluicectl");
  return parse_command_line(args);
}
}  // namespace

TEST_CASE("override set becomes the admin body, with every option") {
  const Invocation inv = parse({"override", "set", "oauth", "client_id=shop-17", "user=a=b",
                                "--limit", "2000/1m", "--limit", "50/1s", "--ttl", "24h", "--mode",
                                "dry-run", "--admin", "10.0.0.1:7351", "--json"});
  REQUIRE(inv.command == Command::kOverrideSet);
  CHECK(inv.admin == "10.0.0.1:7351");
  CHECK(inv.as_json);
  CHECK(inv.admin_path == "/v1/overrides");
  CHECK(inv.target["domain"] == "oauth");
  CHECK(inv.target["descriptors"]["client_id"] == "shop-17");
  CHECK(inv.target["descriptors"]["user"] == "a=b");  // split at the first '='
  CHECK(inv.target["limits"] == nlohmann::json::array({"2000/1m", "50/1s"}));
  CHECK(inv.target["ttl"] == "24h");
  CHECK(inv.target["mode"] == "dry-run");
  CHECK_FALSE(inv.target.contains("plan"));
}

TEST_CASE("plan assign takes DOMAIN entries... PLAN") {
  const Invocation inv =
      parse({"plan", "assign", "dns", "user=7", "zone=eu", "pro", "--ttl", "30d"});
  REQUIRE(inv.command == Command::kPlanAssign);
  CHECK(inv.admin_path == "/v1/plans");
  CHECK(inv.target["domain"] == "dns");
  CHECK(inv.target["descriptors"].size() == 2);
  CHECK(inv.target["plan"] == "pro");
  CHECK(inv.target["ttl"] == "30d");
}

TEST_CASE("ring without a domain asks for the shares, with one, for a request's owners") {
  CHECK(parse({"ring"}).target.is_null());
  const Invocation inv = parse({"ring", "api", "user=1"});
  REQUIRE(inv.command == Command::kRing);
  CHECK(inv.target["descriptors"]["user"] == "1");
}

TEST_CASE("a refused command line runs nothing, exits 2 and says why") {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {},
           {"nope"},
           {"override", "set", "api", "foo", "--limit", "5/1m"},  // not key=value
           {"override", "set", "api", "=v", "--limit", "5/1m"},   // empty key
           {"override", "set", "api", "k=v"},                     // nothing to set
           {"plan", "assign", "dns", "pro"},                      // no entry
           {"inspect", "api"},
           {"ring", "api"},  // a domain but no entry
           {"top", "-n", "0"},
           {"check", "api", "--repeat", "0"},
           {"check", "api", "--hits", "x"}}) {
    CAPTURE(args);
    const Invocation inv = parse(args);
    CHECK(inv.command == Command::kNone);
    CHECK(inv.exit_code == kError);
    CHECK_FALSE(inv.error.empty());
  }
}

TEST_CASE("--help prints and exits 0") {
  const Invocation inv = parse({"override", "set", "--help"});
  CHECK(inv.command == Command::kNone);
  CHECK(inv.exit_code == kAllowed);
  CHECK(inv.output.find("--limit") != std::string::npos);
}

TEST_CASE("--version prints the release and exits 0, with or without a command") {
  for (const auto& args :
       {std::vector<std::string>{"--version"}, std::vector<std::string>{"--version", "status"}}) {
    const Invocation inv = parse(args);
    CHECK(inv.command == Command::kNone);
    CHECK(inv.exit_code == kAllowed);
    CHECK(inv.output == "sluicectl " + std::string(sluice::kThisVersion) + "\n");
  }
}

TEST_CASE("a reused parser answers every command line as a fresh one would") {
  const std::vector<std::vector<std::string>> lines = {
      {"override", "set", "oauth", "client_id=a", "--limit", "5/1m", "--ttl", "1h", "--json"},
      {"override", "set", "oauth", "client_id=a", "--mode", "shadow"},  // no leftover limit, ttl
      {"check", "api", "k=v", "--hits", "4", "--tcp"},
      {"check", "api", "k=v"},  // hits back to 1, UDP
      {"top", "-n", "3", "--watch"},
      {"top"},
      {"plan", "assign", "dns", "user=7", "pro"},
      {"nope"},
      {"ring"},
      {"override", "set", "--help"},
      {"status", "--admin", "10.1.1.1:1"},
      {"status"}};
  CommandLineParser reused;
  for (int round = 0; round < 2; ++round) {
    for (const auto& line : lines) {
      CAPTURE(line);
      std::vector<std::string> argv = line;
      argv.insert(argv.begin(), "sluicectl");
      const Invocation a = reused.parse(argv);
      const Invocation b = parse_command_line(argv);
      CHECK(a.command == b.command);
      CHECK(a.exit_code == b.exit_code);
      CHECK(a.error == b.error);
      CHECK(a.output == b.output);
      CHECK(a.target == b.target);
      CHECK(a.as_json == b.as_json);
      CHECK(a.admin == b.admin);
      CHECK(a.hits == b.hits);
      CHECK(a.tcp == b.tcp);
      CHECK(a.top_n == b.top_n);
      CHECK(a.watch == b.watch);
      CHECK(a.pairs == b.pairs);
    }
  }
}

TEST_CASE("top --cluster asks for the cluster view, and top alone keeps its keys and flags") {
  const Invocation plain = parse({"top", "-n", "5", "--watch", "--count", "2"});
  REQUIRE(plain.command == Command::kTop);
  CHECK_FALSE(plain.cluster);
  CHECK(plain.top_n == 5);
  CHECK(plain.watch);
  CHECK(plain.count == 2);
  const Invocation cluster =
      parse({"top", "--cluster", "--member-timeout-ms", "300", "--json", "--admin", "h:1"});
  REQUIRE(cluster.command == Command::kTop);
  CHECK(cluster.cluster);
  CHECK(cluster.cluster_timeout_ms == 300);
  CHECK(cluster.as_json);
  CHECK(cluster.admin == "h:1");
  CHECK(parse({"top", "--cluster"}).cluster_timeout_ms == 1000);
  const Invocation bad = parse({"top", "--cluster", "--member-timeout-ms", "0"});
  CHECK(bad.command == Command::kNone);
  CHECK(bad.exit_code == kError);
}
