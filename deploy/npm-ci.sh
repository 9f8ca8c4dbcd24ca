#!/usr/bin/env bash
# Installs one test directory's npm packages exactly as its committed lockfile pins them
# (`npm ci`), only when node_modules is missing or the lockfile changed since the last install:
# the stamp node_modules/.sluice-lock.sha256 holds the lockfile's hash, so a prepared tree runs
# offline. Used by deploy/setup.sh and the test scripts (tests/ui/run.sh, tests/k8s/run.sh).
#
#   deploy/npm-ci.sh DIR      DIR holds package.json, package-lock.json and .npmrc
set -euo pipefail

dir=${1:?usage: deploy/npm-ci.sh DIR}
command -v npm >/dev/null || { echo "FAIL: npm not found (deploy/setup.sh installs it)"; exit 1; }
lock_sum=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
stamp=$dir/node_modules/.sluice-lock.sha256
if [ -d "$dir/node_modules" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$lock_sum" ]; then
  exit 0
fi
echo "npm ci in $dir"
npm ci --prefix "$dir" --no-audit --no-fund ||
  { echo "FAIL: npm ci in $dir failed (offline? deploy/setup.sh installs the packages)"; exit 1; }
echo "$lock_sum" >"$stamp"
