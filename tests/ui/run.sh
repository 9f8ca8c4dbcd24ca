#!/usr/bin/env bash
# Runs the dashboard's browser test (tests/ui/dashboard.test.mjs) against a real sluiced, in
# headless Chromium (Debian's chromium package; playwright-core only drives it, it downloads no
# browser). Installs the lockfile's packages first when they are missing (deploy/npm-ci.sh).
#
#   tests/ui/run.sh [SLUICED_BINARY [SOURCE_DIR]]
#   SLUICE_UI_SCREENSHOT=docs/dashboard.png tests/ui/run.sh   also saves a screenshot after
#                                             SLUICE_UI_TRAFFIC_S (default 120) s of mixed traffic
#
# A missing tool is a failure with its reason (deploy/setup.sh installs them all), never a skip.
set -euo pipefail

src=${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
sluiced=${1:-${SLUICED_BIN:-$src/build/daemon/sluiced}}
[ -x "$sluiced" ] || { echo "FAIL: sluiced not found at $sluiced (build it first)"; exit 1; }
export SLUICED_BIN=$(cd "$(dirname "$sluiced")" && pwd)/$(basename "$sluiced")
command -v node >/dev/null || { echo "FAIL: node not found (deploy/setup.sh installs nodejs)"; exit 1; }
[ -x "${SLUICE_CHROMIUM:-/usr/bin/chromium}" ] ||
  { echo "FAIL: ${SLUICE_CHROMIUM:-/usr/bin/chromium} not found (deploy/setup.sh installs chromium)"; exit 1; }
if [ -n "${SLUICE_UI_SCREENSHOT:-}" ]; then
  case "$SLUICE_UI_SCREENSHOT" in /*) ;; *) SLUICE_UI_SCREENSHOT=$PWD/$SLUICE_UI_SCREENSHOT ;; esac
  export SLUICE_UI_SCREENSHOT
fi
"$src/deploy/npm-ci.sh" "$src/tests/ui"

# The test writes sluiced's pid to $SLUICE_UI_PIDFILE; whatever ends this script stops it.
source "$src/tests/support/sluiced_guard.sh"
guard_start ui SLUICE_UI_PIDFILE
cd "$src/tests/ui"
guard_run node --test-reporter=spec dashboard.test.mjs
