// Releases and the compatibility window (docs/operations.md, "Rolling upgrade").
//
// A release is the project's VERSION (CMakeLists.txt, major.minor.patch; CHANGELOG.md names each
// release's commit). Peer datagrams (schema/peer.capnp, Envelope.release) and data directories
// (lib/store/store.h, the "sluice.release" key) say which release wrote them, and a node accepts
// what a release within one minor release of its own wrote, either side, of the same major:
// 0.3 talks to and restores from 0.2, 0.3 and 0.4. The previous minor release is what a rolling
// upgrade needs (new nodes next to old ones, new nodes on old data directories); the next one is
// what a rollback needs (the old release back on a directory, next to nodes, the new one wrote).
// A release that breaks this (a peer wire or a store format older nodes cannot read) must say so
// in CHANGELOG.md and change the data format or the envelope version instead.
//
// Patch releases never change either format: the window ignores them, and the wire carries major
// and minor only.
//
// Releases before 0.3 wrote no release anywhere: an envelope without one, or a data directory
// without the key, is 0.2 (kUnrecordedRelease), the only such release that can be in a window
// today (0.1 and 0.2 share every format; 0.1 was never deployed).
//
// Header-only, no dependencies: every part may use it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/version.h"

namespace sluice {

struct Release {
  uint16_t major = 0;
  uint16_t minor = 0;
  uint16_t patch = 0;

  friend bool operator==(const Release&, const Release&) = default;
};

// This build's release.
inline constexpr Release kThisRelease{SLUICE_VERSION_MAJOR, SLUICE_VERSION_MINOR,
                                      SLUICE_VERSION_PATCH};
inline constexpr std::string_view kThisVersion = SLUICE_VERSION_STRING;

// What a peer or a data directory that recorded no release is.
inline constexpr Release kUnrecordedRelease{0, 2, 0};

// "0.3.0"; a release off the wire (no patch) prints as "0.3".
inline std::string to_string(const Release& r, bool with_patch = true) {
  std::string s = std::to_string(r.major) + "." + std::to_string(r.minor);
  if (with_patch) s += "." + std::to_string(r.patch);
  return s;
}

// "major.minor.patch" or "major.minor" (each at most 65535), else nullopt.
inline std::optional<Release> parse_release(std::string_view text) {
  Release r;
  uint16_t* part[] = {&r.major, &r.minor, &r.patch};
  size_t n = 0;
  while (n < 3) {
    size_t i = 0;
    uint32_t v = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9' && i < 5) {
      v = v * 10 + static_cast<uint32_t>(text[i] - '0');
      ++i;
    }
    if (i == 0 || v > 0xffff) return std::nullopt;
    *part[n++] = static_cast<uint16_t>(v);
    text.remove_prefix(i);
    if (text.empty()) break;
    if (text.front() != '.') return std::nullopt;
    text.remove_prefix(1);
  }
  if (!text.empty() || n < 2) return std::nullopt;
  return r;
}

// The wire's form (schema/peer.capnp, Envelope.release): major x 256 + minor, majors and minors up
// to 255; 0 = not recorded (kUnrecordedRelease).
inline constexpr uint16_t wire_release(const Release& r) {
  return static_cast<uint16_t>(((r.major & 0xff) << 8) | (r.minor & 0xff));
}
inline constexpr Release release_from_wire(uint16_t w) {
  if (w == 0) return kUnrecordedRelease;
  return Release{static_cast<uint16_t>(w >> 8), static_cast<uint16_t>(w & 0xff), 0};
}

// True when what release `other` wrote is for `self` to read: the same major, minors at most one
// apart.
inline constexpr bool within_window(const Release& self, const Release& other) {
  if (self.major != other.major) return false;
  const int d = static_cast<int>(self.minor) - static_cast<int>(other.minor);
  return d >= -1 && d <= 1;
}

// "0.2 to 0.4": the releases `self` accepts, for messages.
inline std::string window_text(const Release& self) {
  const Release lo{self.major, static_cast<uint16_t>(self.minor == 0 ? 0 : self.minor - 1), 0};
  const Release hi{self.major, static_cast<uint16_t>(self.minor + 1), 0};
  return to_string(lo, false) + " to " + to_string(hi, false);
}

}  // namespace sluice
