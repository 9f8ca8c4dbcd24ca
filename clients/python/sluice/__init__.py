"""Sluice's Python client: a thin ctypes layer over libsluice.so (the C API of sluice::Client).

Batching, failover, timeouts and the fail mode are libsluice's; this module converts arguments and
results and raises exceptions. Standard library only.

    import sluice
    client = sluice.Client(nodes=["127.0.0.1:7350"])
    r = client.check("api", user="42")
    if not r.allowed:
        return reply_429(r.retry_after_ms)

A concurrency limit's lease is given back when the `with` block ends (release() by hand):

    with client.acquire("jobs", tenant="t1") as r:
        if not r.allowed:
            return reply_429(r.retry_after_ms)
        run_job()

The library is found through $SLUICE_LIBRARY (a path), else the system loader (libsluice.so.0).
A Client is safe to share between threads; close() it (or use `with`) when done.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import threading
from dataclasses import dataclass
from typing import AsyncIterator, Dict, Iterable, Iterator, List, Mapping, Sequence, Tuple, Union

from . import _native

__all__ = [
    "Client", "AsyncClient", "Result", "Limit", "Stats", "CheckSpec",
    "SluiceError", "InvalidArgument", "NoMemory", "BadNode", "InCallback", "Unavailable",
    "Refused", "EmptyDomain", "UnknownDomain", "TooManyEntries", "EntryTooLong", "EmptyEntryKey",
    "DuplicateEntry", "HitsTooLarge", "NegativeHits", "NoRoom", "TooLarge", "ClientClosed",
    "LeaseError", "LeaseUnknown", "LeaseExpired", "LeaseReleased",
    "DECIDED", "REFUSED", "INVALID", "UNAVAILABLE",
]

# sluice_outcome
DECIDED, REFUSED, INVALID, UNAVAILABLE = 0, 1, 2, 3
_OUTCOME_NAMES = {DECIDED: "decided", REFUSED: "refused", INVALID: "invalid",
                  UNAVAILABLE: "unavailable"}
_MODE_NAMES = {0: "enforce", 1: "dry-run", 2: "shadow"}


# ---- errors: one class per sluice_status ------------------------------------------------------

class SluiceError(Exception):
    """A libsluice status other than SLUICE_OK. `status` is the C value."""

    status = -1

    def __init__(self, message: str | None = None, status: int | None = None):
        if status is not None:
            self.status = status
        super().__init__(message or _strerror(self.status))


class InvalidArgument(SluiceError, ValueError):
    status = 1


class NoMemory(SluiceError, MemoryError):
    status = 2


class BadNode(SluiceError, ValueError):
    status = 3


class InCallback(SluiceError):
    status = 4


class Unavailable(SluiceError):
    status = 5


class Refused(SluiceError):
    status = 6


class EmptyDomain(InvalidArgument):
    status = 7


class UnknownDomain(SluiceError):
    status = 8


class TooManyEntries(InvalidArgument):
    status = 9


class EntryTooLong(InvalidArgument):
    status = 10


class EmptyEntryKey(InvalidArgument):
    status = 11


class DuplicateEntry(InvalidArgument):
    status = 12


class HitsTooLarge(InvalidArgument):
    status = 13


class NegativeHits(InvalidArgument):
    status = 14


class NoRoom(SluiceError):
    status = 15


class TooLarge(InvalidArgument):
    status = 16


class ClientClosed(InvalidArgument):
    """A call on a Client after close()."""


class LeaseError(SluiceError):
    """release(): a node answered and nothing changed (a release is idempotent)."""


class LeaseUnknown(LeaseError):
    """No such lease for this domain and these entries: other entries, a mistyped or forged id, a
    node that restarted, rules changed since. Nothing to free: it expires on its own."""

    status = 17


class LeaseExpired(LeaseError):
    """Its lease_ttl was over: its slots were freed then."""

    status = 18


class LeaseReleased(LeaseError):
    """Released before (or by this call's own first attempt, whose answer was lost)."""

    status = 19


_ERRORS = {cls.status: cls for cls in (
    InvalidArgument, NoMemory, BadNode, InCallback, Unavailable, Refused, EmptyDomain,
    UnknownDomain, TooManyEntries, EntryTooLong, EmptyEntryKey, DuplicateEntry, HitsTooLarge,
    NegativeHits, NoRoom, TooLarge, LeaseUnknown, LeaseExpired, LeaseReleased)}

# release() errors after which the lease holds nothing (C++ ReleaseResult::gone()): acquire()'s
# release on exit takes them as done.
_GONE = (LeaseReleased, LeaseExpired)

# Statuses that are answers, not errors: the node decided, or the fail mode did (the result's
# `allowed` says which way). check() returns a Result for these and raises for every other one.
_ANSWERS = frozenset({0, Unavailable.status, Refused.status, NoRoom.status})

_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def _library() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _native.load()
        return _lib


def _strerror(status: int) -> str:
    try:
        return _library().sluice_strerror(status).decode()
    except OSError:
        return f"status {status}"


def error_for(status: int, message: str | None = None) -> SluiceError:
    """The exception for a sluice_status."""
    return _ERRORS.get(status, SluiceError)(message, status)


# ---- results ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Limit:
    """One limit that applied to a check (for RateLimit-* and Retry-After headers)."""

    name: str
    limit: int
    window_ms: int
    remaining: int
    reset_ms: int
    retry_after_ms: int  # -1: the cost never fits
    mode: str  # "enforce", "dry-run", "shadow"
    exceeded: bool


@dataclass(frozen=True)
class Result:
    status: int  # sluice_status; 0 = a node decided
    outcome: int  # DECIDED, REFUSED, INVALID, UNAVAILABLE
    allowed: bool
    would_deny: bool
    shadow: bool
    allowlisted: bool
    truncated: bool
    limits: Tuple[Limit, ...]
    # Granted by the check's concurrency limits when they admitted it; 0 = none (denied, no
    # concurrency limit, or no node decided). Give it back with release(), or it is held until
    # its lease_ttl is over.
    lease: int = 0

    @property
    def decided(self) -> bool:
        return self.outcome == DECIDED

    @property
    def failed_open(self) -> bool:
        """No node decided and the fail mode let it through: count these, alert on them."""
        return not self.decided and self.allowed

    @property
    def outcome_name(self) -> str:
        return _OUTCOME_NAMES.get(self.outcome, "unknown")

    @property
    def error(self) -> SluiceError | None:
        """The status as an exception, None when a node decided without a problem."""
        return None if self.status == 0 else error_for(self.status)

    @property
    def retry_after_ms(self) -> int:
        """The longest wait of the exceeded limits (0: none exceeded, -1: never fits)."""
        waits = [lim.retry_after_ms for lim in self.limits if lim.exceeded]
        if any(w < 0 for w in waits):
            return -1
        return max(waits, default=0)

    def __bool__(self) -> bool:
        return self.allowed


def _result(r: _native.ResultV0) -> Result:
    limits = tuple(
        Limit(name=lim.name.decode("utf-8", "replace"), limit=lim.limit, window_ms=lim.window_ms,
              remaining=lim.remaining, reset_ms=lim.reset_ms, retry_after_ms=lim.retry_after_ms,
              mode=_MODE_NAMES.get(lim.mode, "enforce"), exceeded=bool(lim.exceeded))
        for lim in r.limits[:r.num_limits])
    return Result(status=r.status, outcome=r.outcome, allowed=bool(r.allowed),
                  would_deny=bool(r.would_deny), shadow=bool(r.shadow),
                  allowlisted=bool(r.allowlisted), truncated=bool(r.truncated), limits=limits,
                  lease=getattr(r, "lease", 0))  # a version-0 result (an older library) has none


@dataclass(frozen=True)
class Stats:
    checks: int
    requests: int
    retries: int
    answers: int
    dropped_answers: int
    unavailable: int
    link_failures: int
    callback_exceptions: int


# ---- checks ----------------------------------------------------------------------------------

Entries = Union[Mapping[str, str], Iterable[Tuple[str, str]]]
# A check of a batch: (domain, entries) or (domain, entries, hits).
CheckSpec = Union[Tuple[str, Entries], Tuple[str, Entries, int]]


def _bytes(s: str | bytes, what: str) -> bytes:
    if isinstance(s, bytes):
        b = s
    elif isinstance(s, str):
        b = s.encode("utf-8")
    else:
        raise InvalidArgument(f"{what} must be str or bytes, not {type(s).__name__}")
    if b"\0" in b:
        raise InvalidArgument(f"{what} contains a NUL character")
    return b


class _Prepared:
    """A check as C structs, and the bytes objects its pointers point into (kept alive)."""

    __slots__ = ("check", "entries", "keep")

    def __init__(self, domain: str | bytes, entries: Entries, hits: int):
        pairs = list(entries.items()) if isinstance(entries, Mapping) else list(entries)
        if len(pairs) > _native.MAX_ENTRIES:
            raise TooManyEntries()
        if not isinstance(hits, int) or isinstance(hits, bool):
            raise InvalidArgument("hits must be an int")
        if not -(1 << 63) <= hits < (1 << 63):
            raise HitsTooLarge()
        d = _bytes(domain, "domain")
        self.keep = [d]
        self.entries = (_native.Entry * max(len(pairs), 1))()
        for i, pair in enumerate(pairs):
            try:
                k, v = pair
            except (TypeError, ValueError):
                raise InvalidArgument("an entry must be a (key, value) pair") from None
            kb, vb = _bytes(k, "entry key"), _bytes(str(v) if isinstance(v, int) else v, "entry value")
            self.keep += (kb, vb)
            self.entries[i].key = kb
            self.entries[i].value = vb
        self.check = _native.Check(d, self.entries, len(pairs), hits)


def _merge(entries: Entries | None, descriptors: Mapping[str, str]) -> List[Tuple[str, str]]:
    out = []
    if entries is not None:
        out += list(entries.items()) if isinstance(entries, Mapping) else list(entries)
    out += list(descriptors.items())
    return out


class Client:
    """A libsluice client: checks over UDP or TCP to `nodes`, with failover and a fail mode.

    Arguments mirror sluice_options (times in seconds): transport "udp" or "tcp", fail_mode
    "open" or "closed", timeout (a check's whole budget, default 0.02), attempts (2),
    batch_window (0), max_checks_per_request (64), udp_answer_room_per_check (288),
    connect_timeout (1.0). Raises BadNode or InvalidArgument when they are unusable.
    """

    def __init__(self, nodes: Sequence[str], *, transport: str = "udp", fail_mode: str = "open",
                 timeout: float = 0.02, attempts: int = 2, batch_window: float = 0.0,
                 max_checks_per_request: int = 64, udp_answer_room_per_check: int = 288,
                 connect_timeout: float = 1.0):
        self._lib = _library()
        if isinstance(nodes, (str, bytes)):
            raise InvalidArgument("nodes must be a list of 'host:port' strings")
        if transport not in ("udp", "tcp"):
            raise InvalidArgument("transport must be 'udp' or 'tcp'")
        if fail_mode not in ("open", "closed"):
            raise InvalidArgument("fail_mode must be 'open' or 'closed'")
        node_bytes = [_bytes(n, "node") for n in nodes]
        array = (ctypes.c_char_p * max(len(node_bytes), 1))(*node_bytes)
        o = _native.Options()
        self._lib.sluice_options_init(ctypes.byref(o))
        o.nodes = ctypes.cast(array, ctypes.POINTER(ctypes.c_char_p))
        o.num_nodes = len(node_bytes)
        o.transport = 1 if transport == "tcp" else 0
        o.fail_mode = 1 if fail_mode == "closed" else 0
        o.timeout_us = _micros(timeout, "timeout")
        o.attempts = _u32(attempts, "attempts")
        o.batch_window_us = _micros(batch_window, "batch_window")
        o.max_checks_per_request = _u32(max_checks_per_request, "max_checks_per_request")
        o.udp_answer_room_per_check = _u32(udp_answer_room_per_check, "udp_answer_room_per_check")
        o.connect_timeout_ms = _u32(round(connect_timeout * 1000), "connect_timeout")
        handle = ctypes.c_void_p()
        why = ctypes.create_string_buffer(512)
        st = self._lib.sluice_client_create(ctypes.byref(o), ctypes.byref(handle), why, len(why))
        if st != 0:
            raise error_for(st, why.value.decode("utf-8", "replace"))
        self._handle = handle
        self._result_type = _native.result_type(self._lib)
        # Guards _handle and _inflight: close() waits for calls in flight (each ends within its
        # timeout) before it destroys the C client under them.
        self._cv = threading.Condition()
        self._inflight = 0
        self._closed = False

    # Context manager and explicit close.
    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def close(self) -> None:
        """Ends pending async checks (as unavailable) and frees the client. Idempotent."""
        cv = getattr(self, "_cv", None)
        if cv is None:
            return
        with cv:
            if self._closed:
                return
            self._closed = True
            cv.wait_for(lambda: self._inflight == 0, timeout=30)
            handle, self._handle = self._handle, ctypes.c_void_p()
        st = self._lib.sluice_client_destroy(ctypes.byref(handle))
        if st != 0:
            raise error_for(st)

    @property
    def closed(self) -> bool:
        return self._closed

    def _enter(self) -> ctypes.c_void_p:
        with self._cv:
            if self._closed:
                raise ClientClosed("the client is closed")
            self._inflight += 1
            return self._handle

    def _leave(self) -> None:
        with self._cv:
            self._inflight -= 1
            if self._inflight == 0:
                self._cv.notify_all()

    def check(self, domain: str, /, *, hits: int = 1, entries: Entries | None = None,
              **descriptors: str) -> Result:
        """Blocking check: `client.check("api", user="42")`. Keys that are not Python names go in
        `entries` ({"api-key": "..."}). Returns a Result when a node or the fail mode decided;
        raises the status's exception for a bad check (EmptyDomain, UnknownDomain, ...)."""
        return self._check(_Prepared(domain, _merge(entries, descriptors), hits))

    def _check(self, p: _Prepared) -> Result:
        r = self._result_type()
        r.struct_size = ctypes.sizeof(r)
        handle = self._enter()
        try:
            st = self._lib.sluice_check_one(handle, ctypes.byref(p.check), ctypes.byref(r))
        finally:
            self._leave()
        if st not in _ANSWERS:
            raise error_for(st)
        return _result(r)

    def release(self, domain: str, lease: int, /, *, entries: Entries | None = None,
                **descriptors: str) -> None:
        """Gives back `lease` (a Result's), blocking like check(): `client.release("jobs",
        r.lease, tenant="t1")`. The domain and entries must be those of the check that was
        granted it. Returns when the lease's slots were freed.

        Raises LeaseReleased, LeaseExpired or LeaseUnknown (all LeaseError) when a node answered
        and nothing changed (a release is idempotent); Unavailable or Refused when no node
        decided (the lease is held until its lease_ttl is over: retry, or let it expire);
        InvalidArgument for lease 0; a check's errors as check() (UnknownDomain, ...)."""
        self._release(_Prepared(domain, _merge(entries, descriptors), 0), lease)

    def _release(self, p: _Prepared, lease: int) -> None:
        if not isinstance(lease, int) or isinstance(lease, bool) or not 0 <= lease < (1 << 64):
            raise InvalidArgument("lease must be an int in 1 .. 2**64 - 1 (a Result's lease)")
        if lease == 0:
            raise InvalidArgument("lease 0: nothing was granted, nothing to release")
        if not _native.has_leases(self._lib):
            raise SluiceError("this libsluice predates leases (no sluice_release)")
        handle = self._enter()
        try:
            # The check's hits are ignored (sluice_release): acquire() passes its own check.
            st = self._lib.sluice_release(handle, ctypes.byref(p.check), lease)
        finally:
            self._leave()
        if st != 0:
            raise error_for(st)

    @contextlib.contextmanager
    def acquire(self, domain: str, /, *, hits: int = 1, entries: Entries | None = None,
                **descriptors: str) -> Iterator[Result]:
        """check() for the length of a `with` block, whose end releases the lease it was granted:

            with client.acquire("jobs", tenant="t1") as r:
                if not r.allowed:
                    return reply_429(r.retry_after_ms)
                run_job()

        Yields the Result whatever it says: a denied check (or one no node decided, or one no
        concurrency limit applied to) holds no lease and releases nothing on exit. A bad check
        raises on entry, as check() does.

        The release on exit blocks like release(). After the block ended normally, a failed
        release raises its error (Unavailable, LeaseUnknown, ...: the lease is then held until
        its lease_ttl is over); LeaseReleased (the block released r.lease itself) and
        LeaseExpired (the block outlasted lease_ttl) are taken as done. After the block raised,
        the block's exception goes on and a failed release only adds a note to it."""
        p = _Prepared(domain, _merge(entries, descriptors), hits)
        r = self._check(p)
        if not r.lease:
            yield r
            return
        try:
            yield r
        except BaseException as body:
            self._release_held(p, r.lease, body)
            raise
        self._release_held(p, r.lease)

    def _release_held(self, p: _Prepared, lease: int, body: BaseException | None = None) -> None:
        """acquire()'s release on exit: LeaseReleased and LeaseExpired are done; another failure
        raises, or, when the block raised `body`, is only noted on it."""
        try:
            self._release(p, lease)
        except _GONE:
            pass
        except SluiceError as e:
            if body is None:
                raise
            if hasattr(body, "add_note"):  # Python 3.11
                body.add_note(f"sluice: lease {lease} was not released ({e}): it is held until "
                              "its lease_ttl is over")

    def check_batch(self, checks: Sequence[CheckSpec]) -> List[Result]:
        """Several checks sharing requests: [(domain, entries) or (domain, entries, hits)].
        Returns one Result per check, in order; never raises for one check's problem (see each
        Result's status and error)."""
        prepared = [_Prepared(c[0], c[1], c[2] if len(c) > 2 else 1) for c in checks]
        n = len(prepared)
        if n == 0:
            return []
        if n > _native.MAX_BATCH:
            raise InvalidArgument(f"at most {_native.MAX_BATCH} checks per batch")
        cs = (_native.Check * n)(*(p.check for p in prepared))
        rs = (self._result_type * n)()
        for r in rs:
            r.struct_size = ctypes.sizeof(self._result_type)
        handle = self._enter()
        try:
            st = self._lib.sluice_check_batch(handle, cs, n, rs)
        finally:
            self._leave()
        if st != 0:
            raise error_for(st)
        return [_result(r) for r in rs]

    def stats(self) -> Stats:
        s = _native.Stats()
        s.struct_size = ctypes.sizeof(s)
        handle = self._enter()
        try:
            st = self._lib.sluice_client_stats(handle, ctypes.byref(s))
        finally:
            self._leave()
        if st != 0:
            raise error_for(st)
        return Stats(*(getattr(s, f) for f, _ in _native.Stats._fields_[1:]))

    # For AsyncClient: queue a check whose result goes to `done(Result)` on the I/O thread.
    def _submit(self, p: _Prepared, callback, token: int) -> int:
        handle = self._enter()
        try:
            return self._lib.sluice_check_async(handle, ctypes.byref(p.check), callback,
                                                ctypes.c_void_p(token))
        finally:
            self._leave()


def _micros(seconds: float, what: str) -> int:
    us = round(seconds * 1_000_000)
    return _u32(us, what)


def _u32(v: int, what: str) -> int:
    if not isinstance(v, int) or not 0 <= v < (1 << 32):
        raise InvalidArgument(f"{what} out of range")
    return v


class AsyncClient:
    """The asyncio form: `r = await client.check("api", user="42")`.

    Uses libsluice's async check: the result comes on libsluice's I/O thread, which hands it to
    the awaiting loop with call_soon_threadsafe; no thread of Python's executor is used by
    checks. Releases (release, acquire) do use one: see release. Takes the same arguments as
    Client.
    """

    def __init__(self, nodes: Sequence[str], **options):
        self._client = Client(nodes, **options)
        # token -> (loop, future, the check: to release a lease granted after the await ended);
        # guarded by _lock
        self._pending: Dict[int, Tuple[asyncio.AbstractEventLoop, asyncio.Future, _Prepared]] = {}
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        # One C callback for the client's life (ctypes must keep it alive while C may call it).
        self._callback = _native.CALLBACK(self._on_result)

    def _on_result(self, result_ptr, token) -> None:  # on libsluice's I/O thread
        with self._lock:
            entry = self._pending.pop(token or 0, None)
        if entry is None:
            return
        loop, fut, p = entry
        r = _result(_native.widest(result_ptr))
        try:
            loop.call_soon_threadsafe(self._settle, fut, r, p)
        except RuntimeError:  # the loop is closed: nobody awaits the result any more (a lease
            pass              # granted to it is held until its lease_ttl is over)

    def _settle(self, fut: asyncio.Future, r: Result, p: _Prepared) -> None:  # on the loop
        if not fut.done():
            fut.set_result(r)
        elif r.lease:
            # The await was cancelled (a timeout) before the answer came, and the answer granted
            # a lease that nobody else knows of: give it back rather than hold it for lease_ttl.
            try:
                fut.get_loop().run_in_executor(None, self._release_quietly, p, r.lease)
            except RuntimeError:  # the loop is shutting its executor down: it expires
                pass

    def _release_quietly(self, p: _Prepared, lease: int) -> None:
        try:
            self._client._release(p, lease)
        except SluiceError:
            pass  # not released (no node decided, closed): it expires after its lease_ttl

    async def check(self, domain: str, /, *, hits: int = 1, entries: Entries | None = None,
                    **descriptors: str) -> Result:
        """As Client.check. When the await is cancelled (asyncio.wait_for's timeout) and the
        check is granted a lease after all, the lease is released in the background."""
        return await self._check(_Prepared(domain, _merge(entries, descriptors), hits))

    async def _check(self, p: _Prepared) -> Result:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        token = next(self._tokens)
        with self._lock:
            self._pending[token] = (loop, fut, p)
        st = self._client._submit(p, self._callback, token)
        if st != 0:
            with self._lock:
                self._pending.pop(token, None)
            raise error_for(st)
        r = await fut
        if r.status not in _ANSWERS:
            raise error_for(r.status)
        return r

    async def release(self, domain: str, lease: int, /, *, entries: Entries | None = None,
                      **descriptors: str) -> None:
        """As Client.release. libsluice has no asynchronous release (sluice_release blocks, for
        up to the client's timeout), so it runs in the loop's default executor, holding one of
        its threads for that long. Cancelling the await does not cancel the release."""
        p = _Prepared(domain, _merge(entries, descriptors), 0)
        await asyncio.get_running_loop().run_in_executor(None, self._client._release, p, lease)

    @contextlib.asynccontextmanager
    async def acquire(self, domain: str, /, *, hits: int = 1, entries: Entries | None = None,
                      **descriptors: str) -> AsyncIterator[Result]:
        """As Client.acquire: `async with client.acquire("jobs", tenant="t1") as r:`. The
        release on exit runs in the default executor (release); a cancelled block
        (CancelledError) is released too."""
        p = _Prepared(domain, _merge(entries, descriptors), hits)
        r = await self._check(p)
        if not r.lease:
            yield r
            return
        loop = asyncio.get_running_loop()
        try:
            yield r
        except BaseException as body:
            await loop.run_in_executor(None, self._client._release_held, p, r.lease, body)
            raise
        await loop.run_in_executor(None, self._client._release_held, p, r.lease)

    async def check_batch(self, checks: Sequence[CheckSpec]) -> List[Result]:
        """Concurrent async checks: they share requests inside libsluice like a batch does."""
        return list(await asyncio.gather(
            *(self._check_spec(c) for c in checks)))

    async def _check_spec(self, c: CheckSpec) -> Result:
        try:
            p = _Prepared(c[0], c[1], c[2] if len(c) > 2 else 1)
        except SluiceError as e:
            return Result(e.status, INVALID, False, False, False, False, False, ())
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        token = next(self._tokens)
        with self._lock:
            self._pending[token] = (loop, fut, p)
        st = self._client._submit(p, self._callback, token)
        if st != 0:
            with self._lock:
                self._pending.pop(token, None)
            return Result(st, INVALID, False, False, False, False, False, ())
        return await fut

    def stats(self) -> Stats:
        return self._client.stats()

    def close(self) -> None:
        """Pending checks complete as unavailable (with the fail mode) before this returns."""
        self._client.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()
