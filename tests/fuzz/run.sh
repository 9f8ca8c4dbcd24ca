#!/usr/bin/env bash
# Builds the wire fuzzer with clang in its own build directory and runs it for a bounded time.
#
#   tests/fuzz/run.sh [SECONDS]     (default 30)
#
# The seed corpus is regenerated from valid encodings (requests, answers, a TCP stream) on every
# run; what the fuzzer finds is kept in build-fuzz/corpus between runs. Exits non-zero when the
# fuzzer finds a crash, a sanitizer report or a broken property (the input is saved as
# build-fuzz/crash-*; commit such an input under tests/fuzz/regressions/ with the fix). Environment: BUILD_DIR (default build-fuzz), JOBS (default 1).
set -euo pipefail

seconds="${1:-30}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-${root}/build-fuzz}"
jobs="${JOBS:-1}"

CC=clang CXX=clang++ cmake -S "${root}" -B "${build}" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_FUZZ=ON \
  -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCH=OFF >/dev/null
cmake --build "${build}" --target request_fuzz -j "${jobs}"

fuzzer="${build}/tests/fuzz/request_fuzz"
seeds="${build}/seeds"
corpus="${build}/corpus"
rm -rf "${seeds}"
mkdir -p "${seeds}" "${corpus}"
SLUICE_FUZZ_WRITE_SEEDS="${seeds}" "${fuzzer}"

# Inputs that once broke a property (tests/fuzz/regressions/) must pass before fuzzing starts.
"${fuzzer}" "${root}"/tests/fuzz/regressions/*

cd "${build}"  # crash-* artifacts land here
"${fuzzer}" -max_len=70000 -max_total_time="${seconds}" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 "${corpus}" "${seeds}"
