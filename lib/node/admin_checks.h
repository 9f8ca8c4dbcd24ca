// Private to lib/node: the checks of the admin port (docs/http.md): POST /v1/check, GET /v1/auth
// (nginx auth_request) and POST /v1/release, as rows of the admin front's route table.
//
// They run on the connection's thread (a worker's). A node on its own decides there
// (Node::check_here: no thread hand-off); a cluster node takes the routed path (Node::check_async:
// a worker, the keys' owners in owner mode) and the answer goes back through the front's Later.
// The common /v1/check body is read and every answer written without a JSON library, into
// buffers each thread reuses: a check allocates nothing once warm.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "front/admin/admin_front.h"

namespace sluice::node {

class Node;

struct HttpCheckCounters {
  std::atomic<uint64_t> decided{0};  // /v1/check, /v1/auth and /v1/release requests decided
  std::atomic<uint64_t> next_id{0};  // ids of the check requests they become
};

// Appends the three rows. `node` and `counters` outlive the routes.
void add_check_routes(std::vector<front::admin::Route>& routes, Node& node,
                      HttpCheckCounters& counters);

}  // namespace sluice::node
