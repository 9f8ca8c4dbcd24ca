#!/usr/bin/env bash
# Runs sluiced on its embedded default (one node, loopback only, the example rules of
# deploy/rules.example.yaml) and shows sluicectl checks against it: the `api` domain allows
# 10 checks per second per api_key, so the 11th and 12th are denied.
#
#   deploy/demo.sh                 leaves sluiced running in the foreground (Ctrl-C stops it)
#   deploy/demo.sh BUILD_DIR       runs the binaries of another build tree (default: build/)
#   SLUICE_DEMO_EXIT=1 deploy/demo.sh   stops it after the checks (used by the test suite)
#   SLUICE_PORT=7350 SLUICE_ADMIN_PORT=7351 (defaults) choose the ports
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$here/build}
bin="$build/daemon"
for b in sluiced sluicectl; do
  if [ ! -x "$bin/$b" ]; then
    echo "demo: $bin/$b not found: build first (deploy/setup.sh), or name the build directory" >&2
    exit 2
  fi
done
port=${SLUICE_PORT:-7350}
admin=${SLUICE_ADMIN_PORT:-7351}

"$bin/sluiced" --udp "127.0.0.1:$port" --tcp "127.0.0.1:$port" --admin "127.0.0.1:$admin" --grpc "" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT

for _ in $(seq 1 100); do  # up to 10 s
  if "$bin/sluicectl" status --admin "127.0.0.1:$admin" >/dev/null 2>&1; then break; fi
  sleep 0.1
done

echo "== 12 checks of one api_key in a row, against 10 per second"
echo "\$ sluicectl check api api_key=demo --repeat 12"
"$bin/sluicectl" check api api_key=demo --repeat 12 --server "127.0.0.1:$port" && rc=0 || rc=$?
echo "(exit $rc: 0 allowed, 1 denied, 2 error)"
echo "== node status"
"$bin/sluicectl" status --admin "127.0.0.1:$admin"

if [ "${SLUICE_DEMO_EXIT:-0}" = 1 ]; then exit 0; fi
echo "== sluiced keeps running on udp/tcp 127.0.0.1:$port, admin http://127.0.0.1:$admin (Ctrl-C stops)"
trap - EXIT
wait "$pid"
