#!/usr/bin/env bash
# The README's first command, minus the setup: deploy/demo.sh must start sluiced on its embedded
# default and show the 11th check of a burst denied. Ports are picked free; bounded by timeout.
#   demo_test.sh BUILD_DIR   the build tree whose binaries run (CTest passes its own)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:?usage: demo_test.sh BUILD_DIR}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
out=$(SLUICE_DEMO_EXIT=1 SLUICE_PORT=$(free_port) SLUICE_ADMIN_PORT=$(free_port) \
  timeout 60 "$root/deploy/demo.sh" "$build" 2>&1)
echo "$out"
grep -q '^10: allowed' <<<"$out"
grep -q '^11: denied' <<<"$out"
grep -q 'api/per-key' <<<"$out"
