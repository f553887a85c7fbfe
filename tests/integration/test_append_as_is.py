"""Arrow bodies stored as the client sent them, through a real gateway on both hot tiers:
they read back row for row through gRPC Read, Scan and the HTTP edge; bodies the gateway
must conform or split still work; invalid values in a schema the gateway already knows are
refused and store nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pyarrow as pa
import pytest

from gateway.client import Client
from gateway.wire.codec import encode_stream
from gateway.wire.errors import MalformedPayload, SchemaMismatch
from tests.core.test_append_as_is import FIELDS, SCHEMA

pytestmark = pytest.mark.integration

ARROW = "application/vnd.apache.arrow.stream"


def rows(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "name": [f"é{i}" if i % 4 else None for i in range(start, start + n)],
            "at": pa.array(
                [1_700_000_000_000_000 + 7 * i for i in range(start, start + n)], SCHEMA[2].type
            ),
        },
        schema=SCHEMA,
    )


def ipc(*batches: pa.RecordBatch, compression: str = "none") -> bytes:
    return encode_stream(batches, batches[0].schema, compression)  # type: ignore[arg-type]


def user_rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.select(SCHEMA.names).to_pylist()


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
def test_a_body_stored_as_it_came_reads_back_row_for_row(
    client: Client, http: httpx.Client, namespace: str, compression: str
) -> None:
    table = f"{namespace}.asis"
    client.create_table(table, FIELDS, partitions=2)
    sent = [rows(0, 50), rows(50, 30)]
    client.append_ipc(table, ipc(sent[0], compression=compression), partition=1)
    r = http.post(
        f"/v1/tables/{namespace}/asis/records",
        params={"partition": 1},
        content=ipc(sent[1], rows(80, 20), compression=compression),
        headers={"content-type": ARROW},
    )
    assert r.status_code == 200, r.text
    want = pa.Table.from_batches([rows(0, 100)]).to_pylist()

    got = client.read(table, partition=1, offset=0)
    assert user_rows(got) == want
    assert got.column("_offset").to_pylist() == list(range(100))
    assert client.read(table, partition=0, offset=0).num_rows == 0
    middle = client.read(table, partition=1, offset=60, max_records=30)
    assert user_rows(middle) == want[60:90]
    assert sorted(user_rows(client.scan(table)), key=lambda row: row["id"]) == want

    answer = http.get(f"/v1/tables/{namespace}/asis/partitions/1/records").json()
    assert [rec["id"] for rec in answer["records"]] == list(range(100))
    assert [rec["name"] for rec in answer["records"]] == [w["name"] for w in want]
    arrow = http.get(f"/v1/tables/{namespace}/asis/partitions/1/records", headers={"accept": ARROW})
    assert user_rows(pa.ipc.open_stream(arrow.content).read_all()) == want


def test_bodies_that_must_be_conformed_or_split_still_work(client: Client, namespace: str) -> None:
    table = f"{namespace}.keyed"
    client.create_table(table, FIELDS, partitions=4, key_columns=["id"])
    client.append_ipc(table, ipc(rows(0, 20).select(["at", "id", "name"])))
    widened = pa.record_batch(
        {
            "id": pa.array([20, 21], pa.int32()),
            "name": ["a", "b"],
            "at": pa.array([None, None], pa.timestamp("ms", tz="UTC")),
        }
    )
    client.append_ipc(table, ipc(widened))
    got = pa.concat_tables([client.read(table, partition=p, offset=0) for p in range(4)])
    assert sum(1 for p in range(4) if client.read(table, partition=p, offset=0).num_rows) > 1
    want = [
        *pa.Table.from_batches([rows(0, 20)]).to_pylist(),
        {"id": 20, "name": "a", "at": None},
        {"id": 21, "name": "b", "at": None},
    ]
    assert sorted(user_rows(got), key=lambda row: row["id"]) == want


def _high_watermark(client: Client, table: str) -> int:
    return client.describe_table(table).partition_info[0].high_watermark


def test_invalid_values_in_a_known_schema_are_refused_and_store_nothing(
    client: Client, http: httpx.Client, namespace: str
) -> None:
    table = f"{namespace}.bad"
    client.create_table(table, FIELDS)
    client.append_ipc(table, ipc(rows(0, 3)))  # the gateway now knows this schema message
    nulls = rows(3, 2).set_column(0, SCHEMA[0], pa.array([5, None], pa.int64()))
    far = rows(3, 1).set_column(2, SCHEMA[2], pa.array([300_000_000_000_000_000], SCHEMA[2].type))
    text = bytearray(ipc(rows(5, 2).set_column(1, SCHEMA[1], pa.array(["zz", "yy"]))))
    text[text.find(b"zz") : text.find(b"zz") + 2] = b"\xff\xfe"
    cases: list[tuple[bytes, type[Exception], str]] = [
        (ipc(nulls), SchemaMismatch, "column 'id' is not nullable but holds nulls"),
        (
            ipc(far),
            SchemaMismatch,
            "column 'at' holds timestamp[us, tz=UTC] value 300000000000000000, outside "
            "years 1 to 9999",
        ),
        (bytes(text), MalformedPayload, "record batch 0 of the body is invalid"),
    ]
    for data, error, message in cases:
        with pytest.raises(error) as err:
            client.append_ipc(table, data, partition=0)
        assert message in str(err.value)
        r = http.post(
            f"/v1/tables/{namespace}/bad/records", content=data, headers={"content-type": ARROW}
        )
        assert r.status_code == 400 and message in r.json()["error"]["message"]
    assert _high_watermark(client, table) == 3
    assert user_rows(client.read(table, partition=0, offset=0)) == rows(0, 3).to_pylist()
