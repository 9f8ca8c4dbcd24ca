// Unit tests of lib/base/release.h: this build's release is CMake's VERSION, releases print and
// parse, go on the wire as major and minor (0 = a sender before releases were recorded, 0.2), and
// the compatibility window is one minor release either side within a major.
#include "base/release.h"

#include <doctest/doctest.h>

#include <string>

using sluice::Release;

TEST_CASE("this build's release is the project VERSION and prints as it") {
  CHECK(sluice::to_string(sluice::kThisRelease) == std::string(sluice::kThisVersion));
  CHECK(std::string(sluice::kThisVersion) == SLUICE_VERSION_STRING);
  CHECK(sluice::parse_release(sluice::kThisVersion) == sluice::kThisRelease);
}

TEST_CASE("releases parse from major.minor.patch or major.minor and nothing else") {
  CHECK(sluice::parse_release("0.2.0") == Release{0, 2, 0});
  CHECK(sluice::parse_release("1.12.7") == Release{1, 12, 7});
  CHECK(sluice::parse_release("0.4") == Release{0, 4, 0});
  for (const char* bad : {"", "0", "0.", ".1", "0.2.", "0.2.0.1", "a.b", "0.2-rc1", "70000.1.0",
                          " 0.2.0", "0.2.0\n"}) {
    CAPTURE(bad);
    CHECK(!sluice::parse_release(bad));
  }
}

TEST_CASE("a release goes on the wire as major and minor and 0 reads as 0.2") {
  CHECK(sluice::wire_release({0, 3, 9}) == 3);
  CHECK(sluice::release_from_wire(sluice::wire_release({0, 3, 9})) == Release{0, 3, 0});
  CHECK(sluice::release_from_wire(sluice::wire_release({2, 7, 0})) == Release{2, 7, 0});
  CHECK(sluice::release_from_wire(0) == sluice::kUnrecordedRelease);
  CHECK(sluice::kUnrecordedRelease == Release{0, 2, 0});
}

TEST_CASE("the window is one minor release either side, patches ignored, majors never crossed") {
  const Release self{0, 3, 0};
  CHECK(sluice::within_window(self, {0, 2, 0}));
  CHECK(sluice::within_window(self, {0, 2, 5}));
  CHECK(sluice::within_window(self, {0, 3, 1}));
  CHECK(sluice::within_window(self, {0, 4, 0}));
  CHECK(!sluice::within_window(self, {0, 1, 0}));
  CHECK(!sluice::within_window(self, {0, 5, 0}));
  CHECK(!sluice::within_window(self, {1, 3, 0}));
  CHECK(!sluice::within_window({1, 0, 0}, {0, 9, 0}));
  CHECK(sluice::window_text(self) == "0.2 to 0.4");
  CHECK(sluice::window_text({1, 0, 0}) == "1.0 to 1.1");
}
