// A test case that cannot run on this machine (no IPv6 loopback, not root) says so and returns:
// CTest then reports it as skipped, not passed (every doctest binary's tests carry
// SKIP_REGULAR_EXPRESSION "SKIPPED:", set by sluice_discover_tests in tests/CMakeLists.txt).
// A tool that deploy/setup.sh installs is not a reason to skip: its absence is a failure.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <string>

namespace sluice::testing {

inline void skip_test(const std::string& why) {
  std::printf("SKIPPED: %s\n", why.c_str());
  std::fflush(stdout);
  MESSAGE("skipped: " << why);
}

}  // namespace sluice::testing
