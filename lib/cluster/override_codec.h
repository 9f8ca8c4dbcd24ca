// Private to lib/cluster: the OverrideSync payload of a peer datagram (schema/peer.capnp) to and
// from OverrideSyncMessage. peer_codec.cc frames it in the authenticated envelope; see
// peer_codec.h for how hostile bytes are handled (every getter here may throw kj::Exception, and
// the caller catches it).
#pragma once

#include <cstddef>

#include "cluster/override_table.h"
#include "cluster/peer_codec.h"
#include "peer.capnp.h"

namespace sluice::cluster::detail {

// Words of the payload (the OverrideSync struct and everything below it), as the builder lays
// them out in one segment.
size_t override_sync_words(const OverrideSyncMessage& m);
// The receiver's structural rules (counts, string sizes, enums), so a sender refuses what the
// peers would drop. Semantic checks (check_record) are the node's, counted per record.
PeerError check_override_sync(const OverrideSyncMessage& m, const PeerLimits& limits);
void write_override_sync(schema::peer::OverrideSync::Builder out, const OverrideSyncMessage& m);
PeerError read_override_sync(schema::peer::OverrideSync::Reader in, uint16_t from,
                             const PeerLimits& limits, OverrideSyncMessage& out);

}  // namespace sluice::cluster::detail
