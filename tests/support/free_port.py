"""Loopback ports for a test's own servers, the way tests/support/free_port.h draws them.

A port is drawn at random from the 15,000 ports below the kernel's ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range) and kept when both TCP and UDP can bind it, so no client
socket on the host (another program's bind to port 0, a resolver's query, a TCP connect) can be
handed it between the probe and the server's bind. Ports that one process got are never handed
out again by it.

As a module: free_ports(n). As a program (for shell scripts): `python3 free_port.py N` prints N
ports on one line.
"""

import random
import socket
import sys

_given = set()
_rng = random.Random()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
            return low if low > 2048 else 32768
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(kind, port):
    with socket.socket(socket.AF_INET, kind) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port():
    high = _ephemeral_low()
    low = high - 15000 if high > 16025 else 1025
    for _ in range(200):
        port = _rng.randrange(low, high)
        if port in _given:
            continue
        if _bindable(socket.SOCK_STREAM, port) and _bindable(socket.SOCK_DGRAM, port):
            _given.add(port)
            return port
    raise RuntimeError("no free loopback port below the ephemeral range after 200 draws")


def free_ports(n):
    return [free_port() for _ in range(n)]


if __name__ == "__main__":
    print(*free_ports(int(sys.argv[1]) if len(sys.argv) > 1 else 1))
