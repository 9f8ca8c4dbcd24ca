"""Concurrency limits' leases through the Python client, against real sluiced processes."""

import asyncio
import socket
import threading
import time

import pytest

import sluice
from conftest import IN_FLIGHT, SHORT_TTL


def free_slots(c, domain, user):
    """The slots of `user` free now, asked with a check of 0 hits (which takes no lease)."""
    r = c.check(domain, user=user, hits=0)
    assert r.decided and r.lease == 0 and len(r.limits) == 1
    return r.limits[0].remaining


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_leases_up_to_max_in_flight_then_release_frees_one(start_node, transport):
    node = start_node()
    with sluice.Client([node.addr], transport=transport, timeout=0.5, fail_mode="closed") as c:
        held = []
        for i in range(IN_FLIGHT):
            r = c.check("c", user="alice")
            assert r.decided and r.allowed and r.lease != 0
            lim = r.limits[0]
            assert (lim.name, lim.limit, lim.window_ms) == ("in-flight", IN_FLIGHT, 30000)
            assert lim.remaining == IN_FLIGHT - 1 - i
            held.append(r.lease)
        assert held[0] != held[1]
        denied = c.check("c", user="alice")
        assert denied.decided and not denied.allowed and denied.lease == 0
        assert denied.limits[0].exceeded and denied.limits[0].remaining == 0

        assert c.release("c", held[0], user="alice") is None
        assert free_slots(c, "c", "alice") == 1
        with pytest.raises(sluice.LeaseReleased) as e:
            c.release("c", held[0], entries={"user": "alice"})
        assert e.value.status == 19 and isinstance(e.value, sluice.LeaseError)
        assert free_slots(c, "c", "alice") == 1  # the second release changed nothing

        again = c.check("c", user="alice")  # the freed slot
        assert again.allowed and again.lease not in (0, held[0], held[1])
        assert not c.check("c", user="alice").allowed

        # Another user's entries, a forged id (its expiry half kept): unknown, nothing changes.
        with pytest.raises(sluice.LeaseUnknown) as e:
            c.release("c", held[1], user="bob")
        assert e.value.status == 17
        with pytest.raises(sluice.LeaseUnknown):
            c.release("c", held[1] ^ 0x5A5A5A5A, user="alice")
        with pytest.raises(sluice.LeaseExpired) as e:  # an expiry time in 1970
            c.release("c", 0xFF, user="alice")
        assert e.value.status == 18
        assert free_slots(c, "c", "alice") == 0

        c.release("c", held[1], entries=[("user", "alice")])
        c.release("c", again.lease, user="alice")
        assert free_slots(c, "c", "alice") == IN_FLIGHT


def test_release_rejects_bad_arguments(start_node):
    node = start_node()
    c = sluice.Client([node.addr], timeout=0.5)
    with pytest.raises(sluice.InvalidArgument, match="lease 0"):
        c.release("c", 0, user="alice")
    for bad in (-1, 1 << 64, True, "1", None):
        with pytest.raises(sluice.InvalidArgument):
            c.release("c", bad, user="alice")
    with pytest.raises(sluice.EmptyDomain):
        c.release("", 1, user="alice")
    with pytest.raises(sluice.UnknownDomain):
        c.release("nowhere", 1, user="alice")
    with pytest.raises(sluice.InvalidArgument, match="NUL"):
        c.release("c", 1, user="a\0b")
    assert sluice.error_for(17).__class__ is sluice.LeaseUnknown
    assert sluice.error_for(18).__class__ is sluice.LeaseExpired
    assert sluice.error_for(19).__class__ is sluice.LeaseReleased
    assert "unknown status" not in str(sluice.error_for(18))
    c.close()
    with pytest.raises(sluice.ClientClosed):
        c.release("c", 1, user="alice")


def test_a_result_without_a_concurrency_limit_has_no_lease(start_node):
    node = start_node()
    with sluice.Client([node.addr], timeout=0.5) as c:
        r = c.check("t", user="carl")
        assert r.allowed and r.lease == 0
        assert all(x.lease == 0 for x in c.check_batch([("t", {"user": "carl"})]))
        rs = c.check_batch([("c", {"user": "carl"})] * 3)
        assert [x.allowed for x in rs].count(True) == IN_FLIGHT
        assert sorted(bool(x.lease) for x in rs) == [False, True, True]
        for x in rs:
            if x.lease:
                c.release("c", x.lease, user="carl")
        assert free_slots(c, "c", "carl") == IN_FLIGHT


def test_acquire_releases_on_exit(start_node):
    node = start_node()
    with sluice.Client([node.addr], timeout=0.5) as c:
        with c.acquire("c", user="dora") as r1:
            assert r1.allowed and r1.lease != 0
            with c.acquire("c", entries={"user": "dora"}) as r2:
                assert r2.allowed and r2.lease not in (0, r1.lease)
                with c.acquire("c", user="dora") as r3:  # denied: yielded, holds nothing
                    assert r3.decided and not r3.allowed and r3.lease == 0
                assert free_slots(c, "c", "dora") == 0
            assert free_slots(c, "c", "dora") == 1
        assert free_slots(c, "c", "dora") == IN_FLIGHT

        # A block that released its lease itself: the release on exit answers "released",
        # which is taken as done.
        with c.acquire("c", user="dora") as r:
            c.release("c", r.lease, user="dora")
        assert free_slots(c, "c", "dora") == IN_FLIGHT

        with pytest.raises(sluice.UnknownDomain):  # a bad check raises on entry
            with c.acquire("nowhere", user="dora"):
                raise AssertionError("not reached")


def test_acquire_releases_when_the_body_raises(start_node):
    node = start_node()
    with sluice.Client([node.addr], timeout=0.5) as c:
        with pytest.raises(KeyError, match="boom"):
            with c.acquire("c", user="emil") as r:
                assert r.lease != 0 and free_slots(c, "c", "emil") == IN_FLIGHT - 1
                raise KeyError("boom")
        assert free_slots(c, "c", "emil") == IN_FLIGHT
        with pytest.raises(sluice.LeaseReleased):  # it was released on the way out
            c.release("c", r.lease, user="emil")


def test_acquire_release_failure_does_not_mask_the_body_exception(start_node):
    node = start_node()
    with sluice.Client([node.addr], timeout=0.2, fail_mode="open") as c:
        with pytest.raises(ValueError, match="the body's") as e:
            with c.acquire("c", user="fritz") as r:
                assert r.lease != 0
                node.proc.kill()  # the release on exit finds no node
                node.proc.wait(timeout=10)
                raise ValueError("the body's")
        notes = getattr(e.value, "__notes__", [])
        assert any("not released" in n and str(r.lease) in n for n in notes), notes

        # After a block that ended normally, the failed release is the exception. (The check
        # itself fails open: no lease, nothing to release; so this one asks a dead node too.)
        r = c.check("c", user="fritz")
        assert r.failed_open and r.lease == 0
        with c.acquire("c", user="fritz") as r:
            assert r.failed_open and r.lease == 0  # and exit releases nothing: no error
        with pytest.raises(sluice.Unavailable):
            c.release("c", 1 << 40, user="fritz")


def test_acquire_raises_the_release_failure_after_a_normal_exit(start_node):
    node = start_node()
    with sluice.Client([node.addr], timeout=0.2) as c:
        with pytest.raises(sluice.Unavailable):
            with c.acquire("c", user="gus") as r:
                assert r.allowed and r.lease != 0
                node.proc.kill()
                node.proc.wait(timeout=10)


def test_an_unreleased_lease_expires_after_lease_ttl(start_node):
    node = start_node()
    with sluice.Client([node.addr], timeout=0.5) as c:
        start = time.monotonic()
        r = c.check("e", user="hugo")
        assert r.allowed and r.lease != 0 and r.limits[0].window_ms == int(SHORT_TTL * 1000)
        assert not c.check("e", user="hugo").allowed
        freed = None
        while time.monotonic() - start < SHORT_TTL + 3:  # held at most lease_ttl + granularity
            if free_slots(c, "e", "hugo") == 1:
                freed = time.monotonic() - start
                break
            time.sleep(0.02)
        assert freed is not None, "the lease was not freed within lease_ttl + 3 s"
        assert freed >= SHORT_TTL - 0.05, f"freed after {freed:.3f} s, before its lease_ttl"
        with pytest.raises(sluice.LeaseExpired):
            c.release("e", r.lease, user="hugo")
        assert c.check("e", user="hugo").allowed


def test_async_release_and_acquire(start_node):
    node = start_node()

    async def main():
        c = sluice.Client([node.addr], timeout=0.5)  # to look at the slots
        async with sluice.AsyncClient([node.addr], timeout=0.5) as ac:
            async with ac.acquire("c", user="ines") as r1:
                async with ac.acquire("c", user="ines") as r2:
                    assert r1.lease and r2.lease and r1.lease != r2.lease
                    async with ac.acquire("c", user="ines") as r3:
                        assert not r3.allowed and r3.lease == 0
                    assert free_slots(c, "c", "ines") == 0
            assert free_slots(c, "c", "ines") == IN_FLIGHT

            with pytest.raises(RuntimeError, match="async boom"):
                async with ac.acquire("c", user="ines") as r:
                    assert r.lease and free_slots(c, "c", "ines") == IN_FLIGHT - 1
                    raise RuntimeError("async boom")
            assert free_slots(c, "c", "ines") == IN_FLIGHT

            r = await ac.check("c", user="ines")
            assert r.lease != 0
            assert await asyncio.wait_for(ac.release("c", r.lease, user="ines"), 5) is None
            with pytest.raises(sluice.LeaseReleased):
                await asyncio.wait_for(ac.release("c", r.lease, user="ines"), 5)
            with pytest.raises(sluice.InvalidArgument):
                await ac.release("c", 0, user="ines")
            assert free_slots(c, "c", "ines") == IN_FLIGHT

    asyncio.run(main())


class DelayingRelay:
    """A UDP relay to `node` that passes checks on at once and holds each answer `delay` s."""

    def __init__(self, node_addr, delay):
        host, port = node_addr.rsplit(":", 1)
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.front.settimeout(0.05)
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.connect((host, int(port)))
        self.back.settimeout(0.05)
        self.addr = "127.0.0.1:%d" % self.front.getsockname()[1]
        self.delay, self.client, self.stop = delay, None, threading.Event()
        self.threads = [threading.Thread(target=self._forward),
                        threading.Thread(target=self._answer)]
        for t in self.threads:
            t.start()

    def _forward(self):
        while not self.stop.is_set():
            try:
                data, self.client = self.front.recvfrom(65536)
            except socket.timeout:
                continue
            self.back.send(data)

    def _answer(self):
        while not self.stop.is_set():
            try:
                data = self.back.recv(65536)
            except (socket.timeout, ConnectionRefusedError):
                continue
            time.sleep(self.delay)
            self.front.sendto(data, self.client)

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)
        self.front.close()
        self.back.close()


def test_async_check_cancelled_before_its_answer_releases_the_granted_lease(start_node):
    node = start_node()
    relay = DelayingRelay(node.addr, delay=0.5)

    async def main():
        # One attempt: a retry would be granted a second lease.
        c = sluice.Client([node.addr], timeout=0.5)  # to look at the slots, past the relay
        async with sluice.AsyncClient([relay.addr], timeout=2.0, attempts=1) as ac:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ac.check("c", user="jan"), 0.05)
            # The node granted the lease; its answer is still in the relay.
            assert free_slots(c, "c", "jan") == IN_FLIGHT - 1
            start = time.monotonic()
            while time.monotonic() - start < 5:  # answer in 0.5 s, the release's in 0.5 more
                if free_slots(c, "c", "jan") == IN_FLIGHT:
                    return True
                await asyncio.sleep(0.02)
            return False

    try:
        assert asyncio.run(main()), "the late lease was not released (held for its 30 s)"
    finally:
        relay.close()


def test_a_library_without_leases_gets_version_0_results(start_node, monkeypatch):
    # A libsluice from before leases has no sluice_release and accepts version-0 results only;
    # the package then sends version-0 results (which this library accepts too) and has no
    # release.
    node = start_node()
    monkeypatch.setattr(sluice._native, "has_leases", lambda lib: False)
    with sluice.Client([node.addr], timeout=0.5) as c:
        assert c._result_type is sluice._native.ResultV0
        r = c.check("t", user="kai")
        assert r.allowed and r.lease == 0 and r.limits[0].remaining == 2
        rs = c.check_batch([("t", {"user": "kai"}), ("nowhere", {"user": "kai"})])
        assert rs[0].allowed and rs[0].limits[0].remaining == 1 and rs[0].lease == 0
        assert isinstance(rs[1].error, sluice.UnknownDomain)
        with pytest.raises(sluice.SluiceError, match="predates leases"):
            c.release("c", 1, user="kai")
