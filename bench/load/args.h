// The command line of the load benches (sluice-bench-load, -rls, -soak, -keyspray): options read
// in order, each value checked where it is read, and the program's help on any mistake (exit 2).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace sluice::bench {

[[noreturn]] inline void usage(std::string_view program, std::string_view help,
                               const std::string& why) {
  std::fprintf(stderr, "%.*s: %s\n%.*s", static_cast<int>(program.size()), program.data(),
               why.c_str(), static_cast<int>(help.size()), help.data());
  std::exit(2);
}

class Args {
 public:
  Args(int argc, char** argv, std::string_view program, std::string_view help)
      : argc_(argc), argv_(argv), program_(program), help_(help) {}

  // Moves to the next option; false when none is left.
  bool next() {
    if (++i_ >= argc_) return false;
    option_ = argv_[i_];
    return true;
  }
  const std::string& option() const { return option_; }

  // The current option's value: the argument after it.
  std::string value() {
    if (i_ + 1 >= argc_) usage("missing value for " + option_);
    return argv_[++i_];
  }
  // The value as a number in [lo, hi].
  double number(double lo, double hi) {
    const std::string v = value();
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || !(d >= lo && d <= hi)) {
      usage(option_ + " wants a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
            "]");
    }
    return d;
  }
  uint32_t u32(double lo, double hi) { return static_cast<uint32_t>(number(lo, hi)); }

  [[noreturn]] void usage(const std::string& why) const { bench::usage(program_, help_, why); }

 private:
  int argc_;
  char** argv_;
  std::string_view program_, help_;
  int i_ = 0;
  std::string option_;
};

}  // namespace sluice::bench
