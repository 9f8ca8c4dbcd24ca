"""Checks/s of the Python client (clients/python) against a running node, one calling thread.

    SLUICE_LIBRARY=... /usr/bin/python3 bench/client/py_bench.py --server H:P --batch 1|N
        [--seconds 2] [--async]

Prints one JSON object like sluice-bench-client-native's. Run by bench/client_bench.py.
"""
import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../clients/python"))
import sluice  # noqa: E402

MAX_CHECKS = 20_000_000


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--async", dest="use_async", action="store_true")
    a = p.parse_args()
    if not 1 <= a.batch <= 1024 or not 0 < a.seconds <= 60:
        sys.exit("--batch 1..1024, --seconds (0, 60]")
    users = [f"u{i}" for i in range(1000)]
    checks = undecided = n = 0
    start = until = took = 0.0  # set once the client exists: creating it is not timed
    if a.use_async:
        async def run():
            nonlocal checks, undecided, n, start, until, took
            async with sluice.AsyncClient([a.server], timeout=0.2) as c:
                start = time.monotonic()
                until = start + a.seconds
                while time.monotonic() < until and checks < MAX_CHECKS:
                    if a.batch == 1:
                        rs = [await c.check("b", user=users[n % 1000])]
                    else:
                        rs = await c.check_batch(
                            [("b", {"user": users[(n + i) % 1000]}) for i in range(a.batch)])
                    n += a.batch
                    checks += len(rs)
                    undecided += sum(not r.decided for r in rs)
                took = time.monotonic() - start
        asyncio.run(run())
    else:
        with sluice.Client([a.server], timeout=0.2) as c:
            start = time.monotonic()
            until = start + a.seconds
            while time.monotonic() < until and checks < MAX_CHECKS:
                if a.batch == 1:
                    rs = [c.check("b", user=users[n % 1000])]
                else:
                    rs = c.check_batch(
                        [("b", {"user": users[(n + i) % 1000]}) for i in range(a.batch)])
                n += a.batch
                checks += len(rs)
                undecided += sum(not r.decided for r in rs)
            took = time.monotonic() - start
    print(json.dumps({"lang": "python-async" if a.use_async else "python", "batch": a.batch,
                      "checks": checks, "seconds": round(took, 3),
                      "checks_per_s": round(checks / took), "undecided": undecided}))


if __name__ == "__main__":
    main()
