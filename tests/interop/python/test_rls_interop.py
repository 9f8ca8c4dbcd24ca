"""Interop test: sluiced's gRPC front (Envoy's RLS v3 ShouldRateLimit and grpc.health.v1.Health)
called by grpcio, the gRPC implementation Python services use.

Messages come from the committed protos at test time: Debian's protoc writes a descriptor set of
lib/rls/proto (and tests/interop/health.proto) into a temporary directory, protobuf's runtime builds
the message classes from it, and grpcio calls the methods generically (channel.unary_unary). No
generated code is committed or needed: Debian 12's grpc_tools (1.14) is far older than its grpcio
(1.51), and this way the descriptors and the runtime come from the same protobuf release.

    SLUICED_BIN=build/daemon/sluiced /usr/bin/python3 -m pytest tests/interop/python
    (tests/interop/run.sh python does this)

Environment: SLUICED_BIN (required), SLUICE_SOURCE_DIR (default: this file's repository),
SLUICE_INTEROP_PIDFILE (optional: where to write sluiced's pid, so run.sh can stop it even when
this process is killed). A real sluiced runs on free loopback ports; every call has a timeout and
every wait is bounded.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

try:
    import grpc
    from google.protobuf import descriptor_pb2, message_factory
except ImportError as e:  # a collection error, never a skip
    raise ImportError(
        "the RLS interop test needs Debian's python3-grpcio and python3-protobuf, run with "
        f"/usr/bin/python3 (deploy/setup.sh installs them): {e}"
    ) from e

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../../support"))
from free_port import free_ports  # noqa: E402  (tests/support, below the ephemeral range)

SOURCE_DIR = os.environ.get("SLUICE_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "../../.."))
PROTO_DIR = os.path.join(SOURCE_DIR, "lib/rls/proto")
HEALTH_PROTO = os.path.join(SOURCE_DIR, "tests/interop/health.proto")

LIMIT = 5  # per-user: 5 per minute
TEAM_LIMIT = 100  # per-team: 100 per hour
RLS_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HEALTH_PATH = "/grpc.health.v1.Health/Check"

# 1-second buckets keep a 1-minute window exact over a test that lasts seconds: with the default
# one-minute bucket, checks straddling a minute boundary would see the weighted estimate of the
# previous minute (docs/rules.md, "Estimators") and limit_remaining would not step by one.
RULES = f"""domains:
  - name: interop
    rules:
      - name: per-user
        key: [user]
        limits:
          - {{limit: {LIMIT}, window: 1m, name: per-user, granularity: 1s}}
      - name: per-team
        key: [team]
        limits:
          - {{limit: {TEAM_LIMIT}, window: 1h, name: per-team}}
"""


def build_messages(tmp):
    """The message classes of rls.proto and health.proto, by full name."""
    protoc = shutil.which("protoc")
    assert protoc, "protoc not found (Debian's protobuf-compiler; deploy/setup.sh installs it)"
    out = os.path.join(tmp, "protos.desc")
    subprocess.run(
        [protoc, "--include_imports", f"--descriptor_set_out={out}",
         f"-I{PROTO_DIR}", f"-I{os.path.dirname(HEALTH_PROTO)}", "-I/usr/include",
         "envoy/service/ratelimit/v3/rls.proto", os.path.basename(HEALTH_PROTO)],
        check=True, timeout=30)
    fds = descriptor_pb2.FileDescriptorSet()
    with open(out, "rb") as f:
        fds.ParseFromString(f.read())
    return message_factory.GetMessages(list(fds.file))


class Sluiced:
    """A sluiced on a free loopback gRPC port, its RLS and health methods, and its log."""

    def __init__(self, tmp, messages):
        self.tmp = tmp
        self.m = messages
        self.Request = messages["envoy.service.ratelimit.v3.RateLimitRequest"]
        self.Response = messages["envoy.service.ratelimit.v3.RateLimitResponse"]
        self.Descriptor = messages["envoy.extensions.common.ratelimit.v3.RateLimitDescriptor"]
        self.HealthRequest = messages["grpc.health.v1.HealthCheckRequest"]
        self.HealthResponse = messages["grpc.health.v1.HealthCheckResponse"]
        self.log_path = os.path.join(tmp, "sluiced.log")
        self.proc = None
        self.channel = None

    def start(self, sluiced_bin):
        rules = os.path.join(self.tmp, "rules.yaml")
        with open(rules, "w") as f:
            f.write(RULES)
        (self.port,) = free_ports(1)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sluiced_bin, "--udp", "", "--tcp", "", "--admin", "", "--resp", "",
                 "--grpc", f"127.0.0.1:{self.port}", "--data-dir", "", "--rules", rules,
                 "--threads", "1", "--log-level", "warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        pidfile = os.environ.get("SLUICE_INTEROP_PIDFILE")
        if pidfile:
            with open(pidfile, "w") as f:
                f.write(f"{self.proc.pid}\n")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.should_rate_limit_call = self.channel.unary_unary(
            RLS_PATH, request_serializer=self.Request.SerializeToString,
            response_deserializer=self.Response.FromString)
        self.health_call = self.channel.unary_unary(
            HEALTH_PATH, request_serializer=self.HealthRequest.SerializeToString,
            response_deserializer=self.HealthResponse.FromString)

        # Up to 100 tries, 100 ms apart plus each call's 0.5 s timeout: sluiced answers SERVING.
        last = "no answer"
        for _ in range(100):
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"sluiced exited ({self.proc.returncode}) before serving:\n{self.log()}")
            try:
                r = self.health_call(self.HealthRequest(service=""), timeout=0.5)
                if r.status == self.HealthResponse.SERVING:
                    return
                last = f"status {self.HealthResponse.ServingStatus.Name(r.status)}"
            except grpc.RpcError as e:
                last = f"{e.code()}: {e.details()}"
            time.sleep(0.1)
        raise AssertionError(f"sluiced did not answer Health/Check SERVING (last: {last}):\n{self.log()}")

    def log(self):
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return "(no log)"

    def stop(self):
        """TERM, up to 5 s, then KILL."""
        if self.channel is not None:
            self.channel.close()
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    # ---- requests ----

    def descriptor(self, key, value, hits_addend=None):
        d = self.Descriptor()
        e = d.entries.add()
        e.key, e.value = key, value
        if hits_addend is not None:
            d.hits_addend.value = hits_addend  # setting .value marks the wrapper present
        return d

    def should_rate_limit(self, domain, descriptors, hits_addend=0, timeout=5.0):
        req = self.Request(domain=domain, hits_addend=hits_addend)
        req.descriptors.extend(descriptors)
        return self.should_rate_limit_call(req, timeout=timeout)

    def check_user(self, user, **kw):
        """One descriptor user=<user>; its DescriptorStatus, after checking the response's shape."""
        r = self.should_rate_limit("interop", [self.descriptor("user", user)], **kw)
        assert len(r.statuses) == 1, "one status per descriptor"
        assert r.overall_code == r.statuses[0].code, "overall_code of a single descriptor"
        return r.statuses[0]


@pytest.fixture(scope="module")
def sluiced():
    sluiced_bin = os.environ.get("SLUICED_BIN")
    assert sluiced_bin, ("SLUICED_BIN is not set: run tests/interop/run.sh python [SLUICED] or set "
                         "it to build/daemon/sluiced")
    assert os.path.exists(sluiced_bin), f"SLUICED_BIN {sluiced_bin} does not exist (build first)"
    tmp = tempfile.mkdtemp(prefix="sluice-rls-python-")
    node = Sluiced(tmp, build_messages(tmp))
    try:
        node.start(sluiced_bin)
        yield node
        if node.proc.poll() is not None:
            raise AssertionError(f"sluiced exited ({node.proc.returncode}) during the tests:\n{node.log()}")
    finally:
        node.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(autouse=True)
def sluiced_log_on_failure(request, sluiced):
    """Prints sluiced's output after a failed case: pytest shows a failed case's captured output,
    teardown included (conftest.py records each phase's report on the item)."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"--- sluiced output\n{sluiced.log()}")


# ---- helpers ------------------------------------------------------------------------------------

def code_name(sluiced, code):
    return sluiced.Response.Code.Name(code)


def unit_name(current_limit):
    """The name of current_limit.unit (message classes built from descriptors have no nested
    message attributes, so the enum is looked up through the field)."""
    enum = current_limit.DESCRIPTOR.fields_by_name["unit"].enum_type
    return enum.values_by_number[current_limit.unit].name


def seconds(d):
    return d.seconds + d.nanos / 1e9


def assert_per_user_limit(sluiced, status, has_hits=True):
    """current_limit is the per-user limit; duration_until_reset is at most its minute plus one
    1-second bucket (a hit leaves the sliding window when its whole bucket has), and above 0 once
    the key has counted hits (with none, nothing is left to reset)."""
    assert status.HasField("current_limit")
    cl = status.current_limit
    assert (cl.name, cl.requests_per_unit, unit_name(cl)) == (
        "per-user", LIMIT, "MINUTE")
    assert status.HasField("duration_until_reset")
    reset = seconds(status.duration_until_reset)
    assert 0 <= reset <= 61, f"duration_until_reset {reset}s is within the 1-minute window"
    if has_hits:
        assert reset > 0, "duration_until_reset is above 0 once hits are counted"


def raw_should_rate_limit(sluiced, request, grpc_timeout, tmp_path, compressed=False):
    """Sends one gRPC request with nghttp (nghttp2-client), not grpcio, with the given grpc-timeout
    header, so the server, not this client, has to act on the deadline. Returns the grpc-status
    the server sent and whether a response message came back. `compressed`: the message is
    flagged as gzip-compressed (its bytes are not), as a client that compresses would send it."""
    nghttp = shutil.which("nghttp")
    assert nghttp, "nghttp not found (Debian's nghttp2-client; deploy/setup.sh installs it)"
    body = request.SerializeToString()
    path = tmp_path / f"request-{grpc_timeout}.bin"
    flag = b"\x01" if compressed else b"\x00"
    path.write_bytes(flag + len(body).to_bytes(4, "big") + body)
    encoding = ["-H", "grpc-encoding: gzip"] if compressed else []
    out = subprocess.run(
        [nghttp, "-v", "-n", "-t", "5", "-d", str(path),
         "-H", "content-type: application/grpc", "-H", "te: trailers",
         "-H", f"grpc-timeout: {grpc_timeout}", *encoding,
         f"http://127.0.0.1:{sluiced.port}{RLS_PATH}"],
        capture_output=True, text=True, timeout=15)
    statuses = [line.split("grpc-status:", 1)[1].strip()
                for line in out.stdout.splitlines() if "grpc-status:" in line]
    assert statuses, f"no grpc-status in nghttp's output:\n{out.stdout}\n{out.stderr}"
    # A DATA frame from the server carries the response message.
    got_message = any("recv DATA frame" in line and "length=0" not in line
                      for line in out.stdout.splitlines())
    return int(statuses[-1]), got_message


def wait_stopped(pid):
    """Waits until every thread of `pid` is stopped (state T in /proc): a signal is delivered
    asynchronously, and a loopback call is fast enough to be answered in between. Bounded: 2 s."""
    task_dir = f"/proc/{pid}/task"
    for _ in range(200):
        states = []
        for tid in os.listdir(task_dir):
            try:
                with open(f"{task_dir}/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass  # the thread has gone
        if states and all(st in ("T", "t") for st in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"sluiced (pid {pid}) did not stop within 2 s of SIGSTOP")


# ---- the cases ----------------------------------------------------------------------------------

def test_health_check_of_the_server_answers_serving(sluiced):
    r = sluiced.health_call(sluiced.HealthRequest(service=""), timeout=5)
    assert r.status == sluiced.HealthResponse.SERVING


def test_health_check_of_the_rls_service_serving_unknown_service_not_found(sluiced):
    r = sluiced.health_call(
        sluiced.HealthRequest(service="envoy.service.ratelimit.v3.RateLimitService"), timeout=5)
    assert r.status == sluiced.HealthResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        sluiced.health_call(sluiced.HealthRequest(service="no.such.Service"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND, info.value.details()


def test_five_checks_ok_with_remaining_4_to_0_then_over_limit(sluiced):
    for i in range(1, LIMIT + 1):
        s = sluiced.check_user("alice")
        assert code_name(sluiced, s.code) == "OK", f"check {i}"
        assert s.limit_remaining == LIMIT - i, f"check {i}: limit_remaining"
        assert_per_user_limit(sluiced, s)
    s = sluiced.check_user("alice")
    assert code_name(sluiced, s.code) == "OVER_LIMIT", "check 6"
    assert s.limit_remaining == 0
    assert_per_user_limit(sluiced, s)


def test_current_limit_names_the_limit_its_requests_per_unit_and_unit(sluiced):
    r = sluiced.should_rate_limit("interop", [sluiced.descriptor("user", "limit-fields"),
                                              sluiced.descriptor("team", "limit-fields")])
    assert code_name(sluiced, r.overall_code) == "OK"
    assert len(r.statuses) == 2
    user, team = r.statuses
    assert code_name(sluiced, user.code) == "OK"
    assert user.limit_remaining == LIMIT - 1
    assert_per_user_limit(sluiced, user)
    assert code_name(sluiced, team.code) == "OK"
    assert team.limit_remaining == TEAM_LIMIT - 1
    cl = team.current_limit
    assert (cl.name, cl.requests_per_unit, unit_name(cl)) == (
        "per-team", TEAM_LIMIT, "HOUR")
    assert 0 < seconds(team.duration_until_reset) <= 3660  # the hour plus its one-minute bucket


def test_two_descriptors_statuses_in_order_overall_over_limit_when_one_is_over(sluiced):
    used = sluiced.check_user("bob", hits_addend=LIMIT)  # bob's whole minute in one request
    assert code_name(sluiced, used.code) == "OK"
    assert used.limit_remaining == 0

    r = sluiced.should_rate_limit("interop", [sluiced.descriptor("team", "two-descriptors"),
                                              sluiced.descriptor("user", "bob")])
    assert code_name(sluiced, r.overall_code) == "OVER_LIMIT"
    got = [(code_name(sluiced, s.code), s.current_limit.name, s.limit_remaining) for s in r.statuses]
    assert got == [("OK", "per-team", TEAM_LIMIT - 1), ("OVER_LIMIT", "per-user", 0)]

    swapped = sluiced.should_rate_limit("interop", [sluiced.descriptor("user", "bob"),
                                                    sluiced.descriptor("team", "two-descriptors")])
    assert code_name(sluiced, swapped.overall_code) == "OVER_LIMIT"
    got = [(code_name(sluiced, s.code), s.current_limit.name) for s in swapped.statuses]
    assert got == [("OVER_LIMIT", "per-user"), ("OK", "per-team")]


def test_request_hits_addend_is_what_each_check_counts(sluiced):
    s = sluiced.check_user("carol", hits_addend=3)
    assert (code_name(sluiced, s.code), s.limit_remaining) == ("OK", 2)
    s = sluiced.check_user("carol", hits_addend=2)
    assert (code_name(sluiced, s.code), s.limit_remaining) == ("OK", 0)
    s = sluiced.check_user("carol", hits_addend=1)
    assert code_name(sluiced, s.code) == "OVER_LIMIT"

    # More than the whole limit at once is over it, on a fresh key ...
    s = sluiced.check_user("carol-big", hits_addend=LIMIT + 1)
    assert code_name(sluiced, s.code) == "OVER_LIMIT"
    assert_per_user_limit(sluiced, s, has_hits=False)
    # ... and, denied, was not counted (count_denied is off): one hit still fits.
    s = sluiced.check_user("carol-big")
    assert (code_name(sluiced, s.code), s.limit_remaining) == ("OK", LIMIT - 1)


def test_descriptor_hits_addend_0_checks_without_counting_and_wins_over_the_requests(sluiced):
    for i in range(3):
        r = sluiced.should_rate_limit("interop", [sluiced.descriptor("user", "dave", hits_addend=0)])
        (s,) = r.statuses
        assert code_name(sluiced, s.code) == "OK", f"look {i + 1}"
        assert s.limit_remaining == LIMIT, f"look {i + 1}: nothing counted"
        assert_per_user_limit(sluiced, s, has_hits=False)
    # Request hits_addend 3: the first descriptor says 0 for itself, the second takes the 3.
    r = sluiced.should_rate_limit("interop", [sluiced.descriptor("user", "dave", hits_addend=0),
                                              sluiced.descriptor("user", "erin")], hits_addend=3)
    assert code_name(sluiced, r.overall_code) == "OK"
    assert [(code_name(sluiced, s.code), s.limit_remaining) for s in r.statuses] == [
        ("OK", LIMIT), ("OK", LIMIT - 3)]
    # A descriptor's own hits_addend 2 wins over the request's 1 (the default).
    r = sluiced.should_rate_limit("interop", [sluiced.descriptor("user", "dave", hits_addend=2)])
    assert r.statuses[0].limit_remaining == LIMIT - 2


def test_unknown_domain_is_ok_with_no_current_limit(sluiced):
    r = sluiced.should_rate_limit("no-such-domain", [sluiced.descriptor("user", "alice")])
    assert code_name(sluiced, r.overall_code) == "OK"
    assert len(r.statuses) == 1
    assert code_name(sluiced, r.statuses[0].code) == "OK"
    assert not r.statuses[0].HasField("current_limit")


def test_compressed_message_is_unimplemented_and_not_counted(sluiced, tmp_path):
    req = sluiced.Request(domain="interop")
    req.descriptors.append(sluiced.descriptor("user", "gzip-user"))
    status, got_message = raw_should_rate_limit(sluiced, req, "2S", tmp_path, compressed=True)
    assert (status, got_message) == (12, False)  # UNIMPLEMENTED, no message
    s = sluiced.check_user("gzip-user")
    assert s.limit_remaining == LIMIT - 1, "the refused call was counted"


def test_empty_domain_is_invalid_argument(sluiced):
    with pytest.raises(grpc.RpcError) as info:
        sluiced.should_rate_limit("", [sluiced.descriptor("user", "alice")])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()


def test_deadline_honoured_short_deadline_answered_stalled_server_deadline_exceeded(sluiced, tmp_path):
    # grpcio sends the timeout as grpc-timeout; the answer comes well within it.
    started = time.monotonic()
    r = sluiced.should_rate_limit("interop", [sluiced.descriptor("user", "frank")], timeout=1.0)
    assert code_name(sluiced, r.overall_code) == "OK"
    assert time.monotonic() - started < 1.0

    # grpc-timeout in each of its units is understood by the server (sent by nghttp, not grpcio).
    for timeout in ["2S", "2000m", "2000000u", "2000000000n", "1M"]:
        req = sluiced.Request(domain="interop")
        req.descriptors.append(sluiced.descriptor("user", f"grace-{timeout}"))
        status, got_message = raw_should_rate_limit(sluiced, req, timeout, tmp_path)
        assert (status, got_message) == (0, True), f"grpc-timeout {timeout}"
        s = sluiced.check_user(f"grace-{timeout}")
        assert s.limit_remaining == LIMIT - 2, f"grpc-timeout {timeout}: the raw call was counted"

    # sluiced stopped (SIGSTOP) while a call with a 0.3 s deadline is out: the call ends with
    # DEADLINE_EXCEEDED near its deadline instead of waiting, and once sluiced runs again it
    # answers the next call as usual.
    sluiced.proc.send_signal(signal.SIGSTOP)
    try:
        wait_stopped(sluiced.proc.pid)
        stalled = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            sluiced.should_rate_limit("interop", [sluiced.descriptor("user", "ivan")], timeout=0.3)
    finally:
        sluiced.proc.send_signal(signal.SIGCONT)
    waited = time.monotonic() - stalled
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, info.value.details()
    assert 0.25 <= waited < 2.3, f"ended after {waited:.3f} s, deadline 0.3 s"
    s = sluiced.check_user("judy")
    assert (code_name(sluiced, s.code), s.limit_remaining) == ("OK", LIMIT - 1)
