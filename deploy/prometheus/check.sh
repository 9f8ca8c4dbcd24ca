#!/usr/bin/env bash
# Checks the Prometheus rules and the Grafana board offline (CTest prometheus_rules):
#   1. promtool check rules: the rules file parses and every expression is valid PromQL;
#   2. promtool test rules: every alert fires on the series it is for and not on its look-alikes,
#      and the recording rules sum as the board expects (sluice-rules.test.yml);
#   3. every panel of deploy/grafana/sluice.json queries one of the recording rules, and every
#      recording rule but the alerts' own helpers is on the board.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v promtool >/dev/null || { echo "SKIPPED: promtool not installed (Debian package prometheus)"; exit 0; }
promtool check rules "$here/sluice-rules.yml"
(cd "$here" && promtool test rules sluice-rules.test.yml)
python3 - "$here/sluice-rules.yml" "$here/../grafana/sluice.json" <<'PY'
import json, re, sys
rules = open(sys.argv[1]).read()
recorded = set(re.findall(r"^\s*- record: (\S+)", rules, re.M))
board = json.load(open(sys.argv[2]))
queried = set()
for panel in board["panels"]:
    for target in panel["targets"]:
        expr = target["expr"].strip()
        if expr not in recorded:
            sys.exit(f"panel {panel['title']!r} queries {expr!r}, not a recording rule of sluice-rules.yml")
        queried.add(expr)
missing = recorded - queried
if missing:
    sys.exit(f"recording rules on no panel of the board: {sorted(missing)}")
print(f"board: {len(board['panels'])} panels, each on one of {len(recorded)} recording rules")
PY
