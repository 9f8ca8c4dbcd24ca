// sluicectl's command line, parsed into what to do, apart from doing it (sluicectl.cc), so the
// parser of operator input is tested and fuzzed alone (tests/fuzz/ctl_fuzz.cc). Never throws and
// never exits: help, usage errors and bad entries come back as text and an exit code.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sluice::ctl {

inline constexpr int kAllowed = 0;
inline constexpr int kDenied = 1;
inline constexpr int kError = 2;

enum class Command {
  kNone,  // nothing to run: `exit_code` and `output` / `error` say how the parse ended
  kCheck,
  kStatus,
  kOverrideSet,
  kOverrideGet,
  kOverrideDel,
  kOverrideList,
  kPlanAssign,
  kInspect,
  kTop,
  kSnapshot,
  kRing,
  kDrain,
  kRulesConvert,
};

struct Invocation {
  Command command = Command::kNone;
  int exit_code = kError;  // with kNone: 0 after --help, else a usage error
  std::string output;      // --help text
  std::string error;       // why the command line was refused

  bool as_json = false;
  std::string server = "127.0.0.1:7350";
  std::string admin = "127.0.0.1:7351";
  std::string token_file;

  // check
  std::string domain;
  std::vector<std::string> pairs;  // key=value as given
  int64_t hits = 1;
  bool tcp = false;
  int timeout_ms = 1000;
  int repeat = 1;

  // override set/get/del, plan assign, inspect, ring: the admin body
  // {"domain","descriptors",...}; override list: `domain` (may be empty)
  nlohmann::json target;
  std::string admin_path;  // override set: /v1/overrides; plan assign: /v1/plans

  // top
  int top_n = 20;
  bool watch = false;
  double interval_s = 2.0;
  int count = 0;
  bool cluster = false;  // --cluster: every member's counts (GET /v1/cluster/top)
  int cluster_timeout_ms = 1000;
  // snapshot
  bool full = false;
  // rules convert
  std::string convert_path;
};

// argv[0] is the program name. Everything after it is the operator's.
Invocation parse_command_line(const std::vector<std::string>& argv);

// The same, for many command lines: builds the option tree once (a fuzzer parses millions).
// Each parse answers as parse_command_line would.
class CommandLineParser {
 public:
  CommandLineParser();
  ~CommandLineParser();
  CommandLineParser(const CommandLineParser&) = delete;
  CommandLineParser& operator=(const CommandLineParser&) = delete;
  Invocation parse(const std::vector<std::string>& argv);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Splits key=value arguments into a JSON object of strings: "" or why not (an argument without
// '=' or with an empty key; none at all).
std::string descriptors_json(const std::vector<std::string>& pairs, nlohmann::json& out);

}  // namespace sluice::ctl
