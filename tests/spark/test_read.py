"""Batch reads through `spark.read.format("tidegate")`: the stitched view of Iceberg files
and the hot tail, equal to the gateway's own scan; filters pushed down to the plan."""

from __future__ import annotations

import datetime as dt
import decimal
import os
from typing import Any

import pyarrow as pa
import pytest

from gateway.wire.schema import parse_fields
from tests.spark.conftest import LakeGateway

pytestmark = [pytest.mark.spark, pytest.mark.integration]

SCHEMA = {"k": "string", "n": "int64", "small": "int16", "price": "decimal128(10, 2)"}


ARROW = parse_fields([{"name": k, "type": v} for k, v in SCHEMA.items()])


def _rows(start: int, count: int) -> pa.Table:
    rows = [
        {"k": f"k{i % 7}", "n": i, "small": i % 100, "price": decimal.Decimal(f"{i}.25")}
        for i in range(start, start + count)
    ]
    return pa.Table.from_pylist(rows, schema=ARROW)


def _fill(lake: LakeGateway, table: str, partitions: int = 3) -> None:
    """Per partition, two tiered appends (two data files) and a hot tail."""
    with lake.gateway.client() as c:
        c.create_table(table, SCHEMA, partitions=partitions)
        for p in range(partitions):
            c.append(table, _rows(p * 1000, 40), partition=p)
        lake.tier(table)
        for p in range(partitions):
            c.append(table, _rows(p * 1000 + 40, 40), partition=p)
        lake.tier(table)
        for p in range(partitions):
            c.append(table, _rows(p * 1000 + 80, 25), partition=p)


def raise_earliest(lake: LakeGateway, table: str, earliest: dict[int, int]) -> None:
    """What retention records before it removes anything: the earliest offsets."""
    from gateway.meta import MetadataStore

    with lake.gateway.client() as c:
        c.alter_table(table, retention_records=1_000_000)
    ns, name = table.split(".")
    with MetadataStore.from_settings(lake.settings) as meta:
        d = meta.get_table(lake.gateway.tenant, ns, name)
        meta.raise_earliest_offsets(d.table_id, earliest)


def _key(row: dict[str, Any]) -> tuple[int, int]:
    return row["_partition"], row["_offset"]


def _instants(row: dict[str, Any]) -> dict[str, Any]:
    """Timestamps as epoch seconds: Spark hands back naive local times, the SDK aware ones
    (``timestamp()`` reads a naive time as local, so both give the same instant)."""
    return {k: v.timestamp() if isinstance(v, dt.datetime) else v for k, v in row.items()}


def spark_rows(df: Any) -> list[dict[str, Any]]:
    return sorted((_instants(r.asDict()) for r in df.collect()), key=_key)


def gateway_rows(lake: LakeGateway, table: str, **scan: Any) -> list[dict[str, Any]]:
    with lake.gateway.client() as c:
        return sorted((_instants(r) for r in c.scan(table, **scan).to_pylist()), key=_key)


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_a_stitched_read_equals_the_gateways_scan(
    source: str, request: pytest.FixtureRequest, tg_spark: Any, table_name: str, where: str
) -> None:
    lake: LakeGateway = request.getfixturevalue("lake" if where == "folder" else "s3_lake")
    _fill(lake, table_name)
    with lake.gateway.client() as c:
        plan = c.plan_read(table_name)
    assert len(plan.files) == 6 and {r.from_offset for r in plan.hot_ranges} == {80}
    if where == "s3":
        assert all(f.url.startswith("http://") for f in plan.files)
    df = tg_spark.read.format(source).options(**lake.options(table_name)).load()
    assert df.schema.simpleString() == (
        "struct<k:string,n:bigint,small:smallint,price:decimal(10,2),"
        "_partition:int,_offset:bigint,_timestamp:timestamp>"
    )
    got = spark_rows(df)
    want = gateway_rows(lake, table_name)
    assert len(got) == 3 * 105
    assert got == want
    for p in range(3):  # no gap, no duplicate
        assert [r["_offset"] for r in got if r["_partition"] == p] == list(range(105))
    if where == "s3":
        # The executors read the files through the plan's presigned URLs: they hold no keys.
        keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
        env = (
            tg_spark.sparkContext.parallelize([0], 1)
            .map(lambda _: sorted(k for k in keys if k in os.environ))
            .collect()
        )
        assert env == [[]]


def test_pushed_filters_prune_files_and_hot_ranges(
    source: str, lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    _fill(lake, table_name)
    # One split per file, so the number of Spark partitions counts the files opened.
    df = tg_spark.read.format(source).options(**lake.options(table_name, split_bytes=1)).load()
    assert df.rdd.getNumPartitions() == 6 + 3
    cases = [
        # Partition and offset: the second file of partition 1 and its hot range.
        ("_partition = 1 and _offset >= 50", "_partition = 1 and _offset >= 50", 2),
        # Offsets only: every partition's second file (40..79), no hot range.
        ("_offset between 45 and 60", "_offset >= 45 and _offset <= 60", 3),
        # A user column's statistics prune files; hot ranges are kept (no statistics).
        ("n >= 1040 and n < 1050", "n >= 1040 and n < 1050", 1 + 3),
        ("_partition in (0, 2) and k = 'k3'", "_partition in (0, 2) and k = 'k3'", 2 * 2 + 2),
        # No file holds a null (null counts): only the hot ranges are read.
        ("small is null", "small is null", 3),
    ]
    for spark_filter, gateway_filter, splits in cases:
        filtered = df.filter(spark_filter)
        assert filtered.rdd.getNumPartitions() == splits, spark_filter
        assert spark_rows(filtered) == gateway_rows(lake, table_name, filter=gateway_filter), (
            spark_filter
        )
    # What the filter language cannot say stays with Spark, and the answer is still right.
    mixed = df.filter("n % 2 = 0 and _partition = 2 and k like '%3'")
    assert mixed.rdd.getNumPartitions() == 2 + 1
    want = [
        r
        for r in gateway_rows(lake, table_name, filter="_partition = 2")
        if r["n"] % 2 == 0 and r["k"].endswith("3")
    ]
    assert spark_rows(mixed) == want and want
    # A projection: only the columns asked for.
    narrow = (
        tg_spark.read.format(source)
        .options(**lake.options(table_name, columns="n,_offset", partitions="1"))
        .load()
    )
    assert narrow.columns == ["n", "_offset"]
    assert sorted(r.n for r in narrow.collect()) == list(range(1000, 1105))


def test_bad_reads_say_what_is_wrong(
    source: str, lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    with lake.gateway.client() as c:
        c.create_table(table_name, {"n": "int64"}, partitions=3)
    ns = table_name.split(".")[0]
    cases = [
        ({"api_key": "tg_0000000000000000_wrong"}, f"tidegate: table {table_name} at"),
        ({"table": f"{ns}.missing"}, f"tidegate: table {ns}.missing at .* not found"),
        ({"partitions": "1,7"}, "names partition '7'; the table has partitions 0..2"),
        ({"columns": "n,nope"}, r"unknown column\(s\) \['nope'\]"),
        ({"table": "nodot"}, "table 'nodot' is not of the form 'namespace.table'"),
        ({"split_bytes": "lots"}, "option 'split_bytes' is 'lots'; give an integer >= 1"),
        ({"maxRecordPerTrigger": "5"}, r"unknown option\(s\) \['maxrecordpertrigger'\]"),
    ]
    for change, words in cases:
        options = {**lake.options(table_name), **change}
        with pytest.raises(Exception, match=words):
            tg_spark.read.format(source).options(**options).load().collect()
    options = lake.options(table_name)
    del options["endpoint"]
    with pytest.raises(Exception, match="option 'endpoint' is missing"):
        tg_spark.read.format(source).options(**options).load()


def test_a_read_racing_tiering_returns_each_record_once(
    source: str, lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    """The plan is pinned when Spark plans the query; tiering that commits between the
    planning and the executors' reads moves the hot ranges into new files, and appends add
    records above the pinned high watermarks: the read still sees each record of the
    planned view once. (The RDD's splits are planned first, then the table changes, then
    the same RDD runs.)"""
    _fill(lake, table_name)
    df = tg_spark.read.format(source).options(**lake.options(table_name)).load()
    rdd = df.rdd
    assert rdd.getNumPartitions() >= 3  # planned: the plan is pinned now
    before = gateway_rows(lake, table_name)
    lake.tier(table_name)  # offsets 80..104 of every partition move to Iceberg
    with lake.gateway.client() as c:
        for p in range(3):
            c.append(table_name, _rows(p * 1000 + 105, 10), partition=p)
    got = sorted((_instants(r.asDict()) for r in rdd.collect()), key=_key)
    assert got == before and len(got) == 3 * 105


def test_a_read_leaves_out_rows_below_the_earliest_offset(
    source: str, lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    """Retention recorded earliest offsets and has not removed anything yet: the plan's
    straddling file is read from the earliest offset, the hot range starts there."""
    _fill(lake, table_name)  # per partition: files 0..39 and 40..79, hot 80..104
    raise_earliest(lake, table_name, {0: 50, 1: 90})
    with lake.gateway.client() as c:
        plan = c.plan_read(table_name)
    assert {(e.partition, e.offset) for e in plan.earliest_offsets} == {(0, 50), (1, 90)}
    df = tg_spark.read.format(source).options(**lake.options(table_name)).load()
    got = spark_rows(df)
    for p, first in ((0, 50), (1, 90), (2, 0)):
        assert [r["_offset"] for r in got if r["_partition"] == p] == list(range(first, 105))
    assert got == gateway_rows(lake, table_name)


def _file_link_reads(lake: LakeGateway) -> float:
    """GETs the gateway answered on its data-file links so far (its own metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    with lake.gateway.http_client() as h:
        text = h.get("/metrics").text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tidegate_http_requests_total" and s.labels.get("route") == "/v1/files/{token}"
    )


def test_a_read_given_the_warehouse_folder_reads_the_files_there(
    source: str, lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    """The ``warehouse`` option: executors that see the gateway's warehouse folder read the
    plan's files there (at disk speed), not through the gateway's links; the rows are the
    same. A folder without the files falls back to the links."""
    _fill(lake, table_name)
    want = gateway_rows(lake, table_name)
    folder = lake.settings.cold_warehouse.removeprefix("file://")

    def read(**extra: Any) -> tuple[list[dict[str, Any]], float]:
        before = _file_link_reads(lake)
        df = tg_spark.read.format(source).options(**lake.options(table_name, **extra)).load()
        return spark_rows(df), _file_link_reads(lake) - before

    got, links = read()
    assert got == want and links > 0  # through the links by default
    got, links = read(warehouse=folder)
    assert got == want and links == 0
    got, links = read(warehouse=f"file://{folder}/elsewhere")
    assert got == want and links > 0
