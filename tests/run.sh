#!/usr/bin/env bash
# The whole test suite, as README's test command and CI run it: every test but the timing bounds
# (label perf) two at a time, then the timing bounds alone and one at a time, so that nothing else
# loads the machine while they measure (docs/testing.md). Both phases always run; the exit status
# is non-zero when either failed. Argument: the build tree (build).
set -uo pipefail
build=${1:-build}

ctest --test-dir "$build" --output-on-failure -j2 -LE perf
rest=$?
echo "== timing bounds (label perf), one at a time"
ctest --test-dir "$build" --output-on-failure -L perf --no-tests=error
perf=$?
echo "== tests: $([ $rest -eq 0 ] && echo passed || echo FAILED); timing bounds (perf):" \
     "$([ $perf -eq 0 ] && echo passed || echo FAILED)"
[ $rest -eq 0 ] && [ $perf -eq 0 ]
