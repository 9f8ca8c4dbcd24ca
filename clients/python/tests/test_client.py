"""The Python client (clients/python/sluice) against real sluiced processes."""

import asyncio
import os
import socket
import sys
import threading
import time

import pytest

import sluice
from conftest import LIMIT

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from web_decorator import rate_limited  # noqa: E402


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_check_allows_up_to_the_limit_then_denies(start_node, transport):
    node = start_node()
    with sluice.Client([node.addr], transport=transport, timeout=0.5) as c:
        for i in range(LIMIT + 2):
            r = c.check("t", user="alice")
            assert r.decided and r.status == 0 and r.error is None
            assert len(r.limits) == 1
            lim = r.limits[0]
            assert (lim.name, lim.limit, lim.window_ms, lim.mode) == ("per-user", LIMIT, 60000,
                                                                    "enforce")
            if i < LIMIT:
                assert r.allowed and bool(r) and lim.remaining == LIMIT - 1 - i
                assert not lim.exceeded
            else:
                assert not r.allowed and lim.exceeded and lim.remaining == 0
                assert r.retry_after_ms > 0
        assert c.check("t", user="bob").allowed  # a budget of its own
        assert c.check("t", entries={"user": "bob"}, hits=2).limits[0].remaining == 0
        s = c.stats()
        assert s.checks >= LIMIT + 4 and s.answers >= 1


def test_check_batch_one_result_per_check(start_node):
    node = start_node()
    with sluice.Client([node.addr], timeout=0.5) as c:
        rs = c.check_batch([("t", {"user": "carol"})] * 5 +
                           [("", {"user": "carol"}), ("nowhere", [("user", "carol")]),
                            ("t", {"user": "dave"}, 2)])
        assert len(rs) == 8
        assert sum(r.allowed for r in rs[:5]) == LIMIT
        assert all(r.status == 0 for r in rs[:5])
        assert isinstance(rs[5].error, sluice.EmptyDomain) and not rs[5].allowed
        assert rs[5].outcome == sluice.INVALID
        assert isinstance(rs[6].error, sluice.UnknownDomain) and rs[6].decided
        assert rs[7].allowed and rs[7].limits[0].remaining == LIMIT - 2
        assert c.check_batch([]) == []


def test_async_client_checks_through_the_callback(start_node):
    node = start_node()

    async def main():
        async with sluice.AsyncClient([node.addr], timeout=0.5) as c:
            rs = await asyncio.wait_for(
                asyncio.gather(*(c.check("t", user="erin") for _ in range(10))), 5)
            assert sum(r.allowed for r in rs) == LIMIT
            assert all(r.decided for r in rs)
            batch = await asyncio.wait_for(
                c.check_batch([("t", {"user": "fay"}), ("", {"user": "fay"})]), 5)
            assert batch[0].allowed and isinstance(batch[1].error, sluice.EmptyDomain)
            with pytest.raises(sluice.EmptyDomain):
                await c.check("", user="erin")
            with pytest.raises(sluice.UnknownDomain):
                await c.check("nowhere", user="erin")
            return threading.get_ident()

    assert asyncio.run(main()) == threading.get_ident()


def test_failover_to_the_second_node(start_node, dead_addr):
    node = start_node()
    for transport in ("udp", "tcp"):
        with sluice.Client([dead_addr, node.addr], transport=transport, fail_mode="closed",
                           timeout=0.5) as c:
            r = c.check("t", user=f"gina-{transport}")
            assert r.decided and r.allowed and r.limits[0].remaining == LIMIT - 1


@pytest.mark.parametrize("fail_mode,allowed", [("open", True), ("closed", False)])
def test_fail_mode_decides_when_no_node_answers(dead_addr, fail_mode, allowed):
    with sluice.Client([dead_addr], fail_mode=fail_mode, timeout=0.1) as c:
        start = time.monotonic()
        r = c.check("t", user="hank")
        assert time.monotonic() - start < 1.0
        assert r.outcome == sluice.UNAVAILABLE and not r.decided
        assert r.allowed is allowed and r.failed_open is allowed
        assert isinstance(r.error, sluice.Unavailable)
        assert r.limits == ()


def test_async_fail_open_when_no_node_answers(dead_addr):
    async def main():
        async with sluice.AsyncClient([dead_addr], fail_mode="open", timeout=0.1) as c:
            return await asyncio.wait_for(c.check("t", user="ivan"), 5)

    r = asyncio.run(main())
    assert r.failed_open and r.outcome == sluice.UNAVAILABLE


def test_bad_input_raises_the_status_exception(start_node):
    node = start_node()
    with pytest.raises(sluice.BadNode):
        sluice.Client(["nonsense"])
    with pytest.raises(sluice.BadNode, match="brackets"):
        sluice.Client(["::1:7350"])
    with pytest.raises(sluice.InvalidArgument, match="no nodes"):
        sluice.Client([])
    with pytest.raises(sluice.InvalidArgument):
        sluice.Client(node.addr)  # a string, not a list
    with pytest.raises(sluice.InvalidArgument):
        sluice.Client([node.addr], attempts=0)
    with pytest.raises(sluice.InvalidArgument):
        sluice.Client([node.addr], transport="carrier-pigeon")
    c = sluice.Client([node.addr], timeout=0.5)
    with pytest.raises(sluice.EmptyDomain):
        c.check("", user="judy")
    with pytest.raises(sluice.UnknownDomain):
        c.check("nowhere", user="judy")
    with pytest.raises(sluice.TooLarge):
        c.check("t", user="x" * 5000)
    with pytest.raises(sluice.EntryTooLong):
        c.check("t", user="x" * 300)
    with pytest.raises(sluice.NegativeHits):
        c.check("t", user="judy", hits=-1)
    with pytest.raises(sluice.HitsTooLarge):
        c.check("t", user="judy", hits=1 << 70)
    with pytest.raises(sluice.TooManyEntries):
        c.check("t", entries=[(f"k{i}", "v") for i in range(65)])
    with pytest.raises(sluice.EmptyEntryKey):
        c.check("t", entries={"": "v"})
    with pytest.raises(sluice.InvalidArgument, match="NUL"):
        c.check("t", user="a\0b")
    with pytest.raises(sluice.InvalidArgument):
        c.check("t", user=None)
    assert c.check("t", user="judy").allowed  # the client still works
    c.close()
    c.close()  # idempotent
    assert c.closed
    with pytest.raises(sluice.ClientClosed):
        c.check("t", user="judy")
    with pytest.raises(sluice.ClientClosed):
        c.check_batch([("t", {"user": "judy"})])
    assert issubclass(sluice.ClientClosed, sluice.SluiceError)
    assert sluice.error_for(5).status == 5 and "no node" in str(sluice.error_for(5))


def test_close_waits_for_checks_in_flight():
    # A node that takes datagrams and never answers: the check lasts its whole 0.5 s timeout.
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    c = sluice.Client([f"127.0.0.1:{silent.getsockname()[1]}"], timeout=0.5, fail_mode="closed")
    results = []
    t = threading.Thread(target=lambda: results.append(c.check("t", user="kim")))
    t.start()
    for _ in range(500):  # until the check is in flight (at most 5 s)
        if c._inflight == 1:
            break
        time.sleep(0.01)
    assert c._inflight == 1
    c.close()
    t.join(timeout=5)
    silent.close()
    assert not t.is_alive() and len(results) == 1 and not results[0].allowed
    assert results[0].outcome == sluice.UNAVAILABLE


def test_decorator_returns_429_with_retry_after(start_node):
    node = start_node()

    class Request:
        user = "lee"

    with sluice.Client([node.addr], timeout=0.5) as c:
        @rate_limited(c, "t", key=lambda req: {"user": req.user})
        def handler(req):
            return 200, {"Content-Type": "text/plain"}, b"hello\n"

        answers = [handler(Request()) for _ in range(LIMIT + 1)]
        assert [a[0] for a in answers] == [200] * LIMIT + [429]
        assert answers[0][1]["RateLimit-Remaining"] == str(LIMIT - 1)
        assert int(answers[-1][1]["Retry-After"]) >= 1
