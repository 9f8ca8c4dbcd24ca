#!/usr/bin/env bash
# Fails when a doctest case name holds ';'. CTest keeps the names doctest_discover_tests finds in a
# list, so such a case becomes two CTest tests that match no case and pass without running.
#   tests/check_test_names.sh BINARY...
set -euo pipefail
bad=0
for bin in "$@"; do
  names=$("$bin" --list-test-cases --no-version) || { echo "$bin: --list-test-cases failed"; exit 1; }
  while IFS= read -r name; do
    case "$name" in
      *";"*) echo "$(basename "$bin"): test case name holds ';' (use ','): $name"; bad=1 ;;
    esac
  done <<<"$names"
done
if ((bad)); then exit 1; fi
echo "checked the case names of $# test binaries: none holds ';'"
