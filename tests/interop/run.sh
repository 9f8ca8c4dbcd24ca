#!/usr/bin/env bash
# Runs one of the RLS interop tests against a real sluiced: sluiced's gRPC front (Envoy's
# RateLimitService v3 and grpc.health.v1.Health) called by Node's @grpc/grpc-js or Python's grpcio.
#
#   tests/interop/run.sh node   [SLUICED_BINARY [SOURCE_DIR]]
#   tests/interop/run.sh python [SLUICED_BINARY [SOURCE_DIR]]
#
# SLUICED_BINARY defaults to $SLUICED_BIN, else SOURCE_DIR/build/daemon/sluiced; SOURCE_DIR to this
# checkout. `node` runs `npm ci` in tests/interop/node first (deploy/npm-ci.sh), only when
# node_modules is missing or package-lock.json changed since the last install, so a prepared tree
# runs offline. A missing tool is a failure with its reason (deploy/setup.sh installs them all),
# never a skip.
set -euo pipefail

usage="usage: tests/interop/run.sh {node|python} [SLUICED_BINARY [SOURCE_DIR]]"
kind=${1:?$usage}
src=${3:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
sluiced=${2:-${SLUICED_BIN:-$src/build/daemon/sluiced}}
[ -x "$sluiced" ] || { echo "FAIL: sluiced not found at $sluiced (build it first)"; exit 1; }
sluiced=$(cd "$(dirname "$sluiced")" && pwd)/$(basename "$sluiced")
export SLUICED_BIN=$sluiced SLUICE_SOURCE_DIR=$src

# The test writes sluiced's pid to $SLUICE_INTEROP_PIDFILE; whatever ends this script stops it.
source "$src/tests/support/sluiced_guard.sh"
guard_start interop SLUICE_INTEROP_PIDFILE

case "$kind" in
  node)
    command -v node >/dev/null || { echo "FAIL: node not found (deploy/setup.sh installs nodejs)"; exit 1; }
    command -v npm >/dev/null || { echo "FAIL: npm not found (deploy/setup.sh installs it)"; exit 1; }
    dir=$src/tests/interop/node
    "$src/deploy/npm-ci.sh" "$dir"
    cd "$dir"
    # The file runs in this one node process (not under `node --test`, which would put it in a
    # child of its own).
    guard_run node --test-reporter=spec rls_interop.test.mjs
    ;;
  python)
    py=/usr/bin/python3  # Debian's: the one that sees python3-grpcio and python3-pytest
    [ -x "$py" ] || { echo "FAIL: $py not found (deploy/setup.sh installs python3)"; exit 1; }
    "$py" -c 'import grpc, google.protobuf' 2>/dev/null ||
      { echo "FAIL: $py cannot import grpc (deploy/setup.sh installs python3-grpcio)"; exit 1; }
    "$py" -c 'import pytest' 2>/dev/null ||
      { echo "FAIL: $py cannot import pytest (deploy/setup.sh installs python3-pytest)"; exit 1; }
    command -v protoc >/dev/null || { echo "FAIL: protoc not found (deploy/setup.sh installs protobuf-compiler)"; exit 1; }
    command -v nghttp >/dev/null || { echo "FAIL: nghttp not found (deploy/setup.sh installs nghttp2-client)"; exit 1; }
    cd "$src/tests/interop/python"
    # No cache or bytecode written into the source tree.
    guard_run env PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -v -p no:cacheprovider test_rls_interop.py
    ;;
  *)
    echo "$usage"
    exit 2
    ;;
esac
