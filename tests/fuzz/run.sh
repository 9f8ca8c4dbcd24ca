#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in their own build directory and runs each for a
# bounded time.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]     (default 30 s each; every target)
#
# Targets: request_fuzz (lib/wire: check requests, answers, TCP frames), peer_fuzz (node-to-node
# datagrams: HMAC, envelope, payloads, replay), rules_fuzz (Sluice's rules file and
# envoyproxy/ratelimit's config), config_fuzz (the daemon's config file), rls_fuzz (Envoy's
# RateLimitRequest through the gRPC front's planning), http_fuzz (the admin port: raw requests,
# the token check, /v1/check and /v1/auth input, override bodies, query strings), ctl_fuzz
# (sluicectl's command line), resp_fuzz (the Redis door: RESP requests through the parser and a
# session, answered now or later).
#
# Inputs, in order: the inputs that once broke a property (tests/fuzz/regressions/TARGET/, which
# must pass first), the committed corpus (tests/fuzz/corpus/TARGET/, read only), the seeds the
# binary writes from valid inputs (SLUICE_FUZZ_WRITE_SEEDS), and what earlier runs found
# (BUILD_DIR/corpus/TARGET, where new finds go). tests/fuzz/dict/TARGET.dict is the dictionary
# of a format with keywords. Exits non-zero when a fuzzer finds a crash, a sanitizer report or a
# broken property (the input is saved as BUILD_DIR/crash-*; commit it under
# tests/fuzz/regressions/TARGET/ with the fix).
#
# Environment: BUILD_DIR (default build-fuzz), JOBS (default 2), TIMEOUT (seconds one input may
# take before libFuzzer calls it a hang, default 10; raise it when the fuzzer shares the machine
# at a low priority, or a starved process reports a false hang); RUNS=N runs N executions per
# target instead of SECONDS (a campaign: docs/bench-log/2026-11-27-fuzzing.md); MERGE=1 folds what the
# run found into tests/fuzz/corpus/TARGET (libFuzzer's -merge keeps only inputs with new
# coverage) for committing.
set -euo pipefail

seconds="${1:-30}"
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(request_fuzz peer_fuzz rules_fuzz config_fuzz rls_fuzz http_fuzz ctl_fuzz resp_fuzz)
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-${root}/build-fuzz}"
jobs="${JOBS:-2}"

CC=clang CXX=clang++ cmake -S "${root}" -B "${build}" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_FUZZ=ON \
  -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCH=OFF >/dev/null
cmake --build "${build}" --target "${targets[@]}" -j "${jobs}"

for t in "${targets[@]}"; do
  fuzzer="${build}/tests/fuzz/${t}"
  seeds="${build}/seeds/${t}"
  corpus="${build}/corpus/${t}"
  committed="${root}/tests/fuzz/corpus/${t}"
  rm -rf "${seeds}"
  mkdir -p "${seeds}" "${corpus}"
  SLUICE_FUZZ_WRITE_SEEDS="${seeds}" "${fuzzer}"
  if compgen -G "${root}/tests/fuzz/regressions/${t}/*" >/dev/null; then
    "${fuzzer}" "${root}/tests/fuzz/regressions/${t}/"*
  fi
  inputs=("${corpus}" "${seeds}")
  [[ -d "${committed}" ]] && inputs+=("${committed}")
  options=(-max_len=70000 "-timeout=${TIMEOUT:-10}" -rss_limit_mb=2048 -print_final_stats=1)
  [[ -f "${root}/tests/fuzz/dict/${t}.dict" ]] && options+=("-dict=${root}/tests/fuzz/dict/${t}.dict")
  if [[ -n "${RUNS:-}" ]]; then
    echo "== ${t}: ${RUNS} executions"
    options+=("-runs=${RUNS}")
  else
    echo "== ${t}: ${seconds} s"
    options+=("-max_total_time=${seconds}")
  fi
  (cd "${build}" && "${fuzzer}" "${options[@]}" "${inputs[@]}")  # crash-* land in BUILD_DIR
  if [[ "${MERGE:-0}" == 1 ]]; then
    mkdir -p "${committed}"
    (cd "${build}" && "${fuzzer}" -merge=1 -max_len=70000 "${committed}" "${corpus}" "${seeds}")
  fi
done
