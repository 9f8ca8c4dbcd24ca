#!/usr/bin/env python3
# How long a snapshot pass of sluiced takes (snapshot_interval_ms 50) while checks run (sluicectl
# check --repeat, 32 keys), without and then with override writes through the admin API (one at a
# time): polls /v1/status every 10 ms for persistence.last_snapshot.duration_ms and prints p50, p99
# and max of what it saw (why a kill -9 during override writes can lose more than
# one interval; docs/benchmarks.md). Fixed loopback ports 17650 (checks) and 17651 (admin).
#   python3 bench/snapshot_pass_probe.py [BUILD_DIR]   (default: build)
import json, os, subprocess, sys, tempfile, threading, time, urllib.request, shutil
B = os.path.join(sys.argv[1] if len(sys.argv) > 1 else "build", "daemon")
d = tempfile.mkdtemp(prefix="sluice-snapshot-probe-")
open(d + "/rules.yaml", "w").write("""domains:
  - name: g
    rules:
      - name: per-key
        key: [k]
        limits:
          - {limit: 1000000000, window: 1h, granularity: 1m}
""")
open(d + "/c.yaml", "w").write(f"""udp: 127.0.0.1:17650
tcp: 127.0.0.1:17650
admin: 127.0.0.1:17651
grpc: ""
resp: ""
threads: 1
rules: {d}/rules.yaml
data_dir: {d}/data
init_data: true
snapshot_interval_ms: 50
log_level: warn
""")
p = subprocess.Popen([B + "/sluiced", "--config", d + "/c.yaml"], stdout=open(d + "/log", "w"), stderr=subprocess.STDOUT)
A = "http://127.0.0.1:17651"
def req(path, body=None):
    r = urllib.request.Request(A + path, data=None if body is None else json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=5) as f:
        return f.status, f.read()
for _ in range(100):
    try: req("/healthz"); break
    except Exception: time.sleep(0.05)
stop = threading.Event()
def checks():
    i = 0
    while not stop.is_set():
        subprocess.run([B + "/sluicectl", "check", "g", f"k=ck-{i % 32}", "--server", "127.0.0.1:17650",
                        "--repeat", "200"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        i += 1
def overrides():
    i = 0
    while not stop.is_set():
        try: req("/v1/overrides", {"domain": "g", "descriptors": {"k": f"ov-{i % 40}"}, "limits": [f"{i + 1}/1s"]})
        except Exception: pass
        i += 1
def phase(name, with_overrides, seconds):
    stop.clear()
    ts = [threading.Thread(target=checks)]
    if with_overrides: ts.append(threading.Thread(target=overrides))
    for t in ts: t.start()
    durs = []; t_end = time.time() + seconds; n0 = None
    while time.time() < t_end:
        try:
            s = json.loads(req("/v1/status")[1])["persistence"]
            ls = s["last_snapshot"]
            if ls: durs.append(ls["duration_ms"])
            if n0 is None: n0 = s["snapshots"]
            n1 = s["snapshots"]
        except Exception: pass
        time.sleep(0.01)
    stop.set()
    for t in ts: t.join()
    durs.sort()
    print(f"{name}: {seconds} s, passes {n1 - n0}, polls {len(durs)}, last-pass duration_ms p50 {durs[len(durs)//2]}, p99 {durs[int(len(durs)*0.99)]}, max {durs[-1]}")
phase("checks only", False, 20)
phase("checks + override writes", True, 20)
p.terminate(); p.wait()
shutil.rmtree(d, ignore_errors=True)
