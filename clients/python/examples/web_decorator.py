"""A decorator that rate-limits web handlers with Sluice: 429 with Retry-After when denied.

Framework-neutral: a handler takes a request and returns (status, headers, body); `key` picks the
descriptor entries from the request. Adapting it to Flask, Django or aiohttp means reading the
request and building the response their way; the check itself stays one line.

    client = sluice.Client(nodes=["127.0.0.1:7350"], fail_mode="open")

    @rate_limited(client, "api", key=lambda req: {"user": req.user})
    def get_orders(req):
        return 200, {}, b"..."
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, Mapping, Tuple

import sluice

Response = Tuple[int, Dict[str, str], bytes]


def rate_limited(client: sluice.Client, domain: str,
                 key: Callable[[object], Mapping[str, str]]) -> Callable:
    def wrap(handler: Callable[[object], Response]) -> Callable[[object], Response]:
        @functools.wraps(handler)
        def limited(request: object) -> Response:
            r = client.check(domain, entries=key(request))
            if not r.allowed:
                wait_s = max(1, (r.retry_after_ms + 999) // 1000) if r.retry_after_ms > 0 else 60
                return 429, {"Retry-After": str(wait_s)}, b"rate limited\n"
            status, headers, body = handler(request)
            if r.limits:  # the tightest limit as the RateLimit-* headers
                tight = min(r.limits, key=lambda lim: lim.remaining)
                headers = {**headers, "RateLimit-Limit": str(tight.limit),
                           "RateLimit-Remaining": str(tight.remaining),
                           "RateLimit-Reset": str((tight.reset_ms + 999) // 1000)}
            return status, headers, body
        return limited
    return wrap
