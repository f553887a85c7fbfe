"""Batch reads of a primary-key table through both connectors, on both hot tiers: its
current state (one row per live key, no ``_change``), read by one Spark task per table
partition from the gateway's scan of it, equal to a model of the writes, to the replayed
changelog and to the gateway's own scan, with changes held partly in the state table
(tiered twice) and partly in the hot tier; with a filter and a projection too."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from tests.keytables import USER, Key, replay
from tests.spark.conftest import LakeGateway
from tests.spark.test_read import gateway_rows, spark_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration]

SCHEMA = {"id": "int64", "region": "string", "v": "int64", "note": "string"}
PARTITIONS = 3


@dataclass
class KeyTable:
    lake: LakeGateway
    table: str
    #: The live rows by key, as the acknowledged writes leave them (last row wins).
    model: dict[Key, dict[str, Any]]


def _write_round(lake: LakeGateway, table: str, model: dict[Key, Any], rng: Any, step: int) -> None:
    """Random upserts and deletes over 150 keys, in batches that mix both."""
    with lake.gateway.client() as c:
        for _ in range(6):
            rows: list[dict[str, Any]] = []
            for _ in range(rng.randint(10, 40)):
                key = (rng.randrange(75), rng.choice(["eu", "us"]))
                if rng.random() < 0.25:
                    rows.append({"id": key[0], "region": key[1], "_change": 3})
                    model.pop(key, None)
                    continue
                row = {"id": key[0], "region": key[1], "v": step * 100 + rng.randrange(100)}
                row["note"] = None if rng.random() < 0.3 else f"s{step}"
                rows.append(row)
                model[key] = row
            c.append(table, rows)


def _tier(lake: LakeGateway, table: str, disk: bool) -> None:
    """Tier the changelog and apply it to the state table, in this process: a gateway that
    owns its disk hot tier is stopped meanwhile (the tiering job runs where it can open it)."""
    if disk:
        lake.gateway.stop()
    try:
        lake.tier(table)
    finally:
        if disk:
            lake.gateway.start()


@pytest.fixture(scope="module", params=["disk", "redis"])
def key_table(request: pytest.FixtureRequest) -> KeyTable:
    """A key table written in three rounds of upserts and deletes, the first two tiered
    into the state table, the third left hot (updating and deleting tiered keys)."""
    disk = request.param == "disk"
    lake: LakeGateway = request.getfixturevalue("disk_lake" if disk else "lake")
    table = f"keys{uuid.uuid4().hex[:8]}.kv"
    rng = random.Random(42)
    model: dict[Key, dict[str, Any]] = {}
    with lake.gateway.client() as c:
        c.create_table(table, SCHEMA, partitions=PARTITIONS, primary_key=["id", "region"])
    for step in range(3):
        _write_round(lake, table, model, rng, step)
        if step < 2:
            _tier(lake, table, disk)
    with lake.gateway.client() as c:
        info = c.describe_table(table).partition_info
    # Each partition holds tiered changes and hot ones above them.
    assert all(0 < p.tiered_watermark < p.high_watermark for p in info), info
    return KeyTable(lake, table, model)


def _users(rows: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out = {(r["id"], r["region"]): {n: r[n] for n in USER} for r in rows}
    assert len(out) == len(rows), "a key read twice"
    return out


def test_a_key_table_reads_as_its_current_state(
    source: str, key_table: KeyTable, tg_spark: Any
) -> None:
    lake, table = key_table.lake, key_table.table
    df = tg_spark.read.format(source).options(**lake.options(table)).load()
    assert df.schema.simpleString() == (
        "struct<id:bigint,region:string,v:bigint,note:string,"
        "_partition:int,_offset:bigint,_timestamp:timestamp>"
    )
    assert df.rdd.getNumPartitions() == PARTITIONS  # one task per table partition
    got = spark_rows(df)
    assert _users(got) == key_table.model
    assert got == gateway_rows(lake, table)  # the system columns of each key's last change
    with lake.gateway.client() as c:
        changes = [
            r
            for p in range(PARTITIONS)
            for r in c.read(table, partition=p, offset=0, max_records=100_000).to_pylist()
        ]
    assert replay(changes) == key_table.model
    assert df.count() == len(key_table.model)  # live keys, not changes


def test_filters_and_projections_of_a_key_table(
    source: str, key_table: KeyTable, tg_spark: Any
) -> None:
    lake, table, model = key_table.lake, key_table.table, key_table.model
    df = tg_spark.read.format(source).options(**lake.options(table)).load()
    got = gateway_rows(lake, table)
    # A filter on a value column: applied to the current state, never to older versions.
    low = df.where("v >= 150 and note is not null").select("id", "region", "v").collect()
    want = {k: r["v"] for k, r in model.items() if r["v"] >= 150 and r["note"] is not None}
    assert {(r["id"], r["region"]): r["v"] for r in low} == want
    assert len(low) == len(want)
    # A partition filter reads that partition only, as the gateway's scan answers it.
    one = df.where("_partition = 1")
    assert one.rdd.getNumPartitions() == 1
    assert spark_rows(one) == gateway_rows(lake, table, filter="_partition = 1")
    # An offset filter keeps the keys whose last change is at or above it.
    assert spark_rows(df.where("_offset >= 40")) == gateway_rows(
        lake, table, filter="_offset >= 40"
    )
    # A limit: Spark stops after that many current rows.
    few = spark_rows(df.limit(5))
    assert len(few) == 5 and all(r in got for r in few)
    # The partitions option, and a projection of the key alone.
    some = tg_spark.read.format(source).options(**lake.options(table, partitions="0,2")).load()
    keys = sorted((r["id"], r["region"]) for r in some.select("region", "id").collect())
    with lake.gateway.client() as c:
        scanned = c.scan(table, columns=["id", "region"], filter="_partition in (0, 2)")
    assert keys == sorted(
        zip(scanned.column("id").to_pylist(), scanned.column("region").to_pylist(), strict=True)
    )
    assert 0 < len(keys) < len(model)


def test_as_of_reads_the_state_snapshot_alone(
    source: str, key_table: KeyTable, tg_spark: Any
) -> None:
    """``as_of`` reads one state table snapshot for every partition, as the gateway's scan
    with ``as_of`` does: the tiered state, without the hot changes above it."""
    lake, table = key_table.lake, key_table.table
    ns, name = table.split(".")
    with lake.gateway.http_client() as http:
        answer = http.post(f"/v1/tables/{ns}/{name}/scan", json={"limit": 1})
        assert answer.status_code == 200, answer.text
        snapshot = answer.json()["snapshot_id"]
    df = tg_spark.read.format(source).options(**lake.options(table, as_of=snapshot)).load()
    got = spark_rows(df)
    assert got == gateway_rows(lake, table, as_of=snapshot)
    assert _users(got) != key_table.model  # the hot round changed tiered keys
    assert max(r["_offset"] for r in got) < max(r["_offset"] for r in gateway_rows(lake, table))
