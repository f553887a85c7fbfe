"""Hot records sent as stored, through a real gateway on both hot tiers: the SDK (which
asks for them) reads what a client that does not ask, the HTTP edge and the Flight edge
read, including a payload written by the earlier gateway's encoder under an older schema
(the compatibility case of the wire change)."""

from __future__ import annotations

import httpx
import pyarrow as pa
import pytest

from gateway.client import Client
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from tests.core.test_raw_reads import FIELDS, OLD_PAYLOAD, old_rows
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration


def _user_rows(table: pa.Table) -> list[dict[str, object]]:
    return table.drop_columns(["_timestamp"]).to_pylist()


def _old_client_read(gateway: GatewayProcess, table: str, offset: int, n: int) -> pa.Table:
    """A Read as a client built before ``raw_hot`` sends it (the field left unset)."""
    ns, name = table.split(".")
    with gateway.channel() as ch:
        stub = pb_grpc.TidegateStub(ch)
        request = pb.ReadRequest(
            table=pb.TableRef(namespace=ns, name=name), partition=0, offset=offset, max_records=n
        )
        batches: list[pa.RecordBatch] = []
        schema = None
        for msg in stub.Read(request):
            assert not msg.hot_batches
            if msg.arrow_ipc:
                reader = pa.ipc.open_stream(msg.arrow_ipc)
                schema = reader.schema
                batches.extend(reader)
    return pa.Table.from_batches(batches, schema)


def test_a_payload_stored_before_the_wire_change_reads_alike_on_every_edge(
    gateway: GatewayProcess, client: Client, http: httpx.Client, namespace: str
) -> None:
    table = f"{namespace}.old"
    client.create_table(table, FIELDS, partitions=1)
    # The bytes the earlier gateway stored, sent as an append body.
    client.append_ipc(table, OLD_PAYLOAD.read_bytes(), partition=0)
    client.alter_schema(
        table,
        [
            {"op": "update_type", "column": "id", "type": "int64"},
            {"op": "add_column", "column": "note", "type": "string"},
        ],
    )
    new = pa.table(
        {"id": [5_000], "name": ["new"], "score": pa.array([1.5], pa.float32()), "note": ["n"]}
    )
    client.append(table, new, partition=0)

    def want(lo: int, hi: int) -> list[dict[str, object]]:
        last = {"id": 5_000, "name": "new", "score": 1.5, "note": "n", "_partition": 0}
        return old_rows(lo, min(hi, 5_000)) + ([{**last, "_offset": 5_000}] if hi > 5_000 else [])

    for offset, n in [(0, 6_000), (830, 10), (4_990, 20), (1, 1)]:
        by_sdk = client.read(table, partition=0, offset=offset, max_records=n)
        assert _user_rows(by_sdk) == want(offset, offset + n)
        by_old = _old_client_read(gateway, table, offset, n)
        assert by_old.equals(by_sdk)
        r = http.get(
            f"/v1/tables/{namespace}/old/partitions/0/records",
            params={"offset": offset, "max_records": n},
            headers={"Accept": "application/vnd.apache.arrow.stream"},
        )
        assert r.status_code == 200, r.text
        assert pa.ipc.open_stream(r.content).read_all().equals(by_sdk)
        # Bulk reads (the Spark connector's hot ranges) go over Flight.
        ranged = pa.Table.from_batches(
            [b for chunk in client.read_range(table, partition=0, start=offset,
                                              end=min(offset + n, 5_001)) for b in chunk]
        )  # fmt: skip
        assert ranged.equals(by_sdk)
