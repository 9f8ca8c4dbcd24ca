// Private to lib/node: the RESP door's Backend (front/resp/resp_session.h), one per worker
// thread, deciding through the node's one check path.
//
// CL.THROTTLE and DEL are cell checks (docs/protocol.md, "Cell limits") in the domain
// NodeOptions::resp_domain, keyed by one entry `key=<the Redis key>`, and, after SELECT n with
// n != 0, `db=<n>` before it: database 0's keys are exactly what redis-cell keys, and each other
// database has keys of its own. The node adds that domain, without rules, when the rules file does
// not name it (a rules file may name it to give it an allowlist-free home of its own; cell checks
// ignore its rules). SLUICE.CHECK, SLUICE.ACQUIRE and SLUICE.RELEASE are ordinary checks of the
// rules, answered from the limit the RateLimit headers would describe (wire/ratelimit_headers.h).
//
// A node on its own decides on the connection's thread (Node::decide_here); a cluster node takes
// the routed path (Node::check_async) and the answer, made on whichever worker got it, is posted
// back to this backend's io_context before its Answer is filled.
#pragma once

#include <memory>
#include <string>

#include "front/resp/resp_session.h"

namespace boost::asio {
class io_context;
}

namespace sluice::node {

class Node;

// `io`: the thread whose connections this backend serves. `node` outlives the backend.
std::shared_ptr<front::resp::Backend> make_resp_backend(Node& node, boost::asio::io_context& io,
                                                        std::string domain);

}  // namespace sluice::node
