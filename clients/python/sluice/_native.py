"""ctypes declarations of libsluice's C API (lib/client/include/sluice/sluice.h).

Private to the package: the structs mirror the header field for field; a change there is a
change here (docs/client.md, "ABI"). sluice_result is declared in both versions: a library from
before leases (no sluice_release, version node SLUICE_0 only) accepts version-0 results only, so
the package uses `ResultV0` with it and offers no releases (result_type, has_leases).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

ABI_VERSION = 0
MAX_STRING_BYTES = 4096
MAX_ENTRIES = 64
MAX_BATCH = 65536
MAX_LIMITS = 8
MAX_NAME_BYTES = 96


class Options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("nodes", ctypes.POINTER(ctypes.c_char_p)),
        ("num_nodes", ctypes.c_size_t),
        ("transport", ctypes.c_int),
        ("fail_mode", ctypes.c_int),
        ("timeout_us", ctypes.c_uint32),
        ("attempts", ctypes.c_uint32),
        ("batch_window_us", ctypes.c_uint32),
        ("max_checks_per_request", ctypes.c_uint32),
        ("udp_answer_room_per_check", ctypes.c_uint32),
        ("backoff_min_ms", ctypes.c_uint32),
        ("backoff_max_ms", ctypes.c_uint32),
        ("connect_timeout_ms", ctypes.c_uint32),
    ]


class Entry(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("value", ctypes.c_char_p)]


class Check(ctypes.Structure):
    _fields_ = [
        ("domain", ctypes.c_char_p),
        ("entries", ctypes.POINTER(Entry)),
        ("num_entries", ctypes.c_size_t),
        ("hits", ctypes.c_int64),
    ]


class Limit(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * MAX_NAME_BYTES),
        ("limit", ctypes.c_uint64),
        ("window_ms", ctypes.c_int64),
        ("remaining", ctypes.c_uint64),
        ("reset_ms", ctypes.c_int64),
        ("retry_after_ms", ctypes.c_int64),
        ("mode", ctypes.c_int),
        ("exceeded", ctypes.c_int),
    ]


class ResultV0(ctypes.Structure):
    """sluice_result version 0: up to `limits`."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("status", ctypes.c_int),
        ("outcome", ctypes.c_int),
        ("allowed", ctypes.c_int),
        ("would_deny", ctypes.c_int),
        ("shadow", ctypes.c_int),
        ("allowlisted", ctypes.c_int),
        ("truncated", ctypes.c_int),
        ("num_limits", ctypes.c_uint32),
        ("limits", Limit * MAX_LIMITS),
    ]


class Result(ResultV0):
    """sluice_result version 1: `lease` appended (ctypes lays a subclass's fields after its
    base's, as the header does)."""

    _fields_ = [("lease", ctypes.c_uint64)]


class Stats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (name, ctypes.c_uint64)
        for name in ("checks", "requests", "retries", "answers", "dropped_answers",
                     "unavailable", "link_failures", "callback_exceptions")
    ]


# A callback's result has the library's own size (its struct_size says which version): declared
# as the smaller one, widened by `widest`.
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.POINTER(ResultV0), ctypes.c_void_p)


def has_leases(lib: ctypes.CDLL) -> bool:
    """The library has sluice_release and version-1 results (SLUICE_1)."""
    return hasattr(lib, "sluice_release")


def result_type(lib: ctypes.CDLL) -> type:
    """The newest sluice_result version the library accepts."""
    return Result if has_leases(lib) else ResultV0


def widest(ptr) -> ResultV0:
    """The result a callback's pointer points to, as the newest version its struct_size covers."""
    r = ptr.contents
    if r.struct_size >= ctypes.sizeof(Result):
        return ctypes.cast(ptr, ctypes.POINTER(Result)).contents
    return r


def _find_library() -> str:
    """SLUICE_LIBRARY, else what the system loader finds (ldconfig's cache), else the SONAME."""
    explicit = os.environ.get("SLUICE_LIBRARY")
    if explicit:
        return explicit
    return ctypes.util.find_library("sluice") or f"libsluice.so.{ABI_VERSION}"


def load(path: str | None = None) -> ctypes.CDLL:
    # Results are declared as POINTER(ResultV0), which takes a Result too (a subclass): the
    # struct_size inside says which version it is.
    lib = ctypes.CDLL(path or _find_library())
    lib.sluice_strerror.argtypes = [ctypes.c_int]
    lib.sluice_strerror.restype = ctypes.c_char_p
    lib.sluice_options_init.argtypes = [ctypes.POINTER(Options)]
    lib.sluice_options_init.restype = None
    lib.sluice_result_init.argtypes = [ctypes.POINTER(ResultV0)]
    lib.sluice_result_init.restype = None
    lib.sluice_client_create.argtypes = [ctypes.POINTER(Options), ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.c_char_p, ctypes.c_size_t]
    lib.sluice_client_create.restype = ctypes.c_int
    lib.sluice_client_destroy.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.sluice_client_destroy.restype = ctypes.c_int
    lib.sluice_check_one.argtypes = [ctypes.c_void_p, ctypes.POINTER(Check),
                                     ctypes.POINTER(ResultV0)]
    lib.sluice_check_one.restype = ctypes.c_int
    lib.sluice_check_batch.argtypes = [ctypes.c_void_p, ctypes.POINTER(Check), ctypes.c_size_t,
                                       ctypes.POINTER(ResultV0)]
    lib.sluice_check_batch.restype = ctypes.c_int
    lib.sluice_check_async.argtypes = [ctypes.c_void_p, ctypes.POINTER(Check), CALLBACK,
                                       ctypes.c_void_p]
    lib.sluice_check_async.restype = ctypes.c_int
    lib.sluice_client_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(Stats)]
    lib.sluice_client_stats.restype = ctypes.c_int
    if has_leases(lib):
        lib.sluice_release.argtypes = [ctypes.c_void_p, ctypes.POINTER(Check), ctypes.c_uint64]
        lib.sluice_release.restype = ctypes.c_int
    return lib
