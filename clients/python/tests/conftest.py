"""Fixtures: real sluiced processes on free loopback ports, with clients/testdata/rules.yaml.

Environment: SLUICED_BIN (the daemon), SLUICE_LIBRARY (libsluice.so; tests/CMakeLists.txt sets
both). Every wait is bounded; every sluiced is killed at the end of its test.
"""

import os
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sluice  # noqa: E402

LIMIT = 3
# Concurrency limits: in domain "c" at most IN_FLIGHT leases held per user, each held 30 s unless
# released; in domain "e" one, held SHORT_TTL seconds (the shortest lease_ttl there is).
IN_FLIGHT = 2
SHORT_TTL = 1.0
# The rules of every node (shared with the Go tests); LIMIT, IN_FLIGHT and SHORT_TTL are its.
RULES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testdata",
                          "rules.yaml")


def free_port() -> int:
    """A port free for TCP and UDP on 127.0.0.1 right now."""
    for _ in range(50):
        with socket.socket() as t:
            t.bind(("127.0.0.1", 0))
            port = t.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                try:
                    u.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise AssertionError("no free port")


class Node:
    def __init__(self, proc, addr, log):
        self.proc, self.addr, self.log = proc, addr, log


@pytest.fixture
def start_node(tmp_path):
    """start_node() -> Node: a sluiced answering checks on 127.0.0.1:<free port>."""
    sluiced = os.environ.get("SLUICED_BIN")
    assert sluiced and os.access(sluiced, os.X_OK), "SLUICED_BIN must name the sluiced binary"
    started = []

    def start():
        i = len(started)
        port = free_port()
        addr = f"127.0.0.1:{port}"
        log = tmp_path / f"sluiced-{i}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sluiced, "--udp", addr, "--tcp", addr, "--admin", "", "--grpc", "",
                 "--data-dir", "", "--rules", RULES_FILE, "--threads", "1", "--log-level", "warn"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        node = Node(proc, addr, log)
        started.append(node)
        with sluice.Client([addr], timeout=0.1, fail_mode="closed") as probe:
            for _ in range(100):  # 100 x (<= 0.1 s + 0.05 s)
                if probe.check("t", user="probe", hits=0).decided:
                    return node
                assert proc.poll() is None, f"sluiced exited:\n{log.read_text()}"
                time.sleep(0.05)
        raise AssertionError(f"sluiced did not answer within 10 s:\n{log.read_text()}")

    yield start
    for node in started:
        node.proc.kill()
        node.proc.wait(timeout=10)


@pytest.fixture
def dead_addr():
    """A loopback address where nothing listens (UDP: ICMP unreachable; TCP: refused)."""
    return f"127.0.0.1:{free_port()}"
