#!/usr/bin/env python3
"""Render docs/benchmarks.md from bench/goals.toml and the runs recorded in docs/bench-data/.

    bench/report.py            # write docs/benchmarks.md
    bench/report.py --check    # exit 1 if docs/benchmarks.md is not what the data renders to

The page is generated: edit bench/goals.toml (goals, targets, commands), record runs with
bench/record.py, then run this. A goal whose run was not recorded, or whose row is missing from
it, is shown as such rather than dropped. The format of bench/goals.toml is described at its top.
"""
import argparse
import json
import pathlib
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOALS = ROOT / "bench" / "goals.toml"
DATA = ROOT / "docs" / "bench-data"
PAGE = ROOT / "docs" / "benchmarks.md"

DECIMALS = {"n": 0, "x": 2, "pct": 3, "us": 1, "ms": 2, "s": 1, "B": 1, "MB": 1}
OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b}


def fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "n":
        return f"{value:,.0f}"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "pct":
        return f"{value:.3f} %"
    if unit == "ms":
        return f"{value:,.2f} ms"
    if unit in ("us", "s"):
        return f"{value:,.1f} {unit.replace('us', 'µs')}"
    if unit == "B":
        return f"{value:,.1f} B"
    if unit == "MB":
        return f"{value:,.1f} MB"
    return f"{value:.3f}"


def matches(row: dict, match: dict) -> bool:
    return all(row.get(k) == v for k, v in match.items())


def value_of(row: dict, goal: dict):
    """The goal's figure in one row: `field`, or the sum of `fields`; None when absent."""
    def get(name):  # "a.b" reads row["a"]["b"]; a boolean is 1 or 0
        value = row
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return int(value) if isinstance(value, bool) else value
    values = [get(name) for name in goal.get("fields", [goal.get("field")])]
    if any(v is None or not isinstance(v, (int, float)) for v in values):
        return None
    value = sum(values)
    if goal.get("per"):  # a figure per unit of another field (bytes per key)
        value = value / row[goal["per"]] if row.get(goal["per"]) else None
    return value


def figure(goal: dict, runs: dict):
    """(value, error text) for one goal. With `agg` ("max", "min", "sum") the figure is taken
    over every row that matches; otherwise from the first. With `over`, it is divided by the
    same figure of the baseline row."""
    run = runs.get(goal["run"])
    if run is None:
        return None, f"run `{goal['run']}` not recorded"
    values = [value_of(r, goal) for r in run["rows"] if matches(r, goal.get("row", {}))]
    values = [v for v in values if v is not None]
    if not values:
        return None, f"no row {json.dumps(goal.get('row', {}))} with the figure"
    agg = goal.get("agg")
    value = {"max": max, "min": min, "sum": sum}[agg](values) if agg else values[0]
    if "over" in goal:
        base = [value_of(r, goal) for r in run["rows"] if matches(r, goal["over"])]
        base = [v for v in base if v]
        if not base:
            return None, f"no baseline row {json.dumps(goal['over'])}"
        value = value / base[0]
    return value, None


def verdict(value, target: str, unit: str) -> str:
    if not target:
        return "reported"
    if value is None:
        return "?"
    op, limit = target.split()
    # Compared at the precision the page shows: a target is stated to that precision.
    shown = round(value, DECIMALS.get(unit, 3))
    return "met" if OPS[op](shown, float(limit)) else "**not met**"


def target_text(target: str, unit: str) -> str:
    if not target:
        return "-"
    op, limit = target.split()
    return f"{op.replace('>=', '≥').replace('<=', '≤')} {fmt(float(limit), unit)}"


def curve(c: dict, runs: dict) -> list:
    """A `[[curve]]` of goals.toml as a table: one line per value of `x`, one column per value of
    `column`, each cell the `fields` of the matching row joined by " / "."""
    run = runs.get(c["run"])
    rows = [r for r in (run or {}).get("rows", []) if matches(r, c.get("row", {}))]
    if not rows:
        return [f"{c['what']}: (run `{c['run']}` has no such rows)", ""]
    xs = sorted({r[c["x"]] for r in rows})
    cols = list(dict.fromkeys(r[c["column"]] for r in rows))
    cell = {(r[c["x"]], r[c["column"]]): r for r in rows}
    unit = c.get("unit", "f")
    out = [c["what"] + ":", "", f"| {c['x']} | " + " | ".join(cols) + " |",
           "| ---: |" + " ---: |" * len(cols)]
    for x in xs:
        cells = [" / ".join(fmt(cell[(x, col)].get(f), unit) for f in c["fields"])
                 if (x, col) in cell else "-" for col in cols]
        out.append(f"| {x} | " + " | ".join(cells) + " |")
    return out + [""]


def render() -> str:
    spec = tomllib.loads(GOALS.read_text())
    runs = {}
    for path in sorted(DATA.glob("*.json")):
        data = json.loads(path.read_text())
        runs[data["run"]] = data
    out = [
        "# Benchmarks",
        "",
        "Today's figure for every goal Sluice holds itself to, each printed by a program in `bench/`",
        "on the machine named with it. Nothing is estimated. This page is generated by",
        "`bench/report.py` from the runs in `docs/bench-data/` (recorded by `bench/record.py`, which",
        "runs the commands below); the goals and their targets are in `bench/goals.toml`. Do not edit",
        "it by hand: record again and regenerate. How a figure got where it is, with profiles, before",
        "and after runs and the ideas that did not work, is in the [bench log](bench-log/README.md).",
        "",
        "Percentiles are nearest-rank (the smallest sample with at least q of all samples at or below",
        "it). Runs on this 2-core machine move by 10-25 % between runs of the same build; a goal met",
        "by less than that margin is at the line.",
        "",
    ]
    for gid, group in spec["groups"].items():
        out += [f"## {group['title']}", "", group["about"].strip(), ""]
        out += ["| goal | target | today | | run |", "| --- | ---: | ---: | --- | --- |"]
        for goal in [g for g in spec["goal"] if g["group"] == gid]:
            value, err = figure(goal, runs)
            unit = goal.get("unit", "f")
            today = fmt(value, unit) if err is None else f"({err})"
            out.append(f"| {goal['what']} | {target_text(goal.get('target', ''), unit)} | {today} | "
                       f"{verdict(value, goal.get('target', ''), unit)} | `{goal['run']}` |")
        out.append("")
        for c in [c for c in spec.get("curve", []) if c["group"] == gid]:
            out += curve(c, runs)
        if out[-1] == "":
            out.pop()
        notes = [g for g in spec["goal"] if g["group"] == gid and g.get("note")]
        if notes:
            out.append("")
            for g in notes:
                out.append(f"- {g['what']}: {g['note'].strip()}")
        out.append("")
    out += ["## The runs", "",
            "| run | what it measures | command | commit | date | machine | s |",
            "| --- | --- | --- | --- | --- | --- | ---: |"]
    for rid, run in spec["runs"].items():
        data = runs.get(rid)
        if data is None:
            out.append(f"| `{rid}` | {run['what']} | `{run['command']}` | not recorded | | | |")
            continue
        if data["command"] != run["command"]:
            out.append(f"| `{rid}` | {run['what']} | `{data['command']}` (goals.toml now says "
                       f"`{run['command']}`: record again) | `{data['commit']}` | {data['date']} | "
                       f"{data['machine']} | {data['seconds']} |")
            continue
        note = f" ({data['note']})" if data.get("note") else ""
        if data.get("exit_status", 0) != 0:
            note += f" (exit status {data['exit_status']}: a goal of the program's own failed)"
        out.append(f"| `{rid}` | {run['what']} | `{run['command']}` | `{data['commit']}` | "
                   f"{data['date']}{note} | {data['machine']} | {data['seconds']} |")
    out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare with docs/benchmarks.md instead of writing it")
    args = ap.parse_args()
    page = render()
    if args.check:
        if PAGE.read_text() != page:
            sys.exit("docs/benchmarks.md is not what bench/report.py renders from bench/goals.toml "
                     "and docs/bench-data/: run bench/report.py and commit the page")
        return
    PAGE.write_text(page)


if __name__ == "__main__":
    main()
