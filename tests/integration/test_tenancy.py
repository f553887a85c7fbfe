"""Multi-tenancy against real gateway processes: authentication, isolation, quotas,
fair admission, metering, suspension and deletion.

Tenants here are created through the admin API of the session gateways (one per hot tier);
the tests that need two replicas start a pair sharing one metadata store and one Redis.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from google.rpc import error_details_pb2, status_pb2

from gateway.client._sync import _ipc
from gateway.wire._proto.tidegate.v1 import admin_pb2 as apb
from gateway.wire._proto.tidegate.v1 import admin_pb2_grpc as apb_grpc
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.errors import Throttled
from tests.integration.conftest import gateway_env
from tests.services import GatewayProcess, RedisServer

pytestmark = pytest.mark.integration

ARROW = "application/vnd.apache.arrow.stream"


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------
def grpc_failure(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str, str, dict[str, str]]:
    """A raw gRPC call that must fail: code, ErrorInfo reason, message, metadata."""
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, bytes):
            list(result)
    return error_info(info.value)


def error_info(exc: Any) -> tuple[grpc.StatusCode, str, str, dict[str, str]]:
    """Code, ErrorInfo reason, message and metadata of a failed gRPC call."""
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for d in status.details:
                if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    ei = error_details_pb2.ErrorInfo()
                    d.Unpack(ei)
                    return exc.code(), ei.reason, exc.details(), dict(ei.metadata)
    raise AssertionError(f"no ErrorInfo in {exc}")


def http_failure(resp: httpx.Response) -> tuple[int, str, str]:
    body = resp.json()
    assert "error" in body, body
    return resp.status_code, body["error"]["reason"], body["error"]["message"]


@dataclass
class Tenant:
    name: str
    key: str
    key_id: str


def new_tenant(gw: GatewayProcess, prefix: str = "t") -> Tenant:
    name = f"{prefix}{secrets.token_hex(5)}"
    with gw.admin() as admin:
        admin.create_tenant(name)
        key_id, key = admin.issue_key(name)
    return Tenant(name, key, key_id)


def payload(rows: int, width: int = 16) -> bytes:
    return _ipc(pa.table({"v": list(range(rows)), "s": ["x" * width] * rows}))


SCHEMA = {"v": "int64", "s": "string"}


# --------------------------------------------------------------------------------------
# Authentication
# --------------------------------------------------------------------------------------
def test_open_endpoints_need_no_key(gateway: GatewayProcess) -> None:
    with gateway.http_client(api_key=None) as http:
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
            assert http.get(path).status_code == 200, path
        assert http.get("/v1/tables").status_code == 401
        paths = http.get("/openapi.json").json()["paths"]
        assert {"401", "429"} <= set(paths["/v1/tables"]["get"]["responses"])
        assert "/v1/admin/tenants/{tenant}/usage" in paths


_CREATE = pb.CreateTableRequest(
    table=pb.TableRef(namespace="auth", name="t"),
    fields=[pb.Field(name="v", type="int64", nullable=True)],
    partitions=1,
)


def _refused_everywhere(gateway: GatewayProcess, key: str | None, label: str) -> None:
    """Every kind of call with ``key`` is UNAUTHENTICATED / 401."""
    ref = _CREATE.table
    with gateway.channel(api_key=key) as ch:
        stub = pb_grpc.TidegateStub(ch)
        admin = apb_grpc.AdminStub(ch)
        calls: list[Callable[[], Any]] = [
            lambda: stub.CreateTable(_CREATE, timeout=10),
            lambda: stub.ListTables(pb.ListTablesRequest(), timeout=10),
            lambda: stub.Read(pb.ReadRequest(table=ref, partition=0, offset=0), timeout=10),
            lambda: stub.Append(
                pb.AppendRequest(table=ref, arrow_ipc=_ipc([{"v": 1}])), timeout=10
            ),
            lambda: admin.ListTenants(apb.ListTenantsRequest(), timeout=10),
        ]
        for call in calls:
            code, reason, _, _ = grpc_failure(call)
            assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED"), label
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    with gateway.http_client(api_key=None, headers=headers) as http:
        made = http.post(
            "/v1/tables",
            json={"namespace": "auth", "name": "t", "schema": {"v": "int64"}, "partitions": 1},
        )
        assert http_failure(made)[:2] == (401, "UNAUTHENTICATED"), label
        appended = http.post("/v1/tables/auth/t/records", json={"rows": [{"v": 1}]})
        assert appended.status_code == 401, label
        assert http.get("/v1/admin/tenants").status_code == 401, label


def test_bad_keys_are_unauthenticated_and_do_nothing(gateway: GatewayProcess) -> None:
    tenant = new_tenant(gateway)
    revoked = new_tenant(gateway)
    with gateway.admin() as admin:
        admin.revoke_key(revoked.key_id)
    body = tenant.key[:-4] + ("AAAA" if not tenant.key.endswith("AAAA") else "BBBB")
    bad_keys: dict[str, str | None] = {
        "missing": None,
        "malformed": "not-a-key",
        "unknown id": "tg_0123456789abcdef_" + "x" * 43,
        "wrong secret": body,
        "revoked": revoked.key,
    }
    for label, key in bad_keys.items():
        _refused_everywhere(gateway, key, label)
    with gateway.http_client(api_key=None, headers={"authorization": "Basic abc"}) as http:
        assert http_failure(http.get("/v1/tables"))[:2] == (401, "UNAUTHENTICATED")
    # No work was done: neither tenant has a table.
    with gateway.client(api_key=tenant.key) as c:
        assert c.list_tables() == []
    with gateway.admin() as admin:
        admin.resume_tenant(revoked.name)
        assert admin.usage(revoked.name) == []  # no request of the revoked key counted


def test_operator_key_is_not_a_tenant_and_tenant_keys_are_not_operators(
    gateway: GatewayProcess,
) -> None:
    tenant = new_tenant(gateway)
    with gateway.channel(api_key=gateway.operator_key) as ch:
        code, reason, _, _ = grpc_failure(
            lambda: pb_grpc.TidegateStub(ch).ListTables(pb.ListTablesRequest(), timeout=10)
        )
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    with gateway.channel(api_key=tenant.key) as ch:
        code, reason, _, _ = grpc_failure(
            lambda: apb_grpc.AdminStub(ch).ListTenants(apb.ListTenantsRequest(), timeout=10)
        )
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    with gateway.http_client(api_key=tenant.key) as http:
        assert http_failure(http.get("/v1/admin/tenants"))[:2] == (403, "PERMISSION_DENIED")
    with gateway.http_client(api_key=gateway.operator_key) as http:
        assert http_failure(http.get("/v1/tables"))[:2] == (403, "PERMISSION_DENIED")


# --------------------------------------------------------------------------------------
# Isolation
# --------------------------------------------------------------------------------------
def _attempts(gw: GatewayProcess, a: Tenant, ns: str, name: str, guess_id: str) -> dict[str, Any]:
    """Every operation tenant A can try on ``ns.name``, over gRPC and HTTP; the outcome of
    each (error code, reason and message, or what A got)."""
    out: dict[str, Any] = {}
    ref = pb.TableRef(namespace=ns, name=name)
    with gw.channel(api_key=a.key) as ch:
        stub = pb_grpc.TidegateStub(ch)
        admin = apb_grpc.AdminStub(ch)
        calls: dict[str, Callable[[], Any]] = {
            "describe": lambda: stub.DescribeTable(pb.DescribeTableRequest(table=ref), timeout=10),
            "append": lambda: stub.Append(
                pb.AppendRequest(table=ref, arrow_ipc=payload(1)), timeout=10
            ),
            "read": lambda: stub.Read(pb.ReadRequest(table=ref, partition=0, offset=0), timeout=10),
            "follow": lambda: stub.Read(
                pb.ReadRequest(table=ref, partition=0, offset=0, follow=True), timeout=10
            ),
            "drop": lambda: stub.DropTable(pb.DropTableRequest(table=ref), timeout=10),
            "by id": lambda: stub.DescribeTable(
                pb.DescribeTableRequest(table=pb.TableRef(namespace=ns, name=guess_id)),
                timeout=10,
            ),
            "by path": lambda: stub.Read(
                pb.ReadRequest(
                    table=pb.TableRef(namespace=f"../{ns}", name=f"{guess_id}/0"),
                    partition=0,
                    offset=0,
                ),
                timeout=10,
            ),
            "admin usage": lambda: admin.GetUsage(apb.GetUsageRequest(tenant="x"), timeout=10),
        }
        for label, call in calls.items():
            code, reason, message, _ = grpc_failure(call)
            assert code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED), label
            out[f"grpc {label}"] = (code, reason, message)
        listed = stub.ListTables(pb.ListTablesRequest(namespace=ns), timeout=10)
        out["grpc list"] = [t.table.name for t in listed.tables]
        listed_all = stub.ListTables(pb.ListTablesRequest(), timeout=10)
        out["grpc list all"] = sorted(t.table.namespace for t in listed_all.tables)
    with gw.http_client(api_key=a.key) as http:
        base = f"/v1/tables/{ns}/{name}"
        responses = {
            "describe": http.get(base),
            "append json": http.post(f"{base}/records", json={"rows": [{"v": 1, "s": "a"}]}),
            "append arrow": http.post(
                f"{base}/records", content=payload(1), headers={"content-type": ARROW}
            ),
            "read": http.get(f"{base}/partitions/0/records", params={"offset": 0}),
            "drop": http.delete(base),
            "by id": http.get(f"/v1/tables/{ns}/{guess_id}"),
            "by path": http.get(f"/v1/tables/..%2F{ns}/{guess_id}/partitions/0/records"),
            "admin usage": http.get("/v1/admin/tenants/x/usage"),
            "admin tenants": http.get("/v1/admin/tenants"),
        }
        for label, resp in responses.items():
            assert resp.status_code in (403, 404), (label, resp.text)
            out[f"http {label}"] = http_failure(resp)
        out["http list"] = http.get("/v1/tables", params={"namespace": ns}).json()
    return out


def _snapshot(gw: GatewayProcess, t: Tenant, table: str) -> tuple[list[int], list[Any]]:
    with gw.client(api_key=t.key) as c:
        info = c.describe_table(table)
        rows = []
        for p in info.partition_info:
            rows.extend(c.read(table, partition=p.partition, offset=0).to_pylist())
        return [p.high_watermark for p in info.partition_info], rows


def test_a_tenant_cannot_reach_another_tenants_tables(gateway: GatewayProcess) -> None:
    a, b = new_tenant(gateway, "a"), new_tenant(gateway, "b")
    ns, name = "shared", "secret"
    guess = "00000000-0000-0000-0000-000000000000"
    before = _attempts(gateway, a, ns, name, guess)

    with gateway.client(api_key=b.key) as c:
        info = c.create_table(f"{ns}.{name}", SCHEMA, partitions=2)
        c.append(f"{ns}.{name}", [{"v": 1, "s": "b"}, {"v": 2, "s": "b"}], partition=0)
    b_before = _snapshot(gateway, b, f"{ns}.{name}")

    after = _attempts(gateway, a, ns, name, info.table_id)
    # The guessed id appears in the 'by id' / 'by path' messages; compare them by shape.
    for k in after:
        if "by id" in k or "by path" in k:
            assert after[k][:2] == before[k][:2], k
            assert after[k][2].replace(info.table_id, guess) == before[k][2], k
        else:
            assert after[k] == before[k], k
    assert after["grpc list"] == [] and after["grpc list all"] == []
    assert after["http list"] == {"tables": [], "next_page_token": ""}
    assert _snapshot(gateway, b, f"{ns}.{name}") == b_before

    # A may use the same name in its own namespace: a different table, B's stays intact.
    with gateway.client(api_key=a.key) as c:
        c.create_table(f"{ns}.{name}", SCHEMA, partitions=1)
        c.append(f"{ns}.{name}", [{"v": 9, "s": "a"}])
        assert c.read(f"{ns}.{name}", partition=0, offset=0).column("s").to_pylist() == ["a"]
        c.drop_table(f"{ns}.{name}")
    assert _snapshot(gateway, b, f"{ns}.{name}") == b_before


# --------------------------------------------------------------------------------------
# Quotas and fair admission
# --------------------------------------------------------------------------------------
def test_over_quota_is_throttled_with_a_retry_hint(gateway: GatewayProcess) -> None:
    t = new_tenant(gateway)
    body = payload(50)
    with gateway.admin() as admin:
        admin.set_quota(t.name, append_bytes_per_s=len(body), max_tables=1)
    with gateway.client(api_key=t.key) as c:
        c.create_table("q.t", SCHEMA, partitions=1)
        with pytest.raises(Exception, match="quota"):
            c.create_table("q.u", SCHEMA, partitions=1)
    with gateway.channel(api_key=t.key) as ch:
        stub = pb_grpc.TidegateStub(ch)
        req = pb.AppendRequest(table=pb.TableRef(namespace="q", name="t"), arrow_ipc=body)
        stub.Append(req, timeout=10)
        # One batch a second: of the next few sent at once, some are refused.
        for _ in range(5):
            try:
                stub.Append(req, timeout=10)
            except grpc.RpcError:
                break
        code, reason, _, meta = grpc_failure(lambda: stub.Append(req, timeout=10))
        assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "THROTTLED")
        assert 0 < int(meta["retry_after_ms"]) <= 1000
    with gateway.http_client(api_key=t.key) as http:
        for _ in range(5):
            resp = http.post(
                "/v1/tables/q/t/records", content=body, headers={"content-type": ARROW}
            )
            if resp.status_code == 429:
                break
        assert resp.status_code == 429
        assert 0 < resp.json()["error"]["retry_after_ms"] <= 1000
        assert int(resp.headers["retry-after"]) >= 1


def test_a_flooding_tenant_does_not_throttle_another(gateway: GatewayProcess) -> None:
    a, b = new_tenant(gateway, "flood"), new_tenant(gateway, "calm")
    body = payload(100)
    rate = len(body) * 4  # A may append 4 batches a second and tries 20 (5x)
    with gateway.admin() as admin:
        admin.set_quota(a.name, append_bytes_per_s=rate)
    for t in (a, b):
        with gateway.client(api_key=t.key) as c:
            c.create_table("f.t", SCHEMA, partitions=1)
    stop = threading.Event()
    throttled = [0]

    def flood() -> None:
        with gateway.client(api_key=a.key) as c:
            while not stop.is_set():
                try:
                    c.append_ipc("f.t", body)
                except Throttled:
                    throttled[0] += 1
                time.sleep(0.05)

    floods = [threading.Thread(target=flood) for _ in range(1)]
    for f in floods:
        f.start()
    try:
        with gateway.client(api_key=b.key) as c:
            for _ in range(40):
                (r,) = c.append_ipc("f.t", body)  # raises Throttled if B were throttled
                assert r.count == 100
                time.sleep(0.05)
    finally:
        stop.set()
        for f in floods:
            f.join(30)
    assert throttled[0] > 0, "A was never throttled: the test did not exercise the quota"
    with gateway.admin() as admin:
        b_usage = admin.usage(b.name)
        a_usage = admin.usage(a.name)
    assert sum(r["throttled"] for r in b_usage) == 0
    assert sum(r["append_records"] for r in b_usage) == 40 * 100
    assert sum(r["throttled"] for r in a_usage) == throttled[0]


def test_in_flight_work_is_bounded_per_tenant(tmp_path: Path) -> None:
    """A tenant's long poll holds its only follow slot: its next long poll is refused with
    a retry hint, while its ordinary requests and another tenant's go on."""
    env = {
        **gateway_env("disk", None),
        "TIDEGATE_QUOTA__MAX_IN_FLIGHT": "1",
        "TIDEGATE_QUOTA__MAX_FOLLOWS": "1",
    }
    gw = GatewayProcess(tmp_path / "gw", env).start()
    try:
        a, b = new_tenant(gw), new_tenant(gw)
        for t in (a, b):
            with gw.client(api_key=t.key) as c:
                c.create_table("w.t", SCHEMA, partitions=1)
        url = "/v1/tables/w/t/partitions/0/records"
        first: list[httpx.Response] = []
        with gw.http_client(api_key=a.key) as http:

            def hold() -> None:
                # A probe below may hold the slot for a moment: retry until we get it.
                while True:
                    resp = http.get(url, params={"offset": 0, "follow": "true", "wait_ms": 20_000})
                    if resp.status_code != 429:
                        first.append(resp)
                        return
                    time.sleep(0.01)

            holder = threading.Thread(target=hold)
            holder.start()
            refused = None
            deadline = time.monotonic() + 15
            while refused is None and time.monotonic() < deadline:
                resp = http.get(url, params={"offset": 0, "follow": "true", "wait_ms": 0})
                if resp.status_code == 429:
                    refused = resp
                time.sleep(0.02)
            assert refused is not None, "the second long poll was never refused"
            assert refused.json()["error"]["quota"] == "max_follows"
            assert int(refused.headers["retry-after"]) >= 1
            # A's ordinary requests still run; the append wakes the waiting poll.
            appended = http.post(
                url.rsplit("/partitions", 1)[0] + "/records", json={"rows": [{"v": 1, "s": "a"}]}
            )
            assert appended.status_code == 200, appended.text
            holder.join(30)
            assert first[0].status_code == 200 and len(first[0].json()["records"]) == 1
        with gw.client(api_key=b.key) as c:
            c.append("w.t", [{"v": 1, "s": "b"}])
    finally:
        gw.stop()


# --------------------------------------------------------------------------------------
# Metering
# --------------------------------------------------------------------------------------
def test_usage_counts_exactly_what_was_sent(gateway: GatewayProcess) -> None:
    t = new_tenant(gateway)
    sent_bytes = sent_records = read_records = requests = 0
    with gateway.client(api_key=t.key) as c:
        c.create_table("u.t", SCHEMA, partitions=2)
        requests += 1
        for i in range(7):
            body = payload(i + 1, width=i)
            c.append_ipc("u.t", body, partition=i % 2)
            sent_bytes += len(body)
            sent_records += i + 1
            requests += 1
        for p in (0, 1):
            # The gateway's read: a client-side one ("auto") asks for a plan of the
            # partition first, one request more (docs/decisions/client.md).
            read_records += c.read("u.t", partition=p, offset=0, mode="server").num_rows
            requests += 1
    with gateway.http_client(api_key=t.key) as http:
        body_json = json.dumps({"rows": [{"v": 1, "s": "h"}, {"v": 2, "s": "i"}]}).encode()
        resp = http.post(
            "/v1/tables/u/t/records",
            content=body_json,
            headers={"content-type": "application/json"},
        )
        assert resp.status_code == 200
        sent_bytes += len(body_json)
        sent_records += 2
        requests += 1
        got = http.get("/v1/tables/u/t/partitions/0/records", params={"offset": 0})
        read_records += len(got.json()["records"])
        requests += 1
    with gateway.admin() as admin:
        rows = admin.usage(t.name)
    total = {k: sum(r[k] for r in rows) for k in rows[0] if k != "minute_ms"}
    assert total["append_bytes"] == sent_bytes
    assert total["append_records"] == sent_records
    assert total["read_records"] == read_records
    assert total["requests"] == requests
    assert total["throttled"] == 0
    with gateway.client(api_key=t.key) as c:
        held = sum(p.hot_bytes for p in c.describe_table("u.t").partition_info)
    assert held > 0 and rows[-1]["hot_bytes"] == held  # sampled when usage is read
    with gateway.http_client(api_key=gateway.operator_key) as http:
        usage = http.get(f"/v1/admin/tenants/{t.name}/usage").json()["usage"]
        assert sum(r["append_records"] for r in usage) == sent_records
        metrics = http.get("/metrics").text
    assert f'tidegate_tenant_append_records_total{{tenant="{t.name}"}} {float(sent_records)}' in (
        metrics
    )


# --------------------------------------------------------------------------------------
# Two replicas sharing Redis and the metadata store
# --------------------------------------------------------------------------------------
@dataclass
class Pair:
    gateways: tuple[GatewayProcess, GatewayProcess]
    redis: RedisServer
    metadata: Path


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("pair")
    server = RedisServer(root / "redis").start()
    metadata = root / "shared-metadata.db"
    env = {
        **gateway_env("redis", server),
        "TIDEGATE_METADATA__URL": f"sqlite:///{metadata}",
        "TIDEGATE_AUTH__OPERATOR_KEY": f"tgop_pair_{secrets.token_hex(16)}",
    }
    first = GatewayProcess(root / "gw1", env).start()
    second = GatewayProcess(root / "gw2", env, tenant=first.tenant, api_key=first.api_key)
    try:
        second.start()
        yield Pair((first, second), server, metadata)
    finally:
        second.stop()
        first.stop()
        server.stop()


def test_two_replicas_hold_one_append_quota_together(pair: Pair) -> None:
    gw1, gw2 = pair.gateways
    t = new_tenant(gw1)
    body = payload(200)
    rate = len(body) * 10  # ten batches a second across both replicas
    with gw1.admin() as admin:
        admin.set_quota(t.name, append_bytes_per_s=rate)
    with gw1.client(api_key=t.key) as c:
        c.create_table("q.t", SCHEMA, partitions=1)

    window = 5.0
    start = time.monotonic() + 1.5  # first drain the burst
    end = start + window
    accepted: list[int] = []
    lock = threading.Lock()

    def send(gw: GatewayProcess) -> None:
        with gw.client(api_key=t.key) as c:
            while True:
                sent_at = time.monotonic()
                if sent_at > end:
                    return
                try:
                    c.append_ipc("q.t", body)
                except Throttled as err:
                    time.sleep(min(err.retry_after_ms or 10, 50) / 1000)
                    continue
                if sent_at >= start and time.monotonic() <= end:
                    with lock:
                        accepted.append(len(body))

    senders = [threading.Thread(target=send, args=(gw,)) for gw in (gw1, gw2, gw1, gw2)]
    for s in senders:
        s.start()
    for s in senders:
        s.join(60)
    expected = rate * window
    got = sum(accepted)
    assert abs(got - expected) <= 0.10 * expected, (got, expected)


def _script_calls(server: RedisServer) -> int:
    import redis

    with redis.Redis.from_url(server.url) as r:
        stats = r.info("commandstats")
    return sum(
        int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")
    )


def test_a_throttled_tenant_is_refused_locally_until_its_retry_time(pair: Pair) -> None:
    """Once the shared bucket refused with "retry in W ms", the replica refuses that
    tenant's appends for W ms by itself: no Redis script call per refusal (a tenant far
    over its quota must not queue Redis round trips in front of other tenants), each
    refusal carries the time left, and after it the tenant is served again."""
    gw1, _ = pair.gateways
    t = new_tenant(gw1)
    body = payload(200)
    with gw1.admin() as admin:
        admin.set_quota(t.name, append_bytes_per_s=len(body))  # one batch a second
    with gw1.client(api_key=t.key) as c:
        c.create_table("q.t", SCHEMA, partitions=1)
    with gw1.channel(api_key=t.key) as ch:
        stub = pb_grpc.TidegateStub(ch)
        req = pb.AppendRequest(table=pb.TableRef(namespace="q", name="t"), arrow_ipc=body)
        stub.Append(req, timeout=10)  # takes the burst
        code, reason, _, meta = grpc_failure(lambda: stub.Append(req, timeout=10))
        assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "THROTTLED")
        wait_ms = int(meta["retry_after_ms"])
        assert 0 < wait_ms <= 1000
        before = _script_calls(pair.redis)
        hints = []
        for _ in range(10):
            code, reason, _, meta = grpc_failure(lambda: stub.Append(req, timeout=10))
            assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "THROTTLED")
            hints.append(int(meta["retry_after_ms"]))
        assert _script_calls(pair.redis) == before
        assert all(0 < h <= wait_ms for h in hints)
        assert hints == sorted(hints, reverse=True)  # the time left, counting down
        time.sleep(wait_ms / 1000 + 0.2)
        (r,) = stub.Append(req, timeout=10).ranges
        assert r.count == 200
    with gw1.client(api_key=t.key) as c:
        assert c.table_info("q.t").high_watermarks == (400,)


#: ``auth.key_cache_ttl_s`` of the gateways here (the default): how long a replica may go on
#: with what it read about a key after another replica revoked it or suspended its tenant.
KEY_CACHE_TTL_S = 1.0
#: Added to that bound before a test gives up waiting, for a slow or loaded machine.
MARGIN_S = 10.0

OK = (grpc.StatusCode.OK, "")
SUSPENDED = (grpc.StatusCode.PERMISSION_DENIED, "TENANT_SUSPENDED")
UNAUTHENTICATED = (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")


def list_outcome(gw: GatewayProcess, key: str) -> tuple[grpc.StatusCode, str]:
    """The status code and ErrorInfo reason of a ListTables call with ``key`` (OK, "")."""
    with gw.channel(api_key=key) as ch:
        try:
            pb_grpc.TidegateStub(ch).ListTables(pb.ListTablesRequest(), timeout=10)
        except grpc.RpcError as exc:
            code, reason, _, _ = error_info(exc)
            return code, reason
    return OK


def eventually(gw: GatewayProcess, key: str, expected: tuple[grpc.StatusCode, str]) -> None:
    """Retry until ``gw`` answers ``key`` with ``expected``; it must within the key cache's
    TTL (plus a margin for the machine, never a speed assertion)."""
    deadline = time.monotonic() + KEY_CACHE_TTL_S + MARGIN_S
    while (got := list_outcome(gw, key)) != expected:
        assert time.monotonic() < deadline, (got, expected)
        time.sleep(0.05)


def test_suspension_is_seen_at_once_here_and_within_the_key_cache_ttl_elsewhere(
    pair: Pair,
) -> None:
    gw1, gw2 = pair.gateways
    t = new_tenant(gw1)
    with gw2.client(api_key=t.key) as c:
        c.create_table("s.t", SCHEMA, partitions=1)
    for gw in (gw1, gw2):  # both replicas have read the key, and keep what they read
        assert list_outcome(gw, t.key) == OK
    with gw1.admin() as admin:
        admin.suspend_tenant(t.name)
    assert list_outcome(gw1, t.key) == SUSPENDED  # at once where it was suspended
    eventually(gw2, t.key, SUSPENDED)
    with gw2.http_client(api_key=t.key) as http:
        assert http_failure(http.get("/v1/tables"))[:2] == (403, "TENANT_SUSPENDED")
    with gw2.admin() as admin:
        admin.resume_tenant(t.name)
    assert list_outcome(gw2, t.key) == OK
    eventually(gw1, t.key, OK)
    with gw1.client(api_key=t.key) as c:
        assert [i.table.name for i in c.list_tables()] == ["t"]


def test_a_revoked_key_is_refused_at_once_here_and_within_the_key_cache_ttl_elsewhere(
    pair: Pair,
) -> None:
    gw1, gw2 = pair.gateways
    t = new_tenant(gw1)
    with gw1.admin() as admin:
        _, other_key = admin.issue_key(t.name)
    for gw in (gw1, gw2):
        for key in (t.key, other_key):
            assert list_outcome(gw, key) == OK
    with gw1.admin() as admin:
        admin.revoke_key(t.key_id)
    assert list_outcome(gw1, t.key) == UNAUTHENTICATED  # at once where it was revoked
    with gw1.http_client(api_key=t.key) as http:
        assert http_failure(http.get("/v1/tables"))[:2] == (401, "UNAUTHENTICATED")
    eventually(gw2, t.key, UNAUTHENTICATED)
    for gw in (gw1, gw2):
        assert list_outcome(gw, other_key) == OK  # the tenant's other key still works
        # A key id a replica has cached never vouches for a wrong secret.
        wrong = other_key[:-4] + ("AAAA" if not other_key.endswith("AAAA") else "BBBB")
        assert list_outcome(gw, wrong) == UNAUTHENTICATED


def _sql_rows(db: Path, tenant: str, table_ids: list[str]) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        counts = {
            "tg_tenants": conn.execute(
                "SELECT count(*) FROM tg_tenants WHERE id = ?", (tenant,)
            ).fetchone()[0],
        }
        for table in ("tg_tables", "tg_api_keys", "tg_quotas", "tg_usage"):
            counts[table] = conn.execute(
                f"SELECT count(*) FROM {table} WHERE tenant_id = ?", (tenant,)
            ).fetchone()[0]
        marks = ",".join("?" * len(table_ids))
        counts["tg_partitions"] = conn.execute(
            f"SELECT count(*) FROM tg_partitions WHERE table_id IN ({marks})", table_ids
        ).fetchone()[0]
    return counts


def _fill(gw: GatewayProcess, t: Tenant) -> list[str]:
    """Tables with data, a quota (so there are buckets) and flushed usage."""
    with gw.admin() as admin:
        admin.set_quota(t.name, append_bytes_per_s=10_000_000, read_bytes_per_s=10_000_000)
    ids = []
    with gw.client(api_key=t.key) as c:
        for name in ("a", "b"):
            info = c.create_table(f"d.{name}", SCHEMA, partitions=3)
            ids.append(info.table_id)
            for p in range(3):
                c.append_ipc(f"d.{name}", payload(10), partition=p)
            c.read(f"d.{name}", partition=0, offset=0)
    with gw.admin() as admin:
        assert admin.usage(t.name)
    return ids


def test_deleting_a_tenant_leaves_nothing_redis(pair: Pair) -> None:
    gw1, gw2 = pair.gateways
    t = new_tenant(gw1, "gone")
    ids = _fill(gw2, t)
    r = redis.Redis(port=pair.redis.port)
    try:
        assert list(r.scan_iter(match=f"*{t.name}*"))
        assert _sql_rows(pair.metadata, t.name, ids)["tg_partitions"] == 6
        with gw1.admin() as admin:
            admin.delete_tenant(t.name)
        assert list(r.scan_iter(match=f"*{t.name}*")) == []
        assert list(r.scan_iter(match=f"*{ids[0]}*")) == []
    finally:
        r.close()
    assert set(_sql_rows(pair.metadata, t.name, ids).values()) == {0}
    with gw2.channel(api_key=t.key) as ch:
        code, _, _, _ = grpc_failure(
            lambda: pb_grpc.TidegateStub(ch).ListTables(pb.ListTablesRequest(), timeout=10)
        )
        assert code is grpc.StatusCode.UNAUTHENTICATED


def test_deleting_a_tenant_leaves_nothing_disk(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "gw", gateway_env("disk", None)).start()
    try:
        t = new_tenant(gw, "gone")
        ids = _fill(gw, t)
        assert (gw.data_dir / "hot" / t.name).exists()
        with gw.admin() as admin:
            admin.delete_tenant(t.name)
        leftovers = [
            p for p in gw.data_dir.rglob("*") if t.name in str(p) or any(i in str(p) for i in ids)
        ]
        assert leftovers == []
        assert set(_sql_rows(gw.data_dir / "metadata.db", t.name, ids).values()) == {0}
        # The bootstrap tenant is untouched.
        with gw.client() as c:
            c.create_table("still.here", SCHEMA, partitions=1)
    finally:
        gw.stop()


# --------------------------------------------------------------------------------------
# The admin API over HTTP, and the other quotas
# --------------------------------------------------------------------------------------
def test_http_admin_lifecycle(gateway: GatewayProcess) -> None:
    name = f"h{secrets.token_hex(5)}"
    with gateway.http_client(api_key=gateway.operator_key) as op:
        made = op.post("/v1/admin/tenants", json={"name": name})
        assert made.status_code == 201 and made.json()["status"] == "active"
        assert http_failure(op.post("/v1/admin/tenants", json={"name": name}))[:2] == (
            409,
            "TENANT_ALREADY_EXISTS",
        )
        assert http_failure(op.post("/v1/admin/tenants", json={"name": "../x"}))[0] == 400
        assert name in [t["name"] for t in op.get("/v1/admin/tenants").json()["tenants"]]
        issued = op.post(f"/v1/admin/tenants/{name}/keys").json()
        key, key_id = issued["api_key"], issued["key_id"]
        assert key.startswith(f"tg_{key_id}_")
        assert op.get(f"/v1/admin/tenants/{name}/keys").json()["keys"] == [
            {k: issued[k] for k in ("key_id", "tenant", "created_at", "revoked")}
        ]
        quota = op.put(f"/v1/admin/tenants/{name}/quota", json={"max_partitions": 3})
        assert quota.json()["max_partitions"] == 3 and quota.json()["max_tables"] is None
        assert op.get(f"/v1/admin/tenants/{name}/quota").json()["max_partitions"] == 3

        with gateway.http_client(api_key=key) as http:
            spec = {"namespace": "n", "schema": {"v": "int64"}, "partitions": 2}
            assert http.post("/v1/tables", json={**spec, "name": "a"}).status_code == 201
            over = http.post("/v1/tables", json={**spec, "name": "b"})
            assert http_failure(over)[:2] == (429, "QUOTA_EXCEEDED")
            assert "retry-after" not in over.headers
            assert op.post(f"/v1/admin/tenants/{name}/suspend").json()["status"] == "suspended"
            assert http_failure(http.get("/v1/tables"))[:2] == (403, "TENANT_SUSPENDED")
            assert op.post(f"/v1/admin/tenants/{name}/resume").json()["status"] == "active"
            assert http.get("/v1/tables").status_code == 200
            usage = op.get(f"/v1/admin/tenants/{name}/usage").json()
            # Two creates and the list after resuming; the refused list did no work.
            assert sum(r["requests"] for r in usage["usage"]) == 3
            assert op.delete(f"/v1/admin/keys/{key_id}").status_code == 204
            assert http_failure(http.get("/v1/tables"))[:2] == (401, "UNAUTHENTICATED")
        assert op.delete(f"/v1/admin/tenants/{name}").status_code == 204
        assert http_failure(op.get(f"/v1/admin/tenants/{name}"))[:2] == (404, "TENANT_NOT_FOUND")


def test_read_request_and_hot_bytes_quotas(gateway: GatewayProcess) -> None:
    t = new_tenant(gateway)
    body = payload(200)
    with gateway.client(api_key=t.key) as c:
        c.create_table("r.t", SCHEMA, partitions=1)
        c.append_ipc("r.t", body)
        c.append_ipc("r.t", body)
        hot = c.describe_table("r.t").partition_info[0].hot_bytes
    with gateway.admin() as admin:
        admin.set_quota(t.name, read_bytes_per_s=100, max_hot_bytes=hot)
    time.sleep(1.1)  # the quotas are cached for a second per gateway
    with gateway.client(api_key=t.key) as c:
        assert c.read("r.t", partition=0, offset=0).num_rows == 400  # the read leaves debt
        with pytest.raises(Throttled) as read_err:
            c.read("r.t", partition=0, offset=0)
        assert read_err.value.details["quota"] == "read_bytes_per_s"
        with pytest.raises(Throttled) as hot_err:
            c.append_ipc("r.t", body)
        assert hot_err.value.details["quota"] == "max_hot_bytes"
    with gateway.admin() as admin:
        admin.set_quota(t.name, read_bytes_per_s=-1, max_hot_bytes=-1, requests_per_s=2)
    time.sleep(1.1)
    with gateway.http_client(api_key=t.key) as http:
        codes = [http.get("/v1/tables").status_code for _ in range(6)]
        assert codes[:2] == [200, 200] and 429 in codes


def _scan_plan_attempts(gw: GatewayProcess, a: Tenant, ns: str, name: str) -> dict[str, Any]:
    """Tenant A's scans and read plans of ``ns.name`` over gRPC and HTTP, as outcomes."""
    out: dict[str, Any] = {}
    ref = pb.TableRef(namespace=ns, name=name)
    with gw.channel(api_key=a.key) as ch:
        stub = pb_grpc.TidegateStub(ch)
        calls: dict[str, Callable[[], Any]] = {
            "scan": lambda: stub.Scan(pb.ScanRequest(table=ref), timeout=10),
            "scan as_of": lambda: stub.Scan(pb.ScanRequest(table=ref, as_of="1"), timeout=10),
            "plan": lambda: stub.PlanRead(pb.PlanReadRequest(table=ref), timeout=10),
        }
        for label, call in calls.items():
            code, reason, message, _ = grpc_failure(call)
            out[f"grpc {label}"] = (code, reason, message)
    with gw.http_client(api_key=a.key) as http:
        for label, path in (("scan", "scan"), ("plan", "plan")):
            resp = http.post(f"/v1/tables/{ns}/{name}/{path}", json={})
            out[f"http {label}"] = http_failure(resp)
    return out


def _tiered(gw: GatewayProcess, key: str, table: str) -> None:
    """Wait until the gateway's own tiering schedule moved every record to Iceberg."""
    deadline = time.monotonic() + 60
    with gw.client(api_key=key) as c:
        while time.monotonic() < deadline:
            info = c.describe_table(table)
            if all(p.tiered_watermark == p.high_watermark > 0 for p in info.partition_info):
                return
            time.sleep(0.2)
    raise AssertionError(f"{table} was not tiered within 60 s")


def _linked_rows(url: str, column: str) -> list[Any]:
    """The values of ``column`` in the data file a plan's link serves."""
    body = httpx.get(url, timeout=30).raise_for_status().content
    return list(pq.read_table(pa.BufferReader(body)).column(column).to_pylist())


def test_local_read_plans_link_files_through_the_gateway(tmp_path: Path) -> None:
    """Issue 33.10: a plan over a local warehouse names each data file by a link through
    the gateway (sealed for the tenant and the file, with an expiry), on both edges, and
    shows no path of the server (before: the file's absolute path). The link serves the
    file and its ranges; an altered link or another path is not found."""
    env = {**gateway_env("disk", None), "TIDEGATE_TIERING__INTERVAL_S": "0.3"}
    gw = GatewayProcess(tmp_path / "gw", env).start()
    try:
        t = new_tenant(gw, "p")
        with gw.client(api_key=t.key) as c:
            c.create_table("plans.t", SCHEMA, partitions=1)
            c.append("plans.t", [{"v": i, "s": "x"} for i in range(50)], partition=0)
        _tiered(gw, t.key, "plans.t")
        with gw.client(api_key=t.key) as c:
            grpc_files = list(c.plan_read("plans.t").files)
        with gw.http_client(api_key=t.key) as http:
            plan = http.post("/v1/tables/plans/t/plan", json={})
        assert plan.status_code == 200, plan.text
        http_files = plan.json()["files"]
        assert str(tmp_path) not in plan.text and "/warehouse/" not in plan.text
        links = [f.url for f in grpc_files] + [f["url"] for f in http_files]
        assert links and all(u.startswith(f"{gw.http_url}/v1/files/") for u in links)
        assert all(f.expires_at_ms > 0 for f in grpc_files) and http_files[0]["expires_at"]
        assert sorted(_linked_rows(links[0], "v")) == list(range(50))
        ranged = httpx.get(links[0], headers={"range": "bytes=0-3"})
        assert (ranged.status_code, ranged.content) == (206, b"PAR1")
        altered = httpx.get(links[0][:-4] + "AAAA")
        assert (altered.status_code, altered.json()["error"]["reason"]) == (404, "NOT_FOUND")
        assert "plan the read again" in altered.json()["error"]["message"]
        assert httpx.get(f"{gw.http_url}/v1/files/..%2F..%2Fmetadata.db").status_code == 404
    finally:
        gw.stop()


def test_scans_and_read_plans_stay_inside_the_tenant(tmp_path: Path) -> None:
    env = {**gateway_env("disk", None), "TIDEGATE_TIERING__INTERVAL_S": "0.3"}
    gw = GatewayProcess(tmp_path / "gw", env).start()
    try:
        a, b = new_tenant(gw, "a"), new_tenant(gw, "b")
        ns, name, table = "shared", "secret", "shared.secret"
        before = _scan_plan_attempts(gw, a, ns, name)
        with gw.client(api_key=b.key) as c:
            c.create_table(table, SCHEMA, partitions=1)
            c.append(table, [{"v": 1, "s": "b"}, {"v": 2, "s": "b"}], partition=0)
        _tiered(gw, b.key, table)
        with gw.client(api_key=b.key) as c:
            b_rows = c.scan(table).to_pylist()
            b_files = [f.url for f in c.plan_read(table).files]
        assert b_files and all(_linked_rows(u, "s") == ["b", "b"] for u in b_files)
        after = _scan_plan_attempts(gw, a, ns, name)
        assert after == before, "B's table must be invisible to A, and indistinguishable"
        assert all(v[1] == "TABLE_NOT_FOUND" for v in after.values())
        # A's own table of the same name plans only A's files.
        with gw.client(api_key=a.key) as c:
            c.create_table(table, SCHEMA, partitions=1)
            c.append(table, [{"v": 9, "s": "a"}], partition=0)
        _tiered(gw, a.key, table)
        with gw.client(api_key=a.key) as c:
            assert c.scan(table).column("s").to_pylist() == ["a"]
            a_files = [f.url for f in c.plan_read(table).files]
        assert a_files and all(_linked_rows(u, "s") == ["a"] for u in a_files)
        with gw.client(api_key=b.key) as c:
            assert c.scan(table).to_pylist() == b_rows
    finally:
        gw.stop()
