"""Scan and read plans through both edges of a real gateway process: one on the shared
gateways (hot data, errors), one over Redis whose tables are tiered to an S3 warehouse
(moto's server) beside it, as `tidegate tier` does, while we read."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gateway.client import Client
from gateway.wire.errors import InvalidRequest, SnapshotNotFound
from tests.services import MotoServer, RedisServer
from tests.spark.conftest import LakeGateway, start_lake_gateway

pytestmark = pytest.mark.integration

ARROW = "application/vnd.apache.arrow.stream"
SCHEMA = [{"name": "v", "type": "int64", "nullable": False}, {"name": "tag", "type": "string"}]


def make_table(http: httpx.Client, namespace: str, partitions: int = 2) -> str:
    name = f"t{uuid.uuid4().hex[:8]}"
    r = http.post(
        "/v1/tables",
        json={"namespace": namespace, "name": name, "schema": SCHEMA, "partitions": partitions},
    )
    assert r.status_code == 201, r.text
    return name


def append(http: httpx.Client, namespace: str, name: str, start: int, n: int, p: int) -> None:
    rows = [{"v": i, "tag": f"r{i}" if i % 2 else None} for i in range(start, start + n)]
    r = http.post(f"/v1/tables/{namespace}/{name}/records", json={"rows": rows, "partition": p})
    assert r.status_code == 200, r.text


def test_scan_and_plan_over_http_and_grpc(
    http: httpx.Client, client: Client, namespace: str
) -> None:
    name = make_table(http, namespace)
    for p in (0, 1):
        append(http, namespace, name, 0, 30, p)
    base = f"/v1/tables/{namespace}/{name}"

    r = http.post(f"{base}/scan", json={})
    assert r.status_code == 200, r.text
    rows = r.json()["rows"]
    assert sorted((x["_partition"], x["_offset"]) for x in rows) == [
        (p, o) for p in (0, 1) for o in range(30)
    ]
    r = http.post(
        f"{base}/scan",
        json={"columns": ["v", "_partition"], "filter": "v < 10 and tag is not null", "limit": 50},
    )
    got = sorted((x["_partition"], x["v"]) for x in r.json()["rows"])
    assert got == [(p, v) for p in (0, 1) for v in range(1, 10, 2)]
    assert set(r.json()["rows"][0]) == {"v", "_partition"}

    r = http.post(f"{base}/scan", json={"limit": 7}, headers={"Accept": ARROW})
    assert r.headers["content-type"] == ARROW
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.num_rows == 7 and table.schema.names == [
        "v",
        "tag",
        "_partition",
        "_offset",
        "_timestamp",
    ]

    whole = pa.ipc.open_stream(
        http.post(f"{base}/scan", json={}, headers={"Accept": ARROW}).content
    ).read_all()
    assert sorted(
        zip(
            whole.column("_partition").to_pylist(), whole.column("_offset").to_pylist(), strict=True
        )
    ) == [(p, o) for p in (0, 1) for o in range(30)]
    empty = http.post(f"{base}/scan", json={"limit": 0}, headers={"Accept": ARROW})
    assert pa.ipc.open_stream(empty.content).read_all().num_rows == 0

    scanned = client.scan(f"{namespace}.{name}", columns=["v"], filter="v >= 25")
    assert sorted(scanned.column("v").to_pylist()) == sorted([25, 26, 27, 28, 29] * 2)
    assert client.scan(f"{namespace}.{name}", limit=3).num_rows == 3

    plan = http.post(f"{base}/plan", json={}).json()
    covered = {
        (h["partition"], o)
        for h in plan["hot_ranges"]
        for o in range(h["from_offset"], h["to_offset"])
    } | {
        (f["partition"], o)
        for f in plan["files"]
        for o in range(f["min_offset"], f["max_offset"] + 1)
    }
    assert covered == {(p, o) for p in (0, 1) for o in range(30)}
    assert [f["name"] for f in plan["schema"]][-3:] == ["_partition", "_offset", "_timestamp"]
    grpc_plan = client.plan_read(f"{namespace}.{name}")
    assert (
        sum(h.to_offset - h.from_offset for h in grpc_plan.hot_ranges)
        + sum(f.record_count for f in grpc_plan.files)
        == 60
    )


def test_scan_errors_are_clear(http: httpx.Client, client: Client, namespace: str) -> None:
    name = make_table(http, namespace)
    append(http, namespace, name, 0, 5, 0)
    base = f"/v1/tables/{namespace}/{name}"
    cases = [
        ({"filter": "v >>> 1"}, 400, "INVALID_REQUEST", "cannot parse filter"),
        ({"filter": "nope = 1"}, 400, "INVALID_REQUEST", "nope"),
        ({"columns": ["v", "nope"]}, 400, "INVALID_REQUEST", "unknown column"),
        ({"as_of": 12345}, 404, "SNAPSHOT_NOT_FOUND", "12345"),
        ({"as_of": "1999-01-01T00:00:00Z"}, 404, "SNAPSHOT_NOT_FOUND", "1999"),
        ({"as_of": "last tuesday"}, 400, "INVALID_REQUEST", "as_of"),
        ({"limit": -1}, 400, "INVALID_REQUEST", "limit"),
        ({"colums": ["v"]}, 400, "INVALID_REQUEST", "colums"),
    ]
    for body, status, reason, words in cases:
        for route in ("scan", "plan"):
            if route == "plan" and set(body) - {"filter", "as_of"}:
                continue
            r = http.post(f"{base}/{route}", json=body)
            assert r.status_code == status, (route, body, r.text)
            err = r.json()["error"]
            assert err["reason"] == reason and words in err["message"], (route, body, err)
    r = http.post(f"/v1/tables/{namespace}/missing/scan", json={})
    assert r.status_code == 404 and r.json()["error"]["reason"] == "TABLE_NOT_FOUND"

    with pytest.raises(InvalidRequest, match="cannot parse filter"):
        client.scan(f"{namespace}.{name}", filter="v >>> 1")
    with pytest.raises(SnapshotNotFound):
        client.scan(f"{namespace}.{name}", as_of=12345)
    with pytest.raises(SnapshotNotFound):
        client.plan_read(f"{namespace}.{name}", as_of="1999-01-01T00:00:00Z")


# A gateway whose tables are tiered to S3 ------------------------------------------------
@pytest.fixture(scope="module")
def s3_lake(
    moto_server: MotoServer, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LakeGateway]:
    """Tiered by the test, not by an embedded schedule: a pass of that (every 0.5 s here
    before) could move the records the test appends after tiering, which it expects hot,
    before it plans a read of them (it did, on a loaded machine)."""
    bucket = moto_server.create_bucket(f"gw-{uuid.uuid4().hex[:10]}")
    warehouse = f"s3://{bucket}/warehouse"
    lake = start_lake_gateway(
        tmp_path_factory.mktemp("gw-s3"),
        redis_server,
        moto_server.gateway_env(warehouse),
        {"warehouse": warehouse, "s3": moto_server.cold_s3_settings()},
    )
    try:
        yield lake
    finally:
        lake.gateway.stop()


def test_records_tiered_to_s3_read_the_same_through_every_path(s3_lake: LakeGateway) -> None:
    s3_gateway = s3_lake.gateway
    ns = f"ns{uuid.uuid4().hex[:8]}"
    with s3_gateway.http_client() as http, s3_gateway.client() as client:
        name = make_table(http, ns, partitions=1)
        for i in range(4):
            append(http, ns, name, i * 25, 25, 0)
        before = client.read(f"{ns}.{name}", partition=0, offset=0).to_pylist()
        s3_lake.tier(f"{ns}.{name}")
        info = http.get(f"/v1/tables/{ns}/{name}").json()["partition_info"][0]
        assert info["tiered_watermark"] == 100, info
        # Appended after tiering: the read crosses the boundary.
        append(http, ns, name, 100, 10, 0)
        after = client.read(f"{ns}.{name}", partition=0, offset=0).to_pylist()
        assert after[:100] == before
        assert [r["_offset"] for r in after] == list(range(110))
        r = http.get(f"/v1/tables/{ns}/{name}/partitions/0/records", params={"offset": 90})
        assert [x["v"] for x in r.json()["records"]] == list(range(90, 110))

        scanned = client.scan(f"{ns}.{name}")  # over the Flight edge: files on S3
        assert client.flight_location() is not None
        assert sorted(scanned.to_pylist(), key=lambda x: x["_offset"]) == after
        with s3_gateway.client(flight=False) as plain:
            assert (
                sorted(plain.scan(f"{ns}.{name}").to_pylist(), key=lambda x: x["_offset"]) == after
            )

        plan = http.post(f"/v1/tables/{ns}/{name}/plan", json={}).json()
        assert plan["snapshot_id"] and plan["files"]
        assert plan["hot_ranges"] == [{"partition": 0, "from_offset": 100, "to_offset": 110}]
        offsets: list[int] = []
        for f in plan["files"]:
            assert f["url"].startswith("http") and f["expires_at"]
            body = httpx.get(f["url"]).raise_for_status().content  # presigned: no keys
            offsets += pq.read_table(pa.BufferReader(body)).column("_offset").to_pylist()
        assert sorted(offsets) == list(range(100))

        old = http.post(f"/v1/tables/{ns}/{name}/scan", json={"as_of": plan["snapshot_id"]}).json()
        assert sorted(x["_offset"] for x in old["rows"]) == list(range(100))
