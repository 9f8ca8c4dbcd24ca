#!/usr/bin/python3
"""Client checks/s per language against one sluiced: the C++ client, the C API, the
Python package (blocking and asyncio) and the Go package (blocking and with a context deadline),
single blocking checks and batches, one calling thread each, loopback only.

    bench/client_bench.py [--build build] [--seconds 2] [--batch 64] [--json]

Starts sluiced (BUILD/daemon/sluiced, one worker thread, no data directory) on a free loopback
port with a rules file whose limit is never reached, runs each client for --seconds per row
(each row also stops at 20 million checks), prints a table, and with --json a last line holding
{"rows": [...]}. The Go program is built first (Debian's go; caches under BUILD/go).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SRC, "tests/support"))
from free_port import free_port  # noqa: E402  (below the ephemeral range)

RULES = """domains:
  - name: b
    rules:
      - name: per-user
        key: [user]
        limits:
          - {limit: 1000000000, window: 1m, name: per-user}
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(SRC, "build"))
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="sluiced worker threads")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if not 0 < a.seconds <= 30 or not 2 <= a.batch <= 1024:
        sys.exit("--seconds (0, 30], --batch 2..1024")
    build = os.path.abspath(a.build)
    sluiced = os.path.join(build, "daemon/sluiced")
    native = os.path.join(build, "bench/sluice-bench-client-native")
    libdir = os.path.join(build, "lib/client")
    library = os.path.join(libdir, "libsluice.so.0")
    for f in (sluiced, native, library):
        if not os.path.exists(f):
            sys.exit(f"missing {f}: build first (cmake --build {a.build} -j2)")

    with tempfile.TemporaryDirectory(prefix="sluice-client-bench-") as tmp:
        gobin = os.path.join(tmp, "sluice-bench-go")
        goenv = dict(os.environ, GOCACHE=os.path.join(build, "go/cache"),
                     GOPATH=os.path.join(build, "go/path"), GOTOOLCHAIN="local", GOPROXY="off",
                     GOFLAGS="", CGO_ENABLED="1",
                     CGO_CFLAGS=f"-I{SRC}/lib/client/include",
                     CGO_LDFLAGS=f"-L{libdir} -Wl,-rpath,{libdir}")
        subprocess.run(["go", "build", "-o", gobin, "./cmd/sluice-bench-go"], check=True,
                       cwd=os.path.join(SRC, "clients/go"), env=goenv, timeout=600)

        rules = os.path.join(tmp, "rules.yaml")
        with open(rules, "w") as f:
            f.write(RULES)
        addr = f"127.0.0.1:{free_port()}"
        log = open(os.path.join(tmp, "sluiced.log"), "w")
        node = subprocess.Popen(
            [sluiced, "--udp", addr, "--tcp", addr, "--admin", "", "--grpc", "", "--resp", "", "--data-dir", "",
             "--rules", rules, "--threads", str(a.threads), "--log-level", "warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            rows = run_rows(a, addr, native, gobin, library, node)
        finally:
            node.kill()
            node.wait(timeout=10)
            log.close()

    print(f"sluiced {addr}, {a.threads} worker thread(s); one calling thread per client; "
          f"{a.seconds:g} s per row; batch = one check_batch call of {a.batch}")
    print(f"{'client':<14} {'checks/call':>11} {'checks':>10} {'checks/s':>10} {'undecided':>9}")
    for r in rows:
        print(f"{r['lang']:<14} {r['batch']:>11} {r['checks']:>10} {r['checks_per_s']:>10} "
              f"{r['undecided']:>9}")
    if a.json:
        print(json.dumps({"rows": rows}))


def run_rows(a, addr, native, gobin, library, node):
    env = dict(os.environ, SLUICE_LIBRARY=library)
    secs = str(a.seconds)
    # Ready: the C API answers a check (bounded: 100 tries).
    for _ in range(100):
        out = subprocess.run([native, "--lang", "c", "--server", addr, "--seconds", "0.05"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and json.loads(out.stdout)["undecided"] == 0:
            break
        if node.poll() is not None:
            sys.exit("sluiced exited at start")
        time.sleep(0.1)
    else:
        sys.exit("sluiced did not answer")
    commands = []
    for batch in (1, a.batch):
        b = str(batch)
        commands += [
            [native, "--lang", "cpp", "--server", addr, "--batch", b, "--seconds", secs],
            [native, "--lang", "c", "--server", addr, "--batch", b, "--seconds", secs],
            ["/usr/bin/python3", os.path.join(HERE, "client/py_bench.py"), "--server", addr,
             "--batch", b, "--seconds", secs],
            ["/usr/bin/python3", os.path.join(HERE, "client/py_bench.py"), "--server", addr,
             "--batch", b, "--seconds", secs, "--async"],
            [gobin, "-server", addr, "-batch", b, "-seconds", secs],
            [gobin, "-server", addr, "-batch", b, "-seconds", secs, "-ctx"],
        ]
    rows = []
    for cmd in commands:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                             timeout=a.seconds + 60)
        if out.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


if __name__ == "__main__":
    main()
