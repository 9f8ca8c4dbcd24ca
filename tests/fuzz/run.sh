#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in their own build directory and runs each for a
# bounded time.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]     (default 30 s each; every target)
#
# Targets: request_fuzz (lib/wire: check requests, answers, TCP frames), peer_fuzz (node-to-node
# datagrams: HMAC, envelope, payloads, replay), rules_fuzz (Sluice's rules file and
# envoyproxy/ratelimit's config), config_fuzz (the daemon's config file), rls_fuzz (Envoy's
# RateLimitRequest through the gRPC front's planning).
#
# Each target's seeds are regenerated from valid inputs on every run (the binary writes them with
# SLUICE_FUZZ_WRITE_SEEDS); what the fuzzer finds is kept in build-fuzz/corpus/TARGET between
# runs. Inputs that once broke a property (tests/fuzz/regressions/TARGET/) must pass first. Exits
# non-zero when a fuzzer finds a crash, a sanitizer report or a broken property (the input is
# saved as build-fuzz/crash-*; commit it under tests/fuzz/regressions/TARGET/ with the fix).
# Environment: BUILD_DIR (default build-fuzz), JOBS (default 2).
set -euo pipefail

seconds="${1:-30}"
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(request_fuzz peer_fuzz rules_fuzz config_fuzz rls_fuzz)
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
  rm -rf "${seeds}"
  mkdir -p "${seeds}" "${corpus}"
  SLUICE_FUZZ_WRITE_SEEDS="${seeds}" "${fuzzer}"
  if compgen -G "${root}/tests/fuzz/regressions/${t}/*" >/dev/null; then
    "${fuzzer}" "${root}/tests/fuzz/regressions/${t}/"*
  fi
  echo "== ${t}: ${seconds} s"
  (cd "${build}" && "${fuzzer}" -max_len=70000 -max_total_time="${seconds}" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 "${corpus}" "${seeds}")  # crash-* land in build/
done
