"""Issue 18.2: a revoked key's or a suspended tenant's open follow stream ends, and
receives nothing appended after the change (gRPC streams and HTTP long polls)."""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import httpx
import pyarrow as pa

from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.status import error_from_rpc
from tests.hostile.conftest import Tenant, new_tenant, table_ref
from tests.services import GatewayProcess


class Follower(threading.Thread):
    """A gRPC follow stream consumed on a thread: the ids it got and how it ended."""

    def __init__(self, gw: GatewayProcess, key: str) -> None:
        super().__init__(daemon=True)
        self.stub = pb_grpc.TidegateStub(gw.channel(api_key=key))
        self.ids: list[int] = []
        self.error: grpc.RpcError | None = None
        self.started_reading = threading.Event()
        self.call: Any = None

    def run(self) -> None:
        self.call = self.stub.Read(
            pb.ReadRequest(table=table_ref("r", "t"), partition=0, offset=0, follow=True)
        )
        self.started_reading.set()
        try:
            for msg in self.call:
                if msg.arrow_ipc:
                    self.ids += (
                        pa.ipc.open_stream(msg.arrow_ipc).read_all().column("id").to_pylist()
                    )
        except grpc.RpcError as exc:
            self.error = exc


def append(t: Tenant, key: str, ids: list[int]) -> None:
    with t.gw.http_client(api_key=key) as http:
        r = http.post("/v1/tables/r/t/records", json={"rows": [{"id": i} for i in ids]})
        assert r.status_code == 200, r.text


def setup(gw: GatewayProcess) -> tuple[Tenant, str]:
    t = new_tenant(gw)
    with t.http() as http:
        r = http.post(
            "/v1/tables",
            json={"namespace": "r", "name": "t", "schema": {"id": "int64"}, "partitions": 1},
        )
        assert r.status_code == 201
    with gw.admin() as admin:
        _, writer = admin.issue_key(t.name)
    return t, writer


def wait_for(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_revoked_keys_stream_ends_and_gets_nothing_new(hostile_gateway: GatewayProcess) -> None:
    t, writer = setup(hostile_gateway)
    follower = Follower(hostile_gateway, t.key)
    follower.start()
    follower.started_reading.wait(5)
    append(t, writer, [1, 2])
    wait_for(lambda: follower.ids == [1, 2])
    with hostile_gateway.admin() as admin:
        admin.revoke_key(t.key_id)
    revoked_at = time.monotonic()
    append(t, writer, [3])  # right after the revocation
    follower.join(10)
    assert not follower.is_alive(), "the stream did not end"
    assert follower.error is not None
    assert follower.error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert time.monotonic() - revoked_at < 5
    assert follower.ids == [1, 2], "a record appended after the revocation was delivered"


def test_a_suspended_tenants_idle_stream_ends(hostile_gateway: GatewayProcess) -> None:
    t, writer = setup(hostile_gateway)
    follower = Follower(hostile_gateway, t.key)
    follower.start()
    follower.started_reading.wait(5)
    append(t, writer, [1])
    wait_for(lambda: follower.ids == [1])
    with hostile_gateway.admin() as admin:
        admin.suspend_tenant(t.name)
    # Nothing more is appended: the waiting stream re-checks on its own.
    follower.join(10)
    assert not follower.is_alive(), "the idle stream did not end"
    assert follower.error is not None
    err = error_from_rpc(follower.error)
    assert follower.error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert err.reason == "TENANT_SUSPENDED"
    with hostile_gateway.admin() as admin:
        admin.resume_tenant(t.name)


def test_a_long_poll_of_a_revoked_key_answers_401(hostile_gateway: GatewayProcess) -> None:
    t, writer = setup(hostile_gateway)
    answer: dict[str, httpx.Response] = {}

    def poll() -> None:
        with t.http(timeout=30) as http:
            answer["r"] = http.get(
                "/v1/tables/r/t/partitions/0/records",
                params={"offset": 0, "follow": "true", "wait_ms": 15_000},
            )

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    time.sleep(0.5)  # the long poll is waiting
    with hostile_gateway.admin() as admin:
        admin.revoke_key(t.key_id)
    time.sleep(1.2)  # past the key cache of the gateway
    append(t, writer, [9])
    poller.join(20)
    r = answer["r"]
    assert r.status_code == 401, r.text
    assert r.json()["error"]["reason"] == "UNAUTHENTICATED"
