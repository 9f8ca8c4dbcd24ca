#!/usr/bin/env bash
# Checks deploy/systemd/sluiced.service as CI does, without systemd running:
#   systemd-analyze verify                      on a copy whose ExecStart names SLUICED (verify
#                                               wants the program to exist)
#   systemd-analyze security --offline=true     the overall exposure must be 2.0 or lower
#
#   deploy/systemd/check_unit.sh [SLUICED]      default: build/daemon/sluiced
# Prints the exposure; exits 1 with the reason when either check fails.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
unit="$here/deploy/systemd/sluiced.service"
sluiced=$(realpath "${1:-$here/build/daemon/sluiced}")
max_exposure=2.0

fail() { echo "FAILED: $*" >&2; exit 1; }
command -v systemd-analyze >/dev/null || fail "systemd-analyze not found (package systemd; deploy/setup.sh)"
[ -x "$sluiced" ] || fail "$sluiced is not an executable: build first"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#/usr/bin/sluiced#$sluiced#g" "$unit" >"$tmp/sluiced.service"
if ! out=$(systemd-analyze verify "$tmp/sluiced.service" 2>&1); then
  fail "systemd-analyze verify: $out"
fi
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"
echo "systemd-analyze verify: clean"

report=$(systemd-analyze security --offline=true --no-pager "$unit" 2>&1) ||
  fail "systemd-analyze security: $report"
# Last line: "→ Overall exposure level for sluiced.service: 1.1 OK 🙂"
exposure=$(tail -n 1 <<<"$report" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9][0-9.]*\).*/\1/p')
[ -n "$exposure" ] || fail "no overall exposure in systemd-analyze security's output:\n$report"
echo "systemd-analyze security --offline=true: exposure $exposure (at most $max_exposure)"
if ! awk -v e="$exposure" -v m="$max_exposure" 'BEGIN { exit !(e <= m) }'; then
  grep '✗' <<<"$report" >&2 || true
  fail "exposure $exposure is over $max_exposure"
fi
