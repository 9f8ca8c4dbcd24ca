#!/usr/bin/env bash
# The RESP door of a real sluiced driven by Debian's redis-tools: short bounded redis-benchmark runs
# of pipelined CL.THROTTLE (RESP2 and -3) that must finish every request with no error, the
# counts those requests left behind, and redis-cli -3 (HELLO 3) for CL.THROTTLE, SLUICE.CHECK's
# map, DEL and AUTH. tests/interop/resp/run.sh starts sluiced and sets SLUICE_RESP_PORT,
# SLUICE_RESP_AUTH_PORT and SLUICE_RESP_PASSWORD; every command runs under `timeout`.
set -euo pipefail

port=${SLUICE_RESP_PORT:?run by tests/interop/resp/run.sh benchmark}
auth_port=${SLUICE_RESP_AUTH_PORT:?}
password=${SLUICE_RESP_PASSWORD:?}
for tool in redis-benchmark redis-cli; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not found (deploy/setup.sh installs redis-tools)"; exit 1; }
done

failures=0
expect() {  # NAME WANT GOT
  if [ "$2" = "$3" ]; then
    echo "ok: $1"
  else
    echo "FAIL: $1"
    echo "  want: $(printf '%q' "$2")"
    echo "  got:  $(printf '%q' "$3")"
    failures=$((failures + 1))
  fi
}
cli() { timeout 10 redis-cli -h 127.0.0.1 "$@" 2>&1; }

# redis-benchmark: 2,000 pipelined requests (16 in flight on each of 4 connections) on one key.
# It prints "Error from server: ..." for an error reply; it exits 0 either way, so its output is
# read too.
bench() {  # NAME KEY [EXTRA ARGS...]
  local name=$1 key=$2 out status=0
  shift 2
  out=$(timeout 60 redis-benchmark -h 127.0.0.1 -p "$port" -n 2000 -P 16 -c 4 -q "$@" \
    CL.THROTTLE "$key" 10 1 60 2>&1) || status=$?
  echo "$out" | tr '\r' '\n' | tail -n 3
  if [ "$status" -ne 0 ] || grep -qiE 'error|ERR |WRONGTYPE|NOAUTH' <<<"$out"; then
    echo "FAIL: redis-benchmark $name (exit $status)"
    failures=$((failures + 1))
  else
    echo "ok: redis-benchmark $name: 2000 requests, no error"
  fi
  # Every request was counted: burst 10 at 1 per 60 s admits 11 of the 2,000 and refills one a
  # minute, so the key is full and the next one is denied with nothing remaining.
  expect "after redis-benchmark $name the key is full" "1 11 0" \
    "$(cli -p "$port" CL.THROTTLE "$key" 10 1 60 | head -n 3 | tr '\n' ' ' | sed 's/ $//')"
}
bench resp2 bench-k
bench resp3 bench-k3 -3

# redis-cli -3: HELLO 3 first, then the commands.
expect "redis-cli -3 CL.THROTTLE of a fresh key" $'0\n16\n15\n-1\n2' \
  "$(cli -3 -p "$port" CL.THROTTLE cli3-user123 15 30 60)"
expect "redis-cli -3 DEL" "1" "$(cli -3 -p "$port" DEL cli3-user123 cli3-never-seen)"
expect "redis-cli -3 CL.THROTTLE after DEL" $'0\n16\n15\n-1\n2' \
  "$(cli -3 -p "$port" CL.THROTTLE cli3-user123 15 30 60)"
# SLUICE.CHECK answers a map after HELLO 3 (redis-cli prints a map's keys and values in turn).
for want in "1 3 2" "1 3 1" "1 3 0" "0 3 0"; do
  got=$(cli -3 -p "$port" SLUICE.CHECK api user cli3-ann)
  expect "redis-cli -3 SLUICE.CHECK: allowed, limit, remaining $want" \
    "allowed $(cut -d' ' -f1 <<<"$want")|limit $(cut -d' ' -f2 <<<"$want")|remaining $(cut -d' ' -f3 <<<"$want")" \
    "$(head -n 3 <<<"$got" | paste -sd'|')"
done
# Redis's text for HELLO before AUTH (redis-cli -3 sends HELLO 3 first), then NOAUTH for the command.
expect "redis-cli -3 without AUTH: HELLO 3 gets NOAUTH" \
  "HELLO 3 failed: NOAUTH HELLO must be called with the client already authenticated" \
  "$(cli -3 -p "$auth_port" CL.THROTTLE cli3-auth 15 30 60 | head -n 1 | cut -d, -f1)"
expect "redis-cli without AUTH: NOAUTH" "NOAUTH Authentication required." \
  "$(cli -p "$auth_port" CL.THROTTLE cli3-auth 15 30 60 | head -n 1)"
expect "redis-cli -3 with a wrong password" \
  "AUTH failed: WRONGPASS invalid username-password pair or user is disabled." \
  "$(cli -3 -p "$auth_port" -a not-the-password --no-auth-warning PING | head -n 1)"
expect "redis-cli -3 with the password" $'0\n16\n15\n-1\n2' \
  "$(cli -3 -p "$auth_port" -a "$password" --no-auth-warning CL.THROTTLE cli3-auth 15 30 60)"

if [ "$failures" -ne 0 ]; then
  echo "FAIL: $failures check(s)"
  exit 1
fi
echo "redis-benchmark and redis-cli -3: all checks passed"
