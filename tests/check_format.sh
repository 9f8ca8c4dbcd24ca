#!/usr/bin/env bash
# Every C++ file in the repository is as .clang-format says (Debian's clang-format 14).
#   tests/check_format.sh         list the files that differ; exit 1 if any does
#   tests/check_format.sh --fix   rewrite them in place
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v clang-format >/dev/null || { echo "clang-format not found (deploy/setup.sh installs it)" >&2; exit 2; }
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cc' '*.h')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f"
    bad=$((bad + 1))
  fi
done
if ((bad > 0)); then
  echo "$bad of ${#files[@]} files differ from .clang-format; run tests/check_format.sh --fix" >&2
  exit 1
fi
echo "all ${#files[@]} C++ files match .clang-format"
