"""Every bad input over gRPC and HTTP: the documented status and reason, nothing stored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pyarrow as pa
import pytest
from google.rpc import error_details_pb2, status_pb2

from gateway.client import Client
from gateway.client._sync import _ipc
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration

ARROW = "application/vnd.apache.arrow.stream"
#: The integration gateways run with TIDEGATE_SERVER__MAX_REQUEST_BYTES=1 MiB.
LIMIT = 1024 * 1024


def grpc_error(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """Make a raw gRPC call that must fail; its code, ErrorInfo reason and metadata."""
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, bytes):
            list(result)
    exc: Any = info.value
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for d in status.details:
                if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    ei = error_details_pb2.ErrorInfo()
                    d.Unpack(ei)
                    assert ei.domain == "tidegate.dev"
                    return exc.code(), ei.reason, dict(ei.metadata)
    raise AssertionError(f"no ErrorInfo in the status of {exc}")


def http_error(resp: httpx.Response) -> tuple[int, str, dict[str, Any]]:
    body = resp.json()
    assert "error" in body, body
    return resp.status_code, body["error"]["reason"], body["error"]


@pytest.fixture
def stub(gateway: GatewayProcess) -> Any:
    with gateway.channel(options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        yield pb_grpc.TidegateStub(ch)


@pytest.fixture
def table(client: Client, namespace: str) -> pb.TableRef:
    client.create_table(f"{namespace}.t", {"id": "int64", "name": "string"}, partitions=2)
    client.append(f"{namespace}.t", [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}], partition=0)
    return pb.TableRef(namespace=namespace, name="t")


def snapshot(client: Client, ref: pb.TableRef) -> tuple[list[int], list[dict[str, Any]]]:
    """High watermarks and every record, to prove nothing changed."""
    name = f"{ref.namespace}.{ref.name}"
    info = client.describe_table(name)
    rows = []
    for p in info.partition_info:
        rows.extend(client.read(name, partition=p.partition, offset=0).to_pylist())
    return [p.high_watermark for p in info.partition_info], rows


BAD_ROWS = {
    "extra column": [{"id": 1, "name": "x", "zzz": 1}],
    "missing column": [{"id": 1}],
    "mistyped column": [{"id": "one", "name": "x"}],
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_schema_mismatch(
    case: str, stub: Any, http: httpx.Client, client: Client, table: pb.TableRef
) -> None:
    before = snapshot(client, table)
    rows = BAD_ROWS[case]
    code, reason, _ = grpc_error(
        lambda: stub.Append(pb.AppendRequest(table=table, arrow_ipc=_ipc(rows)))
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "SCHEMA_MISMATCH")
    url = f"/v1/tables/{table.namespace}/{table.name}/records"
    assert http_error(http.post(url, json={"rows": rows}))[:2] == (400, "SCHEMA_MISMATCH")
    assert http_error(http.post(url, content=_ipc(rows), headers={"content-type": ARROW}))[:2] == (
        400,
        "SCHEMA_MISMATCH",
    )
    assert snapshot(client, table) == before


def test_unknown_table(stub: Any, http: httpx.Client, namespace: str) -> None:
    ref = pb.TableRef(namespace=namespace, name="nope")
    ipc = _ipc([{"id": 1}])
    for call in (
        lambda: stub.Append(pb.AppendRequest(table=ref, arrow_ipc=ipc)),
        lambda: stub.DescribeTable(pb.DescribeTableRequest(table=ref)),
        lambda: stub.DropTable(pb.DropTableRequest(table=ref)),
        lambda: stub.Read(pb.ReadRequest(table=ref, partition=0, offset=0)),
    ):
        assert grpc_error(call)[:2] == (grpc.StatusCode.NOT_FOUND, "TABLE_NOT_FOUND")
    base = f"/v1/tables/{namespace}/nope"
    for resp in (
        http.post(f"{base}/records", json={"rows": [{"id": 1}]}),
        http.get(base),
        http.delete(base),
        http.get(f"{base}/partitions/0/records", params={"offset": 0}),
    ):
        assert http_error(resp)[:2] == (404, "TABLE_NOT_FOUND")


def test_bad_partition(stub: Any, http: httpx.Client, client: Client, table: pb.TableRef) -> None:
    before = snapshot(client, table)
    ipc = _ipc([{"id": 9, "name": "z"}])
    for p in (2, -1):
        code, reason, meta = grpc_error(
            lambda p=p: stub.Append(pb.AppendRequest(table=table, arrow_ipc=ipc, partition=p))
        )
        assert (code, reason, meta["partitions"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PARTITION",
            "2",
        )
        code, reason, _ = grpc_error(
            lambda p=p: stub.Read(pb.ReadRequest(table=table, partition=p, offset=0))
        )
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARTITION")
    base = f"/v1/tables/{table.namespace}/{table.name}"
    assert http_error(
        http.post(f"{base}/records", json={"rows": [{"id": 9, "name": "z"}], "partition": 5})
    )[:2] == (
        400,
        "INVALID_PARTITION",
    )
    assert http_error(http.get(f"{base}/partitions/7/records", params={"offset": 0}))[:2] == (
        400,
        "INVALID_PARTITION",
    )
    assert snapshot(client, table) == before


@pytest.mark.parametrize("offset", [-1, 3, 1000])
def test_offset_out_of_range(
    offset: int, stub: Any, http: httpx.Client, table: pb.TableRef
) -> None:
    code, reason, meta = grpc_error(
        lambda: stub.Read(pb.ReadRequest(table=table, partition=0, offset=offset))
    )
    assert (code, reason) == (grpc.StatusCode.OUT_OF_RANGE, "OFFSET_OUT_OF_RANGE")
    assert (meta["earliest"], meta["latest"]) == ("0", "2")
    status, reason, body = http_error(
        http.get(
            f"/v1/tables/{table.namespace}/{table.name}/partitions/0/records",
            params={"offset": offset},
        )
    )
    assert (status, reason, body["earliest"], body["latest"]) == (416, "OFFSET_OUT_OF_RANGE", 0, 2)


def test_oversized_request(
    stub: Any, http: httpx.Client, client: Client, table: pb.TableRef
) -> None:
    before = snapshot(client, table)
    big = pa.table({"id": pa.array(range(1000), pa.int64()), "name": ["x" * 1500] * 1000})
    ipc = _ipc(big)
    assert LIMIT < len(ipc) < 2 * LIMIT
    code, reason, meta = grpc_error(
        lambda: stub.Append(pb.AppendRequest(table=table, arrow_ipc=ipc))
    )
    assert (code, reason, meta["limit"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "REQUEST_TOO_LARGE",
        str(LIMIT),
    )
    url = f"/v1/tables/{table.namespace}/{table.name}/records"
    assert http_error(http.post(url, content=ipc, headers={"content-type": ARROW}))[:2] == (
        413,
        "REQUEST_TOO_LARGE",
    )
    rows = {"rows": [{"id": i, "name": "x" * 1500} for i in range(1000)]}
    assert http_error(http.post(url, json=rows))[:2] == (413, "REQUEST_TOO_LARGE")
    assert snapshot(client, table) == before


@pytest.mark.parametrize(
    "payload",
    [b"", b"not arrow at all", b"\xff\xff\xff\xff\x10\x00\x00\x00garbage-garbage!"],
    ids=["empty", "text", "bad-flatbuffer"],
)
def test_malformed_arrow(
    payload: bytes, stub: Any, http: httpx.Client, client: Client, table: pb.TableRef
) -> None:
    before = snapshot(client, table)
    code, reason, _ = grpc_error(
        lambda: stub.Append(pb.AppendRequest(table=table, arrow_ipc=payload))
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_PAYLOAD")
    url = f"/v1/tables/{table.namespace}/{table.name}/records"
    assert http_error(http.post(url, content=payload, headers={"content-type": ARROW}))[:2] == (
        400,
        "MALFORMED_PAYLOAD",
    )
    assert snapshot(client, table) == before


def test_truncated_arrow_stream(stub: Any, client: Client, table: pb.TableRef) -> None:
    before = snapshot(client, table)
    ipc = _ipc([{"id": 5, "name": "q"}] * 50)
    code, reason, _ = grpc_error(
        lambda: stub.Append(pb.AppendRequest(table=table, arrow_ipc=ipc[: len(ipc) - 40]))
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_PAYLOAD")
    assert snapshot(client, table) == before


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"rows": "nope"}', b'{"rows": []}', b'{"rows": [1, 2]}', b"\xff\xfe"],
    ids=["syntax", "rows-not-list", "rows-empty", "rows-not-objects", "not-utf8"],
)
def test_malformed_json(
    body: bytes, http: httpx.Client, client: Client, table: pb.TableRef
) -> None:
    before = snapshot(client, table)
    resp = http.post(
        f"/v1/tables/{table.namespace}/{table.name}/records",
        content=body,
        headers={"content-type": "application/json"},
    )
    status, reason, _ = http_error(resp)
    assert status == 400 and reason in ("MALFORMED_PAYLOAD", "INVALID_REQUEST")
    assert snapshot(client, table) == before


def test_columns_that_differ_only_in_case_are_refused(
    stub: Any, http: httpx.Client, namespace: str
) -> None:
    """Issue 33.10: ``a`` and ``A`` cannot coexist (Spark and DuckDB match names without
    case), at creation on both edges and by a schema change; one sentence names both."""
    req = pb.CreateTableRequest(
        table=pb.TableRef(namespace=namespace, name="cased"),
        fields=[pb.Field(name="a", type="int64"), pb.Field(name="A", type="string")],
        partitions=1,
    )
    code, reason, _ = grpc_error(lambda: stub.CreateTable(req))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SCHEMA")
    spec = {"namespace": namespace, "name": "cased", "partitions": 1}
    resp = http.post("/v1/tables", json={**spec, "schema": {"a": "int64", "A": "string"}})
    status, reason, body = http_error(resp)
    assert (status, reason) == (400, "INVALID_SCHEMA")
    assert "columns 'a' and 'A' differ only in case" in body["message"]
    assert http.post("/v1/tables", json={**spec, "schema": {"a": "int64"}}).status_code == 201
    resp = http.post(
        f"/v1/tables/{namespace}/cased/schema",
        json={"changes": [{"op": "add_column", "column": "A", "type": "string"}]},
    )
    status, reason, body = http_error(resp)
    assert (status, reason) == (400, "SCHEMA_CHANGE_REFUSED")
    assert "'a', which differs from it only in case" in body["message"]


def test_invalid_schema_at_create(stub: Any, http: httpx.Client, namespace: str) -> None:
    for fields in (
        [pb.Field(name="x", type="uint64")],
        [pb.Field(name="x", type="timestamp[ns]")],
        [pb.Field(name="_offset", type="int64")],
        [pb.Field(name="x", type="int64"), pb.Field(name="x", type="string")],
        [],
    ):
        req = pb.CreateTableRequest(
            table=pb.TableRef(namespace=namespace, name="bad"), fields=fields, partitions=1
        )
        assert grpc_error(lambda req=req: stub.CreateTable(req))[:2] == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_SCHEMA",
        )
    resp = http.post(
        "/v1/tables",
        json={
            "namespace": namespace,
            "name": "bad",
            "schema": [{"name": "x", "type": "decimal128(99, 2)"}],
            "partitions": 1,
        },
    )
    assert http_error(resp)[:2] == (400, "INVALID_SCHEMA")
    resp = http.post(
        "/v1/tables",
        json={"namespace": namespace, "name": "bad", "schema": {"x": "int64"}, "partitions": 0},
    )
    assert http_error(resp)[:2] == (400, "INVALID_REQUEST")
    assert http.get(f"/v1/tables/{namespace}/bad").status_code == 404


def test_idempotence_misuse(stub: Any, client: Client, table: pb.TableRef) -> None:
    before = snapshot(client, table)
    ipc = _ipc([{"id": 3, "name": "c"}])
    code, reason, _ = grpc_error(
        lambda: stub.Append(
            pb.AppendRequest(table=table, arrow_ipc=ipc, partition=0, producer_id="p1")
        )
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IDEMPOTENT_APPEND")
    assert snapshot(client, table) == before
