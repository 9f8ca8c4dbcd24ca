"""The RESP door of a real sluiced called by redis-py (Debian's python3-redis, RESP2) with its
default settings: CL.THROTTLE single, pipelined and in MULTI/EXEC (pipeline()'s default), DEL,
AUTH, and SLUICE.CHECK against the rules. tests/interop/resp/run.sh starts sluiced and sets
SLUICE_RESP_PORT, SLUICE_RESP_AUTH_PORT and SLUICE_RESP_PASSWORD; every call has a socket timeout.
"""
import os

import pytest
import redis

PORT = int(os.environ["SLUICE_RESP_PORT"])
AUTH_PORT = int(os.environ["SLUICE_RESP_AUTH_PORT"])
PASSWORD = os.environ["SLUICE_RESP_PASSWORD"]

# redis-cell's README example: a fresh key, burst 15, 30 per 60 s.
FRESH = [0, 16, 15, -1, 2]


def client(port=PORT, **kw):
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=5, **kw)


def throttle(r, key):
    return r.execute_command("CL.THROTTLE", key, 15, 30, 60)


def test_ping_and_a_fresh_key_gets_redis_cells_five_integers():
    r = client()
    assert r.ping() is True
    assert throttle(r, "py-user123") == FRESH
    second = throttle(r, "py-user123")
    assert second[:4] == [0, 16, 14, -1]


def test_a_pipeline_without_transaction_is_answered_in_order():
    r = client()
    p = r.pipeline(transaction=False)
    for _ in range(5):
        throttle(p, "py-pipe")
    replies = p.execute()
    assert [x[2] for x in replies] == [15, 14, 13, 12, 11]
    assert all(x[:2] == [0, 16] and x[3] == -1 for x in replies)


def test_the_default_pipeline_is_multi_exec():
    r = client()
    p = r.pipeline()  # transaction=True: MULTI, the commands, EXEC
    throttle(p, "py-multi")
    throttle(p, "py-multi")
    p.ping()
    replies = p.execute()
    assert replies[0] == FRESH
    assert replies[1][:4] == [0, 16, 14, -1]
    assert replies[2] is True


def test_del_counts_the_keys_that_existed_and_the_key_starts_fresh():
    r = client()
    throttle(r, "py-del")
    throttle(r, "py-del")
    assert r.delete("py-del", "py-never-seen") == 1
    assert throttle(r, "py-del") == FRESH


def test_auth_noauth_before_wrong_password_fails_right_one_works():
    r = client(AUTH_PORT)
    assert r.ping() is True  # PING needs no password (health probes)
    with pytest.raises(redis.exceptions.AuthenticationError):
        r.echo("x")  # NOAUTH Authentication required.
    assert r.execute_command("AUTH", PASSWORD) is True
    assert r.ping() is True
    # Redis's own text; redis-py 4.3 maps only NOAUTH to AuthenticationError, as against Redis 7.
    with pytest.raises(redis.exceptions.ResponseError, match="^WRONGPASS "):
        client(AUTH_PORT, password="not-the-password").ping()
    authed = client(AUTH_PORT, password=PASSWORD)
    assert authed.ping() is True
    assert throttle(authed, "py-auth") == FRESH


def test_sluice_check_allows_up_to_the_rule_then_denies():
    r = client()
    got = [r.execute_command("SLUICE.CHECK", "api", "user", "py-ann") for _ in range(4)]
    # allowed, limit, remaining, retry_after_s, reset_s, shadow, would_deny
    assert [x[:3] for x in got] == [[1, 3, 2], [1, 3, 1], [1, 3, 0], [0, 3, 0]]
    assert got[3][3] > 0  # denied: a retry after
    assert all(len(x) == 7 and x[5:] == [0, 0] for x in got)
