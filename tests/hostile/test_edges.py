"""Issue 33, items 2, 5, 8 and 9: what a stranger or an over-quota tenant sends over the
edges costs the gateway next to nothing.

- 33.2: a body is read only once its caller is known, and never past a limit (HTTP), and
  a refused gRPC call never has its request received;
- 33.5: connections that send nothing useful (no bytes, half headers, half a body, an
  unfinished chunked body) are closed, and past ``server.max_connections`` new ones are;
- 33.8: each message of an append stream is a request (requests/s, in-flight slots),
  streams hold slots of their own and end when idle;
- 9: appends of a tenant being throttled are refused before their body is read.

Real gateway processes on both hot tiers (the Redis one keeps its quota buckets in Redis);
memory is read from ``/proc`` of the gateway, with generous margins. The full-size attacks
(GB bodies, thousands of connections) are ``make attacks`` (benchmarks/attacks.py).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pyarrow as pa
import pytest

from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.codec import encode_stream
from gateway.wire.status import error_from_pb, error_from_rpc
from tests.hostile.conftest import Tenant, new_tenant, table_ref
from tests.services import GatewayProcess, RedisServer

MiB = 1024 * 1024
#: Short timeouts, so that tests wait seconds (never asserted: only waited for).
TIMEOUT_S = 2
MAX_CONNECTIONS = 64
MAX_STREAMS = 3


def rss(gw: GatewayProcess) -> int:
    for line in Path(f"/proc/{gw.proc.pid}/status").read_text().splitlines():  # type: ignore[union-attr]
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Peak:
    """The gateway's peak RSS while the block runs, sampled from a thread."""

    def __init__(self, gw: GatewayProcess) -> None:
        self.gw = gw
        self.before = self.peak = rss(gw)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss(self.gw))
            time.sleep(0.01)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, rss(self.gw))

    @property
    def growth(self) -> int:
        return self.peak - self.before


@pytest.fixture(scope="module")
def gateways(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[Callable[[str], GatewayProcess]]:
    """The module's gateways by hot tier, started when first asked for."""
    started: dict[str, GatewayProcess] = {}
    common = {
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_SERVER__HEADER_TIMEOUT_S": str(TIMEOUT_S),
        "TIDEGATE_SERVER__BODY_TIMEOUT_S": str(TIMEOUT_S),
        "TIDEGATE_SERVER__STREAM_IDLE_S": str(TIMEOUT_S),
        "TIDEGATE_SERVER__MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "TIDEGATE_QUOTA__MAX_STREAMS": str(MAX_STREAMS),
    }
    tiers = {
        "disk": {"TIDEGATE_HOT__TYPE": "disk"},
        "redis": {"TIDEGATE_HOT__TYPE": "redis", "TIDEGATE_HOT__URL": redis_server.url},
    }

    def get(kind: str) -> GatewayProcess:
        if kind not in started:
            folder = tmp_path_factory.mktemp(f"edges-{kind}")
            started[kind] = GatewayProcess(folder, {**common, **tiers[kind]}).start()
        return started[kind]

    try:
        yield get
    finally:
        for gw in started.values():
            gw.stop()


@pytest.fixture
def disk(gateways: Callable[[str], GatewayProcess]) -> GatewayProcess:
    return gateways("disk")


def tenant_with_table(gw: GatewayProcess, **quota: int) -> Tenant:
    t = new_tenant(gw, "e")
    if quota:
        with gw.admin() as admin:
            admin.set_quota(t.name, **quota)
    with t.http() as http:
        r = http.post(
            "/v1/tables",
            json={"namespace": "e", "name": "t", "schema": {"v": "int64"}, "partitions": 1},
        )
        assert r.status_code == 201, r.text
    return t


def one_row() -> bytes:
    batch = pa.record_batch({"v": pa.array([1], pa.int64())})
    return encode_stream([batch], batch.schema)


def chunks(total: int, size: int = MiB) -> Iterator[bytes]:
    """A streamed (chunked) body of ``total`` bytes that is not JSON."""
    for _ in range(total // size):
        yield b"{" * size


def big_appends(gw: GatewayProcess, key: str | None, n: int, size: int) -> list[grpc.StatusCode]:
    """The codes of ``n`` concurrent appends of ``size`` bytes (not Arrow), each over a
    connection of its own, with ``key`` (or none)."""
    body = b"\0" * size
    codes: list[grpc.StatusCode] = []

    def call() -> None:
        channel = gw.channel(api_key=key, options=[("grpc.max_send_message_length", 64 * MiB)])
        try:
            pb_grpc.TidegateStub(channel).Append(
                pb.AppendRequest(table=table_ref("e", "t"), arrow_ipc=body), timeout=120
            )
        except grpc.RpcError as exc:
            codes.append(exc.code())
        finally:
            channel.close()

    threads = [threading.Thread(target=call) for _ in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(180)
    return codes


# 33.2: bodies ------------------------------------------------------------------------
#: Every route that takes a body: tenant routes, then the admin API.
BODY_ROUTES = [
    ("POST", "/v1/tables"),
    ("PATCH", "/v1/tables/e/t"),
    ("POST", "/v1/tables/e/t/schema"),
    ("POST", "/v1/tables/e/t/records"),
    ("POST", "/v1/tables/e/t/deletes"),
    ("POST", "/v1/tables/e/t/scan"),
    ("POST", "/v1/tables/e/t/lookup"),
    ("POST", "/v1/tables/e/t/plan"),
    ("POST", "/v1/groups/g/tables/e/t/offsets"),
    ("POST", "/v1/admin/tenants"),
    ("PUT", "/v1/admin/tenants/x/quota"),
    ("POST", "/v1/admin/placements/move"),
    ("PUT", "/v1/admin/tenants/x/shards"),
    ("POST", "/v1/admin/tenants/x/shards/release"),
]


def test_no_body_is_read_before_the_caller_is_known(disk: GatewayProcess) -> None:
    """A stranger's 32 MiB body gets 401 on every route, and the gateway never holds it
    (before: FastAPI read and parsed it first and answered 400, or 413 at best)."""
    with Peak(disk) as peak, httpx.Client(base_url=disk.http_url, timeout=60) as http:
        for method, path in BODY_ROUTES:
            r = http.request(
                method, path, content=chunks(32 * MiB), headers={"content-type": "application/json"}
            )
            assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
            assert r.json()["error"]["reason"] == "UNAUTHENTICATED"
            r = http.request(method, path, content=b"{" * (32 * MiB))  # declared length
            assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
    assert peak.growth < 48 * MiB, peak.growth / MiB


def test_every_body_is_bounded_once_the_caller_is_known(disk: GatewayProcess) -> None:
    """With a good key a JSON body stops at server.max_body_bytes (4 MiB) and an append
    at server.max_request_bytes: 413 in one sentence, chunked or declared."""
    t = tenant_with_table(disk)
    with t.http(timeout=60) as http, Peak(disk) as peak:
        for method, path in BODY_ROUTES[:9]:
            if path.endswith(("/records", "/deletes")):  # appends: max_request_bytes
                continue
            r = http.request(method, path, content=chunks(16 * MiB))
            assert r.status_code == 413, (method, path, r.status_code, r.text[:200])
            err = r.json()["error"]
            assert err["reason"] == "REQUEST_TOO_LARGE" and err["limit"] == 4 * MiB
            assert "limit of 4194304 bytes" in err["message"]
        r = http.post(
            "/v1/tables/e/t/records",
            content=chunks(80 * MiB),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413 and r.json()["error"]["limit"] == 64 * MiB
    admin = {"authorization": f"Bearer {disk.operator_key}"}
    with httpx.Client(base_url=disk.http_url, timeout=60, headers=admin) as http:
        r = http.put(f"/v1/admin/tenants/{t.name}/quota", content=chunks(16 * MiB))
        assert r.status_code == 413, r.text[:200]
        r = http.put(f"/v1/admin/tenants/{t.name}/quota", json={"requests_per_s": 100})
        assert r.status_code == 200, r.text  # a good body still works
    assert peak.growth < 96 * MiB, peak.growth / MiB


def test_a_refused_grpc_call_never_receives_its_request(disk: GatewayProcess) -> None:
    """20 concurrent 40 MiB appends without a key (each on its own connection) are
    refused UNAUTHENTICATED without the gateway receiving them (before: each was received
    and deserialized first, 800 MiB and more)."""
    with Peak(disk) as peak:
        codes = big_appends(disk, None, 20, 40 * MiB)
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 20
    assert peak.growth < 160 * MiB, peak.growth / MiB


# 33.8: append streams -------------------------------------------------------------------
def stream_requests(
    n: int, body: bytes, *, until: threading.Event | None = None, idle: bool = False
) -> Iterator[Any]:
    """``n`` appends; then, with ``until``, one every half second until it is set; with
    ``idle``, nothing more (the stream stays open, silent)."""
    i = 0

    def message() -> Any:
        nonlocal i
        i += 1
        return pb.AppendStreamRequest(
            request_id=i, append=pb.AppendRequest(table=table_ref("e", "t"), arrow_ipc=body)
        )

    for _ in range(n):
        yield message()
    while until is not None and not until.wait(0.5):
        yield message()
    if idle:
        threading.Event().wait(60)


@pytest.mark.parametrize("tier", ["disk", "redis"])
def test_each_message_of_an_append_stream_is_a_request(
    gateways: Callable[[str], GatewayProcess], tier: str
) -> None:
    """At requests_per_s 5, one stream of 60 back-to-back appends gets at most the
    quota's share through; the rest are THROTTLED in place (before: all 60)."""
    t = tenant_with_table(gateways(tier), requests_per_s=5)
    started = time.monotonic()
    answers = list(t.stub().AppendStream(stream_requests(60, one_row()), timeout=120))
    elapsed = time.monotonic() - started
    assert [a.request_id for a in answers] == list(range(1, 61))  # every one answered
    ok = [a for a in answers if a.HasField("ok")]
    refused = [error_from_pb(a.error) for a in answers if a.HasField("error")]
    assert refused and {e.reason for e in refused} == {"THROTTLED"}
    assert {e.details.get("quota") for e in refused} == {"requests_per_s"}
    # The bucket: a burst of 5, then 5 a second (the stream's opening was one request).
    assert len(ok) <= 5 + 5 * elapsed + 1, (len(ok), elapsed)


def test_append_streams_hold_slots_and_end_when_idle(disk: GatewayProcess) -> None:
    """A tenant opens at most quota.max_streams streams on a gateway (before: 1,000 idle
    ones stayed open); a stream silent for server.stream_idle_s ends cleanly, which
    frees its slot."""
    t = tenant_with_table(disk)
    stub = t.stub()
    busy = threading.Event()
    calls = [
        stub.AppendStream(stream_requests(1, one_row(), until=busy)) for _ in range(MAX_STREAMS)
    ]
    try:
        for call in calls:  # each stream is open and answering
            assert next(call).HasField("ok")
        extra = stub.AppendStream(stream_requests(1, one_row()))
        with pytest.raises(grpc.RpcError) as info:
            next(extra)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        err = error_from_rpc(info.value)
        assert (err.reason, err.details.get("quota")) == ("THROTTLED", "max_streams")
        assert "append streams open" in err.message
    finally:
        busy.set()
    for call in calls:
        assert all(a.HasField("ok") for a in call)
    # A stream that goes silent ends by itself, cleanly (status OK, not a hang).
    silent = stub.AppendStream(stream_requests(1, one_row(), idle=True))
    assert [a.HasField("ok") for a in silent] == [True]
    assert silent.code() == grpc.StatusCode.OK
    # The slots are free again.
    again = stub.AppendStream(stream_requests(1, one_row()))
    assert [a.HasField("ok") for a in again] == [True]


# 33.9: refusals before the body --------------------------------------------------------
def headers_only(gw: GatewayProcess, key: str, length: int) -> bytes:
    """What the gateway answers to an append whose headers declare ``length`` bytes of
    body and whose body never comes (b"" when it closed, or said nothing in 20 s)."""
    with socket.create_connection(("127.0.0.1", gw.http_port), timeout=20) as s:
        s.sendall(
            b"POST /v1/tables/e/t/records HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/vnd.apache.arrow.stream\r\n"
            + f"authorization: Bearer {key}\r\ncontent-length: {length}\r\n\r\n".encode()
        )
        answer = b""
        try:
            while True:
                got = s.recv(65536)
                answer += got
                head, sep, body = answer.partition(b"\r\n\r\n")
                length = [
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]
                if not got or (sep and length and len(body) >= length[0]):
                    return answer
        except TimeoutError:
            return answer


@pytest.mark.parametrize("tier", ["disk", "redis"])
def test_over_quota_appends_are_refused_before_their_body(
    gateways: Callable[[str], GatewayProcess], tier: str
) -> None:
    """Once the quota throttled a tenant, its next appends are refused from their headers:
    over HTTP with the body not even sent, over gRPC without the 30 MiB messages being
    received (before: each was read, decoded and measured first)."""
    gw = gateways(tier)
    t = tenant_with_table(gw, append_bytes_per_s=1000)
    refused = b""
    with t.http() as http:
        # ~70 KB from a 1 KB/s bucket: admitted from the full bucket, which then owes a
        # minute; every later append is refused.
        r = http.post("/v1/tables/e/t/records", json={"rows": [{"v": 1}] * 6000})
        assert r.status_code == 200, r.text
        for _ in range(5):  # the local refusal lasts up to a second: retry on a slow box
            r = http.post("/v1/tables/e/t/records", json={"rows": [{"v": 1}]})
            assert r.status_code == 429, r.text
            refused = headers_only(gw, t.key, 4 * MiB)
            if refused.startswith(b"HTTP/1.1 429"):
                break
        assert refused.startswith(b"HTTP/1.1 429"), refused[:200]
        assert b"append bytes quota" in refused

    with Peak(gw) as peak:
        codes = big_appends(gw, t.key, 12, 30 * MiB)
    assert codes and set(codes) <= {
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INVALID_ARGUMENT,  # one read after the refusal window: not Arrow
    }
    # At most one call a second passes the local refusal and is read.
    assert peak.growth < 160 * MiB, peak.growth / MiB


def test_refused_small_appends_keep_their_connection(disk: GatewayProcess) -> None:
    """An over-quota tenant's HTTP appends are refused before routing; one of a small
    declared body has it received and dropped, so three refusals go over one connection
    (each new connection costs both sides more), with the retry hint; one of a large body
    is answered without it and the connection closed."""
    t = tenant_with_table(disk, append_bytes_per_s=1000)
    with t.http() as http:
        r = http.post("/v1/tables/e/t/records", json={"rows": [{"v": 1}] * 6000})
        assert r.status_code == 200, r.text
    body = one_row()
    head = (
        b"POST /v1/tables/e/t/records HTTP/1.1\r\nhost: x\r\n"
        b"content-type: application/vnd.apache.arrow.stream\r\n"
        + f"authorization: Bearer {t.key}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
    )
    with socket.create_connection(("127.0.0.1", disk.http_port), timeout=20) as s:
        s.sendall((head + body) * 3)
        answers = b""
        while answers.count(b"HTTP/1.1 ") < 3 or not answers.endswith(b"}"):
            got = s.recv(65536)
            assert got, answers
            answers += got
    assert answers.count(b"HTTP/1.1 429") == 3, answers
    assert b"connection: close" not in answers.lower() and b"retry-after: " in answers
    assert answers.count(b'"reason":"THROTTLED"') == 3
    refused = headers_only(disk, t.key, 4 * MiB)
    assert refused.startswith(b"HTTP/1.1 429") and b"connection: close" in refused.lower()


def read_until(s: socket.socket, marker: bytes) -> bytes:
    """What ``s`` receives up to ``marker`` (failing if the server closes first)."""
    got = b""
    while marker not in got:
        more = s.recv(65536)
        assert more, got
        got += more
    return got


def test_a_body_refused_at_its_declared_length_is_read_to_its_end_before_closing(
    disk: GatewayProcess,
) -> None:
    """A 7 MiB JSON body refused 413 from its Content-Length (the limit is 4 MiB) and sent
    slowly: the gateway reads the rest of it and drops it, so the client, still sending
    when the answer went out, reads the 413 rather than a reset, and its connection serves
    the next request (before: the connection was closed 1 MiB after the answer, and a
    client still sending got a reset under load, as httpx did in the suite)."""
    t = tenant_with_table(disk)
    size = 7 * MiB
    with socket.create_connection(("127.0.0.1", disk.http_port), timeout=20) as s:
        s.sendall(
            b"POST /v1/tables/e/t/scan HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {t.key}\r\ncontent-length: {size}\r\n\r\n".encode()
        )
        piece = b" " * (256 * 1024)
        for _ in range(size // len(piece)):  # about 0.6 s: still sending after the answer
            s.sendall(piece)
            time.sleep(0.02)
        answer = read_until(s, b"}}")
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
        assert b"REQUEST_TOO_LARGE" in answer and b"connection: close" not in answer.lower()
        s.sendall(
            b"GET /v1/tables HTTP/1.1\r\nhost: x\r\n"
            + f"authorization: Bearer {t.key}\r\n\r\n".encode()
        )
        again = read_until(s, b"\r\n\r\n")
        assert again.startswith(b"HTTP/1.1 200"), again[:300]


# 33.5: connections ----------------------------------------------------------------------
def closed_by_server(s: socket.socket, wait_s: float = 60) -> bool:
    """Whether the server closes ``s`` (reading and dropping what it answers first)."""
    s.settimeout(wait_s)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def test_idle_and_unfinished_http_connections_are_closed(disk: GatewayProcess) -> None:
    """Bare, half-header, half-body and unfinished chunked connections are closed within
    the timeouts (before: held forever); a stranger's unread body is drained only so far."""
    t = tenant_with_table(disk)
    auth = f"authorization: Bearer {t.key}\r\n".encode()
    post = b"POST /v1/tables/e/t/records HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    openers: dict[str, bytes] = {
        "bare": b"",
        "half headers": b"POST /v1/tables HTTP/1.1\r\nhost: x\r\ncontent-",
        "half body": post + auth + b"content-length: 1000\r\n\r\n" + b"{" * 10,
        "unfinished chunked": post + auth + b"transfer-encoding: chunked\r\n\r\n5\r\n{{{{{\r\n",
        "answered, body still coming": b"POST /v1/tables HTTP/1.1\r\nhost: x\r\n"
        b"content-length: 100000000\r\n\r\n",  # no key: 401 at once, then the body
    }
    sockets: dict[str, list[socket.socket]] = {k: [] for k in openers}
    try:
        for kind, opening in openers.items():
            for _ in range(8):
                s = socket.create_connection(("127.0.0.1", disk.http_port))
                s.sendall(opening)
                sockets[kind].append(s)
        # The answered request's client goes on sending its body: drained, then closed.
        drip = sockets["answered, body still coming"][0]
        with contextlib.suppress(OSError):
            for _ in range(64):
                drip.sendall(b"{" * 64 * 1024)
        for kind, group in sockets.items():
            assert all(closed_by_server(s) for s in group), kind
        with disk.http_client(api_key=None) as http:
            assert http.get("/healthz").status_code == 200
            metrics = http.get("/metrics").text
        for reason in ("header_timeout", "body_timeout"):
            assert f'tidegate_edge_connections_closed_total{{edge="http",reason="{reason}"}}' in (
                metrics
            )
    finally:
        for group in sockets.values():
            for s in group:
                s.close()


def test_connections_past_the_cap_are_refused_and_grpc_handshakes_time_out(
    disk: GatewayProcess,
) -> None:
    """Past server.max_connections an HTTP connection is answered 503 and closed at once;
    a gRPC connection that never speaks HTTP/2 is closed after the handshake timeout."""
    held = [socket.create_connection(("127.0.0.1", disk.http_port)) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.5)  # let the gateway accept them all
        over = socket.create_connection(("127.0.0.1", disk.http_port))
        over.settimeout(30)
        answer = over.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:100]
        assert closed_by_server(over)
        over.close()
    finally:
        for s in held:
            s.close()
    bare = [socket.create_connection(("127.0.0.1", disk.grpc_port)) for _ in range(8)]
    try:
        assert all(closed_by_server(s) for s in bare)
    finally:
        for s in bare:
            s.close()
    with disk.client() as c:  # both edges still serve
        assert isinstance(c.list_tables(), list)
    with disk.http_client(api_key=None) as http:
        assert http.get("/healthz").status_code == 200


def test_clients_gone_mid_request_are_no_gateway_error(disk: GatewayProcess) -> None:
    """HTTP clients that disconnect mid-body (a proxy's cut), mid-answer (a streamed scan
    or read whose reader goes away) or during a long poll: nothing of them is the
    gateway's error, so its log holds no ERROR, no traceback and no "unexpected error",
    and a body cut short says so in one INFO line."""
    t = tenant_with_table(disk)
    with t.http() as http:
        rows = [{"v": i} for i in range(20_000)]
        assert http.post("/v1/tables/e/t/records", json={"rows": rows}).status_code == 200
    auth = f"authorization: Bearer {t.key}\r\n".encode()
    arrow = b"application/vnd.apache.arrow.stream"
    cuts = [  # (request line, headers, body sent, bytes of the answer read: whole requests)
        (b"POST /v1/tables/e/t/records", b"content-type: application/json", b'{"rows": [', 0),
        (b"POST /v1/tables/e/t/records", b"content-type: " + arrow, one_row()[:20], 0),
        (b"POST /v1/tables", b"content-type: application/json", b'{"namespace": "e"', 0),
        (b"POST /v1/tables/e/t/scan", b"content-type: application/json", b"{", 0),
        (b"POST /v1/tables/e/t/scan", b"content-type: application/json\r\naccept: " + arrow,
         b"{}", 100),
        (b"GET /v1/tables/e/t/partitions/0/records?offset=0", b"accept: " + arrow, b"", 100),
        (b"GET /v1/tables/e/t/partitions/0/records?offset=20000&follow=true", b"x-a: b", b"", 0),
    ]  # fmt: skip
    before = len(disk.log_path.read_bytes())
    for head, header, body, read in cuts:
        length = len(body) if read or head.startswith(b"GET") else len(body) + 100
        with socket.create_connection(("127.0.0.1", disk.http_port), timeout=20) as s:
            s.sendall(
                head + b" HTTP/1.1\r\nhost: x\r\n" + header + b"\r\n" + auth
                + f"content-length: {length}\r\n\r\n".encode() + body
            )  # fmt: skip
            if read:
                assert s.recv(read)
            time.sleep(0.3)
    time.sleep(1)
    log = disk.log_path.read_bytes()[before:].decode(errors="replace")
    for bad in (" ERROR ", "Traceback", "unexpected error", "Exception in ASGI"):
        assert bad not in log, log
    assert "disconnected before its body was read; nothing applied" in log, log
