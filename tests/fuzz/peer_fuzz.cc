// libFuzzer target for the node-to-node datagram codec (lib/cluster/peer_codec.h): the HMAC
// check, the envelope, every payload's bounds, and the replay guard.
//
// Input: [mode][now_ms: 8 bytes little-endian][bytes...]. Mode bit 0 set: `bytes` is a message
// put under this cluster's valid tag (TEST_sign), so the fuzzer reaches the parser behind the
// tag; clear: `bytes` is the datagram as received (almost always a bad tag, the path an attacker
// without the secret has).
//
// Properties beyond "no crash, no sanitizer report":
//  - open() returns a known PeerError;
//  - a datagram open() accepted is refused when it comes again (kReplayed), never merged twice;
//  - its payload seals again (the receiver's rules are the sealer's) and a second receiver opens
//    that to the same payload sizes;
//  - a datagram without the tag is never accepted.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "cluster/peer_codec.h"
#include "fuzz_util.h"

namespace {

using namespace sluice::cluster;

constexpr const char* kSecret = "fuzz-cluster-secret-of-32-bytes!";

// Every PeerError there is: the last enumerator is named here, so a new one goes at the end.
bool known(PeerError e) {
  return static_cast<uint8_t>(e) <= static_cast<uint8_t>(PeerError::kReleaseOutsideWindow);
}

void fuzz_peer(std::span<const uint8_t> in) {
  if (in.size() < 9) return;
  const bool signed_input = (in[0] & 1) != 0;
  int64_t now_ms = 0;
  std::memcpy(&now_ms, in.data() + 1, sizeof now_ms);
  const std::span<const uint8_t> bytes = in.subspan(9);

  // A fresh receiver per input: the replay guard starts empty, as after a restart.
  PeerCodec receiver(kSecret, /*self=*/7, /*boot_id=*/1);
  static PeerMessage msg;
  std::vector<uint8_t> datagram;
  if (signed_input) {
    receiver.TEST_sign(bytes, datagram);
  } else {
    datagram.assign(bytes.begin(), bytes.end());
  }
  const PeerError e = receiver.open(datagram, now_ms, msg);
  FUZZ_REQUIRE(known(e));
  if (e != PeerError::kOk) return;
  FUZZ_REQUIRE(signed_input || bytes.size() > kPeerTagBytes);  // a tag was there to check

  // Accepted once, never twice.
  static PeerMessage again;
  FUZZ_REQUIRE(receiver.open(datagram, now_ms, again) == PeerError::kReplayed);

  // What was accepted is what a peer may send: it seals, and opens elsewhere the same.
  if (msg.header.sender == 9) return;  // the resealing codec's own id: kFromSelf by design
  PeerCodec sender(kSecret, /*self=*/9, msg.header.boot_id);
  PeerCodec other(kSecret, /*self=*/11, /*boot_id=*/1);
  std::vector<uint8_t> resealed;
  static PeerMessage reopened;
  switch (msg.header.kind) {
    case PeerKind::kMembership:
      FUZZ_REQUIRE(sender.seal(msg.membership, now_ms, resealed) == PeerError::kOk);
      FUZZ_REQUIRE(other.open(resealed, now_ms, reopened) == PeerError::kOk);
      FUZZ_REQUIRE(reopened.membership.gossip.size() == msg.membership.gossip.size());
      FUZZ_REQUIRE(reopened.membership.view_digest == msg.membership.view_digest);
      break;
    case PeerKind::kSync:
      FUZZ_REQUIRE(sender.seal(msg.sync, now_ms, resealed) == PeerError::kOk);
      FUZZ_REQUIRE(other.open(resealed, now_ms, reopened) == PeerError::kOk);
      FUZZ_REQUIRE(reopened.sync.totals.size() == msg.sync.totals.size());
      break;
    case PeerKind::kOverrides: {
      const PeerError s = sender.seal(msg.overrides, now_ms, resealed);
      // Re-encoding may be larger than what came (Cap'n Proto's shared pointers): only then may
      // it not fit.
      FUZZ_REQUIRE(s == PeerError::kOk || s == PeerError::kTooLarge);
      if (s == PeerError::kOk) {
        FUZZ_REQUIRE(other.open(resealed, now_ms, reopened) == PeerError::kOk);
        FUZZ_REQUIRE(reopened.overrides.records.size() == msg.overrides.records.size());
      }
      break;
    }
    default:
      FUZZ_REQUIRE(false);  // open() accepts only the kinds it implements
  }
}

// Seeds: one valid datagram body of each kind, signed (mode 1), at its own send time.
void write_seeds(const std::string& dir) {
  const int64_t now = 1'795'000'000'000;
  PeerCodec codec(kSecret, /*self=*/3, /*boot_id=*/now);
  int n = 0;
  auto put = [&](const std::vector<uint8_t>& datagram) {
    std::string in(1, '\x01');
    in.append(reinterpret_cast<const char*>(&now), sizeof now);
    // The message without its tag: the harness signs it again.
    in.append(reinterpret_cast<const char*>(datagram.data()), datagram.size() - kPeerTagBytes);
    sluice::fuzz::write_seed(dir, "peer-seed-" + std::to_string(n++), in);
    std::string raw(1, '\x00');
    raw.append(reinterpret_cast<const char*>(&now), sizeof now);
    raw.append(reinterpret_cast<const char*>(datagram.data()), datagram.size());
    sluice::fuzz::write_seed(dir, "peer-seed-" + std::to_string(n++), raw);
  };
  std::vector<uint8_t> d;
  MembershipMessage m;
  m.kind = MembershipKind::kPing;
  m.seq = 5;
  Member a;
  a.id = 4;
  a.name = "node-4";
  a.host = "127.0.0.1";
  a.peer_port = 7352;
  a.check_port = 7350;
  a.admin_port = 7351;
  a.incarnation = 2;
  m.gossip.push_back(a);
  if (codec.seal(m, now, d) == PeerError::kOk) put(d);
  // An anti-entropy pull: the joiner's record and its view digest.
  m.kind = MembershipKind::kJoin;
  m.view_digest = {0x0123'4567'89ab'cdefULL, 0, 0xfedc'ba98'7654'3210ULL};
  if (codec.seal(m, now, d) == PeerError::kOk) put(d);
  m.view_digest.clear();
  SyncBatch b;
  sluice::engine::RemoteTotal t;
  t.counter = 0x1234;
  t.spec = sluice::window::WindowSpec{60'000, 60'000};
  t.bucket = now / 60'000;
  t.node = 3;
  t.total = 17;
  b.totals.push_back(t);
  if (codec.seal(b, now, d) == PeerError::kOk) put(d);
  // The packed form: an owner's push of three nodes' totals of two buckets.
  for (const uint16_t node : {uint16_t{4}, uint16_t{5}}) {
    t.node = node;
    b.totals.push_back(t);
    --t.bucket;
    b.totals.push_back(t);
  }
  b.compact = true;
  if (codec.seal(b, now, d) == PeerError::kOk) put(d);
}

}  // namespace

SLUICE_FUZZ_TARGET(fuzz_peer, write_seeds)
