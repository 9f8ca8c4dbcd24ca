#!/usr/bin/python3
"""A real Prometheus scrapes a real 3-node Sluice cluster under traffic (CTest prometheus_live).

Starts three sluiced on loopback (deploy/local-cluster.sh on a free block of ports), a Prometheus
(the Debian package's binary) that scrapes their admin ports every second as job "sluice" and
evaluates deploy/prometheus/sluice-rules.yml every second, and sends a known rate of checks over
HTTP for 70 s: an enforced rule that allows all of them, one whose limit denies some, and a
dry-run rule that would deny some. Then every recording rule (which is every query of the Grafana
board, deploy/prometheus/check.sh holds them equal) must return series with its expected labels
and plausible values, the allowed rate within 10 % of what was sent, and no alert may fire.

Usage: live_test.py SOURCE_DIR BUILD_DIR. Prints "SKIPPED: ..." (CTest's skip pattern) when
prometheus is not installed.
"""
import http.client
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

SRC, BUILD = sys.argv[1], sys.argv[2]
RATE = 60  # checks/s of each kind, spread over the three nodes
TRAFFIC_S = 70  # long enough for a full 1m rate window plus scrapes on both sides

RULES = """
domains:
  - name: prom
    rules:
      - name: roomy
        match: {kind: roomy}
        key: [user]
        limits: [1000000/1m]
      - name: tight
        match: {kind: tight}
        key: [user]
        limits: [30/1s]
      - name: trial
        match: {kind: trial}
        key: [user]
        limits: [30/1s]
        mode: dry-run
"""


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def ports_free(ports):
    for port in ports:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            s = socket.socket(socket.AF_INET, kind)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
            finally:
                s.close()
    return True


def pick_base():
    # Below the ephemeral range (tests/support/free_port.h says why), in blocks of 40: three
    # nodes use base + 0..24, Prometheus base + 30.
    rng = random.Random(os.getpid() ^ int(time.time()))
    for _ in range(200):
        base = rng.randrange(20000, 31000, 40)
        if ports_free([base + i for i in range(25)] + [base + 30]):
            return base
    fail("no free block of loopback ports")


def query(prom, expr):
    url = f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    if body.get("status") != "success":
        fail(f"query {expr}: {body}")
    return body["data"]["result"]


def send_checks(admin_ports, kind, stop_at, sent):
    conns = [http.client.HTTPConnection("127.0.0.1", p, timeout=5) for p in admin_ports]
    period = 1.0 / RATE
    next_t = time.monotonic()
    i = 0
    while time.monotonic() < stop_at:
        conn = conns[i % len(conns)]
        body = json.dumps({"domain": "prom", "descriptors": {"kind": kind, "user": "u1"}})
        conn.request("POST", "/v1/check", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        if resp.status not in (200, 429):
            fail(f"/v1/check answered {resp.status}")
        sent[kind] = sent.get(kind, 0) + 1
        i += 1
        next_t += period
        time.sleep(max(0.0, next_t - time.monotonic()))


def main():
    prometheus = shutil.which("prometheus")
    if not prometheus:
        print("SKIPPED: prometheus is not installed (Debian package prometheus)")
        return
    work = tempfile.mkdtemp(prefix="sluice-prom-")
    base = pick_base()
    admin_ports = [base + 10 * i + 1 for i in range(3)]
    prom_addr = f"127.0.0.1:{base + 30}"
    rules_file = os.path.join(work, "rules.yaml")
    with open(rules_file, "w") as f:
        f.write(RULES)
    env = dict(os.environ, SLUICE_BIN_DIR=os.path.join(BUILD, "daemon"),
               SLUICE_CLUSTER_DIR=os.path.join(work, "cluster"), SLUICE_BASE_PORT=str(base),
               SLUICE_RULES=rules_file)
    cluster = os.path.join(SRC, "deploy", "local-cluster.sh")
    prom = None
    try:
        subprocess.run([cluster, "start", "3"], env=env, check=True, timeout=60)
        shutil.copy(os.path.join(SRC, "deploy", "prometheus", "sluice-rules.yml"), work)
        with open(os.path.join(work, "prometheus.yml"), "w") as f:
            f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                    "rule_files: [sluice-rules.yml]\n"
                    "scrape_configs:\n"
                    "  - job_name: sluice\n"
                    "    static_configs:\n"
                    f"      - targets: [{', '.join(f'127.0.0.1:{p}' for p in admin_ports)}]\n")
        prom = subprocess.Popen(
            [prometheus, f"--config.file={work}/prometheus.yml", f"--storage.tsdb.path={work}/tsdb",
             f"--web.listen-address={prom_addr}"],
            stdout=open(os.path.join(work, "prometheus.log"), "w"), stderr=subprocess.STDOUT)
        # Members join within seconds; wait until each node sees three alive members.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                alive = query(prom_addr, 'sluice_cluster_members{state="alive"} == 3')
                if len(alive) == 3:
                    break
            except OSError:
                pass
            time.sleep(1)
        else:
            fail("the three nodes never all saw three alive members (or Prometheus did not start)")
        sent = {}
        stop_at = time.monotonic() + TRAFFIC_S
        threads = [threading.Thread(target=send_checks, args=(admin_ports, k, stop_at, sent))
                   for k in ("roomy", "tight", "trial")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(3)  # the last scrape and rule evaluation
        print(f"sent over {TRAFFIC_S} s: {sent}")
        check_rules(prom_addr, sent)
        print("ok: every recording rule answered with its labels and plausible values; no alert")
    finally:
        if prom:
            prom.terminate()
            prom.wait(timeout=10)
        subprocess.run([cluster, "stop"], env=env, timeout=60)
        shutil.rmtree(work, ignore_errors=True)


def one(prom, expr, labels):
    res = query(prom, expr)
    if not res:
        fail(f"{expr}: no series")
    for s in res:
        missing = [l for l in labels if l not in s["metric"]]
        if missing:
            fail(f"{expr}: series {s['metric']} lacks labels {missing}")
    return res


def check_rules(prom, sent):
    rate = RATE
    # Decisions per rule, summed over the cluster.
    allowed = {s["metric"]["rule"]: float(s["value"][1])
               for s in one(prom, 'sluice:rule_allowed:rate1m{domain="prom"}', ["domain", "rule"])}
    print(f"allowed/s per rule: {allowed}")
    if abs(allowed.get("roomy", 0) - rate) > 0.1 * rate:
        fail(f"allowed rate of rule roomy {allowed.get('roomy')} is not within 10 % of {rate}/s")
    denied = {s["metric"]["rule"]: float(s["value"][1])
              for s in one(prom, 'sluice:rule_denied:rate1m{domain="prom"}', ["domain", "rule"])}
    if not 0 < denied.get("tight", 0) < rate:
        fail(f"denied rate of rule tight {denied.get('tight')} is not within (0, {rate})")
    would = {s["metric"]["rule"]: float(s["value"][1])
             for s in one(prom, 'sluice:rule_would_deny:rate1m{domain="prom"}', ["domain", "rule"])}
    if not 0 < would.get("trial", 0) < rate:
        fail(f"would-deny rate of rule trial {would.get('trial')} is not within (0, {rate})")
    every = one(prom, 'sluice:rule_decisions:rate1m{domain="prom"}', ["domain", "rule", "decision"])
    total = sum(float(s["value"][1]) for s in every)
    if abs(total - 3 * rate) > 0.1 * 3 * rate:
        fail(f"every decision together {total}/s is not within 10 % of {3 * rate}/s")
    # Per node.
    checks = one(prom, "sluice:checks:rate1m", ["instance"])
    if len(checks) != 3 or sum(float(s["value"][1]) for s in checks) <= 0:
        fail(f"sluice:checks:rate1m: {checks}")
    for expr in ("sluice:forwarded_parts:rate1m", "sluice:forward_fallbacks:rate1m",
                 "sluice:forward_failovers:rate1m"):
        res = one(prom, expr, ["instance"])
        if len(res) != 3 or any(float(s["value"][1]) < 0 for s in res):
            fail(f"{expr}: {res}")
    lag = one(prom, "sluice:sync_lag_ms:max", ["instance"])
    if len(lag) != 3 or any(not 0 <= float(s["value"][1]) < 5000 for s in lag):
        fail(f"sluice:sync_lag_ms:max not within [0, 5000) on three nodes: {lag}")
    states = one(prom, 'sluice:members:by_state{state="alive"}', ["instance", "state"])
    if sorted(float(s["value"][1]) for s in states) != [3.0, 3.0, 3.0]:
        fail(f"every node should see 3 alive members: {states}")
    unreachable = one(prom, "sluice:members_unreachable", ["instance"])
    if any(float(s["value"][1]) != 0 for s in unreachable):
        fail(f"members out of reach on a healthy cluster: {unreachable}")
    memory = one(prom, "sluice:memory_cap:ratio", ["instance"])
    if any(not 0 < float(s["value"][1]) < 0.5 for s in memory):
        fail(f"counter memory over its cap not within (0, 0.5): {memory}")
    # Every metric the rules read is one sluiced exports (a misspelt name would make an alert
    # that can never fire, and promtool's unit tests, fed by hand, would not notice).
    rules = open(os.path.join(SRC, "deploy", "prometheus", "sluice-rules.yml")).read()
    wanted = set(re.findall(r"\b(sluice_[a-z_]+)", rules))
    url = f"http://{prom}/api/v1/label/__name__/values"
    with urllib.request.urlopen(url, timeout=5) as r:
        exported = set(json.load(r)["data"])
    missing = sorted(wanted - exported)
    if missing:
        fail(f"the rules read metrics no node exports: {missing}")
    firing = query(prom, 'ALERTS{alertstate="firing"}')
    if firing:
        fail(f"alerts firing on a healthy cluster: {[a['metric'] for a in firing]}")


if __name__ == "__main__":
    main()
