// Names of membership.h's enums, for logs, /metrics labels and /v1/cluster.
#include "cluster/membership.h"

namespace sluice::cluster {

std::string_view to_string(MemberState state) {
  switch (state) {
    case MemberState::kAlive:
      return "alive";
    case MemberState::kSuspect:
      return "suspect";
    case MemberState::kDead:
      return "dead";
    case MemberState::kLeft:
      return "left";
  }
  return "unknown";
}

std::string_view to_string(JoinState state) {
  switch (state) {
    case JoinState::kNotStarted:
      return "not_started";
    case JoinState::kJoining:
      return "joining";
    case JoinState::kJoined:
      return "joined";
    case JoinState::kNoSeedAnswered:
      return "no_seed_answered";
  }
  return "unknown";
}

std::string_view to_string(IgnoredReason reason) {
  switch (reason) {
    case IgnoredReason::kFromSelf:
      return "from_self";
    case IgnoredReason::kUnknownSender:
      return "unknown_sender";
    case IgnoredReason::kUnknownSeq:
      return "unknown_seq";
    case IgnoredReason::kIdentityConflict:
      return "identity_conflict";
    case IgnoredReason::kMalformed:
      return "malformed";
    case IgnoredReason::kUnexpectedJoinReply:
      return "unexpected_join_reply";
    case IgnoredReason::kCount:
      break;
  }
  return "unknown";
}

}  // namespace sluice::cluster
