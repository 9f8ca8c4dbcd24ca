#!/usr/bin/env bash
# Runs builds of sluice-bench-engine in turn, round after round, and prints each build's runs and
# mean checks/s: on a noisy machine only interleaved runs compare builds (docs/benchmarks.md).
#
#   bench/interleave.sh ROUNDS "BIN_A BIN_B ..." [sluice-bench-engine options for one row]
#   e.g. bench/interleave.sh 8 "/tmp/before/sluice-bench-engine build/bench/sluice-bench-engine" \
#          --keys 1000000 --dist uniform --threads 1 --batch 32 --seconds 2
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,7p' "$0" >&2
  exit 2
fi
rounds=$1
read -r -a bins <<<"$2"
shift 2
for ((i = 0; i < rounds; i++)); do
  for bin in "${bins[@]}"; do
    # The --json line's last row is the row; checks_per_sec its figure.
    rate=$("$bin" "$@" --json 2>/dev/null | tail -n 1 | jq '.rows[-1].checks_per_sec')
    echo "$bin $rate"
  done
done | awk '{s[$1] += $2; n[$1]++; v[$1] = v[$1] " " $2}
  END {for (k in s) printf "%s mean %.0f :%s\n", k, s[k] / n[k], v[k]}'
