#!/usr/bin/env bash
# Validates deploy/k8s/ against the Kubernetes API schemas, offline (tests/k8s/validate.test.mjs).
# Installs the lockfile's packages first when they are missing (deploy/npm-ci.sh).
#
#   tests/k8s/run.sh [SOURCE_DIR]
set -euo pipefail

src=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
command -v node >/dev/null || { echo "FAIL: node not found (deploy/setup.sh installs nodejs)"; exit 1; }
"$src/deploy/npm-ci.sh" "$src/tests/k8s"
cd "$src/tests/k8s"
exec node --test-reporter=spec validate.test.mjs
