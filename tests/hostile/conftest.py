"""Hostile input against a real gateway process: what one tenant sends must neither crash,
freeze nor bloat the gateway, nor touch another tenant's data.

One gateway (disk hot tier, embedded tiering every second) serves the module; each test
makes tenants of its own through the admin API.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pyarrow as pa
import pytest

from gateway.client import AdminClient
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.codec import encode_stream
from tests.services import GatewayProcess, free_port

ARROW = "application/vnd.apache.arrow.stream"


@dataclass
class Tenant:
    """A tenant of the hostile gateway, with both edges at hand."""

    gw: GatewayProcess
    name: str
    key: str
    key_id: str

    def http(self, **kwargs: Any) -> httpx.Client:
        return self.gw.http_client(api_key=self.key, **kwargs)

    def stub(self) -> pb_grpc.TidegateStub:
        return pb_grpc.TidegateStub(self.gw.channel(api_key=self.key))

    def admin(self) -> AdminClient:
        return self.gw.admin()


def new_tenant(gw: GatewayProcess, prefix: str = "h") -> Tenant:
    name = f"{prefix}{secrets.token_hex(5)}"
    with gw.admin() as admin:
        admin.create_tenant(name)
        key_id, key = admin.issue_key(name)
    return Tenant(gw, name, key, key_id)


@pytest.fixture(scope="module")
def hostile_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    env = {
        "TIDEGATE_HOT__TYPE": "disk",
        "TIDEGATE_TIERING__INTERVAL_S": "1",
        "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
        "TIDEGATE_SERVER__MAX_REQUEST_BYTES": str(64 * 1024 * 1024),
        "TIDEGATE_QUOTA__MAX_FOLLOWS": "256",
        # The Kafka listener too: the fuzz suite mutates its frames.
        "TIDEGATE_KAFKA__PORT": str(free_port()),
    }
    gw = GatewayProcess(tmp_path_factory.mktemp("hostile"), env).start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def tenant(hostile_gateway: GatewayProcess) -> Tenant:
    return new_tenant(hostile_gateway)


def grpc_error(fn: Any) -> tuple[grpc.StatusCode, str, str]:
    """(status, reason, message) of a failing gRPC call."""
    from gateway.wire.status import error_from_rpc

    with pytest.raises(grpc.RpcError) as info:
        fn()
    err = error_from_rpc(info.value)
    return info.value.code(), err.reason, err.message


def http_error(resp: httpx.Response) -> tuple[int, str, str]:
    body = resp.json()["error"]
    return resp.status_code, body["reason"], body["message"]


def ipc(batch: pa.RecordBatch, compression: str = "none") -> bytes:
    return encode_stream([batch], batch.schema, compression)  # type: ignore[arg-type]


def string_offsets_at(data: bytes, values: list[str]) -> int:
    """Where the int32 offsets buffer of a string column holding ``values`` starts."""
    offsets, at = [0], 0
    for v in values:
        at += len(v.encode())
        offsets.append(at)
    raw = struct.pack(f"<{len(offsets)}i", *offsets)
    where = data.find(raw)
    assert where > 0, "offsets buffer not found"
    return where


def bad_offsets_body() -> bytes:
    """A string column whose last offset points far outside its data buffer."""
    values = ["ab", "cd"]
    data = bytearray(ipc(pa.record_batch({"id": [1, 2], "name": values})))
    at = string_offsets_at(bytes(data), values)
    data[at + 8 : at + 12] = struct.pack("<i", 1 << 24)
    return bytes(data)


def bad_utf8_body() -> bytes:
    """A string column holding bytes that are not UTF-8."""
    data = bytearray(ipc(pa.record_batch({"id": [1], "name": ["zz"]})))
    where = data.find(b"zz")
    data[where : where + 2] = b"\xff\xfe"
    return bytes(data)


def bad_struct_child_body() -> bytes:
    """A struct column whose string child has an offset outside its buffer."""
    values = ["ab", "cd"]
    batch = pa.record_batch(
        {
            "id": [1, 2],
            "name": ["x", "y"],
            "info": pa.array([{"k": v} for v in values], pa.struct([("k", pa.string())])),
        }
    )
    data = bytearray(ipc(batch))
    at = string_offsets_at(bytes(data), values)
    data[at + 8 : at + 12] = struct.pack("<i", 1 << 24)
    return bytes(data)


def table_ref(namespace: str, name: str) -> pb.TableRef:
    return pb.TableRef(namespace=namespace, name=name)
