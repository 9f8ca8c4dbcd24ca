#!/usr/bin/env bash
# Runs one stock Redis client's test against real sluiced processes: sluiced's RESP door called by
# redis-py (Debian's python3-redis), hiredis (a C program), redis-rb (ruby-redis), Node's ioredis 5
# and 6 and node-redis 4 and 6 (npm), or redis-benchmark and redis-cli -3 (redis-tools).
#
#   tests/interop/resp/run.sh {python|hiredis|ruby|node|benchmark} [SLUICED_BINARY [SOURCE_DIR [HIREDIS_TEST]]]
#
# SLUICED_BINARY defaults to $SLUICED_BIN, else SOURCE_DIR/build/daemon/sluiced; SOURCE_DIR to this
# checkout; HIREDIS_TEST (the built hiredis_test program) is needed by `hiredis` only.
#
# The script starts two sluiced, each with a RESP door and an admin port on free loopback ports (no
# UDP, TCP or gRPC listener, no data directory) and the rules below: one open, one with
# resp_password_file. The client test reads SLUICE_RESP_PORT, SLUICE_RESP_AUTH_PORT and
# SLUICE_RESP_PASSWORD. After it passes, both doors' /metrics must show no unknown command: every
# command a client sent, on connect too, was one the door speaks. A missing tool is a failure with
# its reason (deploy/setup.sh installs them all), never a skip.
set -euo pipefail

usage="usage: tests/interop/resp/run.sh {python|hiredis|ruby|node|benchmark} [SLUICED_BINARY [SOURCE_DIR [HIREDIS_TEST]]]"
kind=${1:?$usage}
src=${3:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)}
sluiced=${2:-${SLUICED_BIN:-$src/build/daemon/sluiced}}
hiredis_test=${4:-}
[ -x "$sluiced" ] || { echo "FAIL: sluiced not found at $sluiced (build it first)"; exit 1; }
sluiced=$(cd "$(dirname "$sluiced")" && pwd)/$(basename "$sluiced")
here=$src/tests/interop/resp
py=/usr/bin/python3  # Debian's: the one that sees python3-redis and python3-pytest
[ -x "$py" ] || { echo "FAIL: $py not found (deploy/setup.sh installs python3)"; exit 1; }

# Whatever ends this script stops both sluiced (their pids, one a line, in the pidfile).
source "$src/tests/support/sluiced_guard.sh"
guard_start resp SLUICE_INTEROP_PIDFILE
dir=$TMPDIR

# 3 checks a minute per user in domain `api`, with 1-second buckets so the minute is exact over a
# test that lasts seconds (docs/rules.md, "Estimators").
cat >"$dir/rules.yaml" <<'EOF'
domains:
  - name: api
    rules:
      - name: per-user
        key: [user]
        limits: [{limit: 3, window: 1m, name: per-user, granularity: 1s}]
EOF
password=interop-s3cret
printf '%s\n' "$password" >"$dir/resp-password"
printf 'resp_password_file: %s\n' "$dir/resp-password" >"$dir/auth.yaml"

# Four free loopback ports, all different, below the ephemeral range.
read -r port auth_port admin_port auth_admin_port < <("$py" "$src/tests/support/free_port.py" 4)

# NAME PORT ADMIN_PORT [--config FILE]: starts sluiced in the background, appends its pid.
start_sluiced() {
  "$sluiced" "${@:4}" --udp '' --tcp '' --admin "127.0.0.1:$3" --grpc '' --resp "127.0.0.1:$2" \
    --data-dir '' --rules "$dir/rules.yaml" --threads 1 --log-level warn \
    >"$dir/$1.log" 2>&1 &
  echo $! >>"$SLUICE_INTEROP_PIDFILE"
}

dump_logs() {
  for name in open auth; do
    echo "--- sluiced ($name) output"
    cat "$dir/$name.log" 2>/dev/null || true
  done
}

# Up to 100 tries, 100 ms apart: the port accepts a connection.
wait_listening() {  # NAME PORT LINE (of its pid in the pidfile)
  local pid
  pid=$(sed -n "$3p" "$SLUICE_INTEROP_PIDFILE")
  for _ in $(seq 100); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "FAIL: sluiced ($1) exited before listening"
      dump_logs
      exit 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "FAIL: sluiced ($1) is not listening on 127.0.0.1:$2 after 10 s"
  dump_logs
  exit 1
}

start_sluiced open "$port" "$admin_port"
start_sluiced auth "$auth_port" "$auth_admin_port" --config "$dir/auth.yaml"
wait_listening open "$port" 1
wait_listening auth "$auth_port" 2
export SLUICE_RESP_PORT=$port SLUICE_RESP_AUTH_PORT=$auth_port SLUICE_RESP_PASSWORD=$password

# sluice_resp_unknown_commands_total from a node's /metrics (HTTP/1.0 over bash's /dev/tcp,
# bounded by timeout).
unknown_commands() {  # ADMIN_PORT
  timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"; printf "GET /metrics HTTP/1.0\r\n\r\n" >&3; cat <&3' _ "$1" |
    sed -n 's/^sluice_resp_unknown_commands_total \([0-9]*\).*/\1/p'
}

# Runs the client's test, then checks both doors' metrics; on a failure prints sluiced's output.
run_client() {
  local status=0 name admin n
  guard_run "$@" || status=$?
  if [ "$status" -ne 0 ]; then
    dump_logs
    exit "$status"
  fi
  for name in open auth; do
    admin=$admin_port
    [ "$name" = auth ] && admin=$auth_admin_port
    n=$(unknown_commands "$admin")
    if [ "$n" != 0 ]; then
      echo "FAIL: sluiced ($name) answered ${n:-(no metrics)} command(s) with unknown command"
      dump_logs
      exit 1
    fi
  done
  echo "ok: no unknown command reached either door"
}

case "$kind" in
  python)
    "$py" -c 'import redis' 2>/dev/null ||
      { echo "FAIL: $py cannot import redis (deploy/setup.sh installs python3-redis)"; exit 1; }
    "$py" -c 'import pytest' 2>/dev/null ||
      { echo "FAIL: $py cannot import pytest (deploy/setup.sh installs python3-pytest)"; exit 1; }
    cd "$here"
    # No cache or bytecode written into the source tree.
    run_client env PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -v -p no:cacheprovider test_redis_py.py
    ;;
  hiredis)
    if [ -z "$hiredis_test" ] || [ ! -x "$hiredis_test" ]; then
      echo "FAIL: the hiredis_test program was not given or not built (CMake builds it when" \
        "libhiredis-dev is installed; deploy/setup.sh installs it)"
      exit 1
    fi
    run_client "$hiredis_test"
    ;;
  ruby)
    command -v ruby >/dev/null || { echo "FAIL: ruby not found (deploy/setup.sh installs ruby-redis)"; exit 1; }
    ruby -e 'require "redis"' 2>/dev/null ||
      { echo "FAIL: ruby cannot require redis (deploy/setup.sh installs ruby-redis)"; exit 1; }
    run_client ruby "$here/redis_rb_test.rb"
    ;;
  node)
    command -v node >/dev/null || { echo "FAIL: node not found (deploy/setup.sh installs nodejs)"; exit 1; }
    command -v npm >/dev/null || { echo "FAIL: npm not found (deploy/setup.sh installs it)"; exit 1; }
    "$src/deploy/npm-ci.sh" "$here/node"
    cd "$here/node"
    run_client node --test-reporter=spec resp_clients.test.mjs
    ;;
  benchmark)
    run_client bash "$here/benchmark_test.sh"
    ;;
  *)
    echo "$usage"
    exit 2
    ;;
esac
