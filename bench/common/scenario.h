// The command line every scenario of sluice-bench shares, on CLI11.
//
// A scenario makes one Cli with its program name (sluice-bench-<scenario>, what its messages and
// --help name), declares its own options beside the shared --json and calls parse(): nullopt to
// run, or the exit status to leave with (0 after --help; 2 on a mistake, with the message and the
// help on stderr). Numbers are read as a double (so 1e6 is a key count) checked against [lo, hi],
// then converted to the option's type; an option given twice takes the last value. Options many
// scenarios have are named alike everywhere: seconds(), keys(), server_threads(), sluiced().
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/json_rows.h"

namespace sluice::bench {

class Cli {
 public:
  explicit Cli(std::string program, std::string description = "")
      : program_(std::move(program)), app_(description, program_) {
    app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app_.add_flag("--json", json, "last line of stdout: {\"rows\":[...]}");
    app_.set_help_flag("-h,--help", "print this help and exit");
  }

  CLI::App& app() { return app_; }

  // A number in [lo, hi], read as a double and converted to T.
  template <class T>
  CLI::Option* number(const std::string& name, T& target, double lo, double hi,
                      const std::string& help) {
    CLI::Option* opt = app_.add_option_function<double>(
        name, [&target](double v) { target = static_cast<T>(v); }, help);
    return opt->check(CLI::Range(lo, hi))
        ->type_name("N")
        ->default_str(CLI::detail::to_string(target));
  }
  // A comma list of whole numbers in [lo, hi] ("1000,100000"), repeatable: the lists add up.
  CLI::Option* numbers(const std::string& name, std::vector<uint64_t>& target, double lo, double hi,
                       const std::string& help) {
    return list(name, target, help)->check(CLI::Range(lo, hi));
  }
  // A comma list of words of a fixed set ("1s,1m"), repeatable: the lists add up.
  CLI::Option* words(const std::string& name, std::vector<std::string>& target,
                     std::vector<std::string> allowed, const std::string& help) {
    return list(name, target, help)->check(CLI::IsMember(std::move(allowed)));
  }
  CLI::Option* text(const std::string& name, std::string& target, const std::string& help) {
    return app_.add_option(name, target, help)->type_name("TEXT");
  }
  CLI::Option* flag(const std::string& name, bool& target, const std::string& help) {
    return app_.add_flag(name, target, help);
  }
  // A value of a fixed set of words.
  CLI::Option* word(const std::string& name, std::string& target, std::vector<std::string> words,
                    const std::string& help) {
    return text(name, target, help)->check(CLI::IsMember(std::move(words)));
  }

  template <class T>
  CLI::Option* seconds(T& target, double lo, double hi, const std::string& help) {
    return number("--seconds", target, lo, hi, help);
  }
  template <class T>
  CLI::Option* keys(T& target, double lo, double hi, const std::string& help) {
    return number("--keys", target, lo, hi, help);
  }
  template <class T>
  CLI::Option* server_threads(T& target, double hi = 64) {
    return number("--server-threads", target, 1, hi, "sluiced --threads");
  }
  CLI::Option* sluiced(std::string& target) {
    return text("--sluiced", target, "sluiced binary (default: the one built with this program)");
  }
  CLI::Option* quick(bool& target, const std::string& help = "a short run") {
    return flag("--quick", target, help);
  }

  std::optional<int> parse(int argc, char** argv) {
    try {
      app_.parse(argc, argv);
      return std::nullopt;
    } catch (const CLI::CallForHelp&) {
      std::fputs(app_.help().c_str(), stdout);
      return 0;
    } catch (const CLI::ParseError& e) {
      return fail(e.what());
    }
  }

  // A mistake found after parsing (options that do not fit together): the message and the help
  // on stderr; returns the exit status, 2.
  int fail(const std::string& why) const {
    std::fprintf(stderr, "%s: %s\n%s", program_.c_str(), why.c_str(), app_.help().c_str());
    return 2;
  }

  // Prints the --json line of rows when --json was given.
  void finish(const nlohmann::json& rows) const {
    if (json) print_json_rows(rows);
  }

  // The output of a scenario that measures one row: its text line, then the --json line.
  void one_row(Row row) const {
    Rows rows(json);
    rows.add(std::move(row));
    rows.finish();
  }

  bool json = false;

 private:
  template <class T>
  CLI::Option* list(const std::string& name, std::vector<T>& target, const std::string& help) {
    return app_.add_option(name, target, help)
        ->delimiter(',')
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  }

  std::string program_;
  CLI::App app_;
};

}  // namespace sluice::bench
