#!/usr/bin/env python3
"""Slow and idle clients must not starve the others.

Starts sluiced (the binary given) on free loopback ports, then holds 300 connections open on the
admin port that send a request header one byte at a time, 300 on the TCP check port that send a
frame one byte at a time and 300 on the gRPC port that send HTTP/2's connection preface one byte
at a time, each reopened as soon as sluiced closes it, and asserts meanwhile that:
  - GET /healthz on a fresh connection answers 200 in under 100 ms, every time (20 tries);
  - grpc.health.v1 Check on a fresh gRPC connection answers SERVING in under 100 ms, every time;
  - a check over TCP (sluicectl check --tcp) is answered;
  - the slow connections are closed by their deadlines or shed for the new ones, and /metrics
    counts them (sluice_http_connections_closed_total, sluice_tcp_connections_closed_total).
Bounded: every connection, loop and subprocess has a timeout; the whole test takes ~20 s.
The gRPC part needs the grpc module (Debian's python3-grpcio, which deploy/setup.sh installs: run
with /usr/bin/python3); without it the test fails, saying so, rather than pass with a part unrun.

  slow_clients_test.py SLUICED SLUICECTL
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../support"))
from free_port import free_port  # noqa: E402  (below the ephemeral range)

SLOW = 300
BYTE_EVERY_S = 0.5


try:
    import grpc
except ImportError as e:
    sys.exit(f"FAIL: no grpc module in {sys.executable} ({e}): deploy/setup.sh installs "
             "python3-grpcio for /usr/bin/python3")


def grpc_health(port, timeout=2.0):
    """grpc.health.v1.Health/Check for the server as a whole, on a new connection: (status, s).

    The request is an empty HealthCheckRequest; SERVING is field 1 = 1 (b"\x08\x01")."""
    t0 = time.monotonic()
    with grpc.insecure_channel(f"127.0.0.1:{port}",
                               options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check")
        answer = check(b"", timeout=timeout)
    return answer, time.monotonic() - t0


def get(url, timeout=2.0):
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read().decode()
        return r.status, body, time.monotonic() - t0


def metric(text, name, labels=""):
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + "{" + labels) or (not labels and line.startswith(name + " ")):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


def main():
    sluiced, sluicectl = sys.argv[1], sys.argv[2]
    admin, port = free_port(), free_port()
    grpc_port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log = open(os.path.join(tmp, "sluiced.log"), "w")
        # Short deadlines, so that the test sees them act within its time.
        cfg = os.path.join(tmp, "sluiced.yaml")
        with open(cfg, "w") as f:
            f.write(
                f"udp: 127.0.0.1:{port}\ntcp: 127.0.0.1:{port}\nadmin: 127.0.0.1:{admin}\n"
                f"grpc: '127.0.0.1:{grpc_port}'\nresp: ''\n"
                f"data_dir: {tmp}/data\ninit_data: true\n"
                "client_timeout_ms: 3000\nmax_connections: 256\n")
        proc = subprocess.Popen([sluiced, "--config", cfg], stdout=log, stderr=subprocess.STDOUT)
        conns = []
        try:
            base = f"http://127.0.0.1:{admin}"
            for _ in range(100):
                try:
                    if get(base + "/healthz")[0] == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.1)
            else:
                raise SystemExit("sluiced did not come up")

            header = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 64
            frame = b"\x00\x00\x01\x00" + b"\x00" * 255  # a 256-byte frame, sent a byte at a time
            preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 64
            slow = {admin: header, port: frame, grpc_port: preface}
            for i in range(SLOW):
                for dest, data in slow.items():
                    c = socket.create_connection(("127.0.0.1", dest), timeout=2)
                    c.setblocking(False)
                    conns.append([c, data, 0, dest])
            print(f"{len(conns)} slow connections open")

            worst = 0.0
            worst_grpc = 0.0
            tries = 0
            checked = False
            closed = 0
            t_end = time.monotonic() + 12
            next_probe = time.monotonic()
            while time.monotonic() < t_end:
                for c in conns:
                    sock, data, sent, dest = c
                    if sent >= len(data):
                        continue
                    try:
                        sock.send(data[sent:sent + 1])
                        c[2] += 1
                    except OSError:
                        # Closed by the server (what the deadlines and the cap are for): the
                        # attacker comes back with a new one, so the load lasts the whole test.
                        sock.close()
                        closed += 1
                        c[0] = socket.create_connection(("127.0.0.1", dest), timeout=2)
                        c[0].setblocking(False)
                        c[2] = 0
                if time.monotonic() >= next_probe and tries < 20:
                    status, _, took = get(base + "/healthz", timeout=1.0)
                    assert status == 200, status
                    worst = max(worst, took)
                    answer, took = grpc_health(grpc_port)
                    assert answer == b"\x08\x01", answer  # SERVING
                    worst_grpc = max(worst_grpc, took)
                    tries += 1
                    next_probe = time.monotonic() + 0.3
                if not checked and tries >= 10:
                    r = subprocess.run([sluicectl, "check", "api", "api_key=slow-test", "--tcp",
                                        "--server", f"127.0.0.1:{port}"],
                                       capture_output=True, text=True, timeout=10)
                    print("TCP check under load:", r.stdout.strip())
                    assert r.returncode in (0, 1), (r.returncode, r.stdout, r.stderr)
                    checked = True
                time.sleep(BYTE_EVERY_S)
            print(f"/healthz: {tries} answers under {SLOW} slow connections on each of "
                  f"{len(slow)} listeners, slowest {worst * 1000:.1f} ms")
            print(f"gRPC health: {tries} answers, slowest {worst_grpc * 1000:.1f} ms")
            assert tries >= 20, tries
            assert checked
            assert worst < 0.100, f"/healthz took {worst * 1000:.1f} ms"
            assert worst_grpc < 0.100, f"the gRPC health check took {worst_grpc * 1000:.1f} ms"

            _, text, _ = get(base + "/metrics")
            http_closed = metric(text, "sluice_http_connections_closed_total")
            tcp_closed = metric(text, "sluice_tcp_connections_closed_total")
            print(f"closed by the server (seen by the clients, each reopened): {closed}; "
                  f"metrics: http {http_closed}, tcp {tcp_closed}")
            print("\n".join(l for l in text.splitlines()
                            if re.match(r"sluice_(http|tcp)_connections_(closed|open)", l)))
            # Over the caps (256 each, 300 sent): the oldest were shed for the newer ones, and the
            # header and frame deadlines (3 s) closed the rest.
            assert http_closed is not None and http_closed >= SLOW, http_closed
            assert tcp_closed is not None and tcp_closed >= SLOW, tcp_closed
            assert proc.poll() is None, "sluiced exited"
        finally:
            for c in conns:
                c[0].close()
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
            if sys.exc_info()[0] is not None:
                print(open(os.path.join(tmp, "sluiced.log")).read()[-3000:])


if __name__ == "__main__":
    main()
