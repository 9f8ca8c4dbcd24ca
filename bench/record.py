#!/usr/bin/env python3
"""Run the benchmark runs named in bench/goals.toml and keep their JSON for docs/benchmarks.md.

    bench/record.py engine accuracy      # run two runs, write docs/bench-data/<run>.json
    bench/record.py --list               # the runs and their commands
    bench/record.py --all                # every run (about 15 minutes on a 2-core machine)

Each run's command is run from the top of the tree against a Release build in build/ (deploy/
setup.sh makes it), which must be up to date with the tree (ninja has nothing to do). The last line of its stdout must be the program's --json object
{"rows": [...]}; it is stored with the command, the commit (with "-dirty" when the tree has
changes), the UTC date and the machine (CPU model, cores, memory, kernel), so every figure in
docs/benchmarks.md says where it came from. Then run bench/report.py to render the page.

Runs hold /tmp/sluice-cpu.lock (flock) while they measure, like builds on this machine, so a
measurement does not share the machine with a compile.
"""
import argparse
import datetime
import fcntl
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOALS = ROOT / "bench" / "goals.toml"
DATA = ROOT / "docs" / "bench-data"
LOCK = "/tmp/sluice-cpu.lock"


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {mem_gib} GiB, Linux {platform.release()}"


def commit() -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "unknown"
    # Changes to the docs (and to the data this writes) do not change what is measured.
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no",
                            "--", ".", ":!docs", ":!*.md"],
                           capture_output=True, text=True).stdout.strip()
    return head + ("-dirty" if dirty else "")


def build_is_current() -> bool:
    """True when build/ has nothing left to build, so the programs measured are the tree's."""
    proc = subprocess.run(["ninja", "-C", str(ROOT / "build"), "-n"], capture_output=True,
                          text=True)
    return proc.returncode == 0 and "no work to do" in proc.stdout


def record(run_id: str, command: str, timeout_s: int, note: str) -> None:
    print(f"== {run_id}: {command}", file=sys.stderr, flush=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(shlex.split(command), cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              timeout=timeout_s)
    # Exit status 1 with rows: a bench that measured and says one of its own goals failed (the
    # rows say which); the figures are kept, with the status. Anything else wrote nothing usable.
    if proc.returncode not in (0, 1):
        sys.exit(f"{run_id}: exit status {proc.returncode}; nothing written")
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    if not lines:
        sys.exit(f"{run_id}: no output; nothing written")
    try:
        rows = json.loads(lines[-1])["rows"]
    except (ValueError, KeyError) as e:
        sys.exit(f"{run_id}: the last line is not {{\"rows\": [...]}} ({e}); nothing written")
    out = {
        "run": run_id,
        "command": command,
        "commit": commit(),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()),
        "machine": machine(),
        "note": note,
        "exit_status": proc.returncode,
        "rows": rows,
    }
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / f"{run_id}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"   {len(rows)} rows in {out['seconds']} s -> docs/bench-data/{run_id}.json",
          file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*", help="run names (bench/goals.toml [runs.NAME])")
    ap.add_argument("--all", action="store_true", help="every run")
    ap.add_argument("--list", action="store_true", help="print the runs and their commands")
    ap.add_argument("--note", default="",
                    help="what else was true of the machine during the runs (shown on the page)")
    args = ap.parse_args()
    runs = tomllib.loads(GOALS.read_text())["runs"]
    if args.list:
        for name, run in runs.items():
            print(f"{name:14} {run['command']}")
        return
    names = list(runs) if args.all else args.runs
    if not names:
        ap.error("name a run, or --all (--list shows them)")
    for name in names:
        if name not in runs:
            sys.exit(f"no run {name!r} in bench/goals.toml (--list shows them)")
    if not build_is_current():
        sys.exit("build/ is not up to date with the tree, so the figures would not be the commit's: "
                 "run cmake --build build first")
    for name in names:
        record(name, runs[name]["command"], int(runs[name].get("timeout_s", 1800)), args.note)


if __name__ == "__main__":
    main()
