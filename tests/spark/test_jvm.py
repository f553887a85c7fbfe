"""What the JVM connector does beyond the behaviour suite both implementations pass: a
columnar scan of only the columns a query needs, aggregates answered from the read plan
with no file read, a limit, and a DataFrame queried twice with different filters."""

from __future__ import annotations

import re
from typing import Any

import pytest

import gateway.spark
from tests.spark.conftest import LakeGateway
from tests.spark.test_read import _fill, gateway_rows, raise_earliest, spark_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _executed(df: Any) -> str:
    """The physical plan ``df`` ran with (after an action: AQE's final plan)."""
    return str(df._jdf.queryExecution().executedPlan().toString())


def test_a_sum_reads_one_column_columnar(lake: LakeGateway, tg_spark: Any, table_name: str) -> None:
    _fill(lake, table_name)  # per partition: two data files and a hot tail
    df = tg_spark.read.format("tidegate").options(**lake.options(table_name)).load()
    query = df.selectExpr("sum(n)")
    (row,) = query.collect()
    assert row[0] == sum(r["n"] for r in gateway_rows(lake, table_name))
    plan = _executed(query)
    # The scan reads `n` alone, and hands Spark column batches (no row conversion).
    # (AQE's final plan shows its initial plan too: the same scan twice.)
    (scan,) = set(re.findall(r"BatchScan tidegate \S+\[([^\]]*)\]", plan))
    assert re.fullmatch(r"n#\d+L", scan), plan
    assert "ColumnarToRow" in plan, plan


def test_count_and_offset_bounds_come_from_the_plan(
    lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    """count(*), min/max of _offset and _partition on a table with cold and hot rows read
    no data file: the plan answers (offsets are dense), as a one-row local scan."""
    _fill(lake, table_name)
    df = tg_spark.read.format("tidegate").options(**lake.options(table_name)).load()
    query = df.selectExpr("count(*)", "min(_offset)", "max(_offset)", "max(_partition)")
    assert query.collect()[0] == (3 * 105, 0, 104, 2)
    plan = _executed(query)
    assert "LocalTableScan" in plan and "BatchScan" not in plan, plan
    counted = df.groupBy().count()
    assert counted.collect()[0][0] == 3 * 105
    assert "BatchScan" not in _executed(counted)
    # Retention recorded earliest offsets: the counts leave out what is below them.
    raise_earliest(lake, table_name, {0: 50, 1: 90})
    fresh = tg_spark.read.format("tidegate").options(**lake.options(table_name)).load()
    assert fresh.count() == 55 + 15 + 105 == len(gateway_rows(lake, table_name))
    assert fresh.selectExpr("min(_offset)").collect()[0][0] == 0
    one = (
        tg_spark.read.format("tidegate")
        .options(**lake.options(table_name, partitions="0,1"))
        .load()
    )
    assert one.selectExpr("count(*)", "min(_offset)").collect()[0] == (55 + 15, 50)
    # A filter Spark must evaluate: a scan answers, rightly.
    assert fresh.filter("n % 2 = 0").count() == sum(
        1 for r in gateway_rows(lake, table_name) if r["n"] % 2 == 0
    )


def test_a_dataframe_queried_twice_with_different_filters(
    lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    """Each query plans its own scan: the pushdown of one never leaks into the next."""
    _fill(lake, table_name)
    df = tg_spark.read.format("tidegate").options(**lake.options(table_name)).load()
    assert df.filter("_partition = 1").count() == 105
    assert df.count() == 3 * 105
    assert df.filter("_offset >= 100").count() == 3 * 5
    assert spark_rows(df.filter("k = 'k3'")) == gateway_rows(lake, table_name, filter="k = 'k3'")
    assert len(df.limit(7).collect()) == 7


def test_the_jvm_connector_wants_the_http_edge(
    lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    """The JVM connector refuses a gRPC address in one sentence; the Python source takes
    the HTTP address too, through the gateway's ``/v1/endpoints``."""
    import httpx

    with lake.gateway.client() as c:
        c.create_table(table_name, {"n": "int64"}, partitions=1)
    told = httpx.get(f"{lake.gateway.http_url}/v1/endpoints").json()
    assert told["grpc"] == lake.gateway.grpc_target
    options = {**lake.options(table_name), "endpoint": lake.gateway.grpc_target}
    with pytest.raises(Exception, match="the JVM connector talks to the gateway's HTTP edge"):
        tg_spark.read.format("tidegate").options(**options).load()


def test_jar_path_names_the_jar_or_says_how_to_build_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    assert gateway.spark.jar_path().endswith("gateway/spark/jars/tidegate-spark.jar")
    monkeypatch.setattr(gateway.spark, "JAR", tmp_path / "none.jar")
    with pytest.raises(gateway.spark.JarMissing, match=r"run `make jar`.*openjdk-17-jdk-headless"):
        gateway.spark.jar_path()


def test_hot_batches_with_nested_columns_read_one_after_another(
    lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    """A hot range of several stored batches with a struct and a list column: each batch
    handed to Spark owns its vectors, so the next one loads into a root whose struct still
    has its children (before: "should have as many children as in the schema: found 0
    expected 2" at the second batch)."""
    schema = {"n": "int64", "pair": "struct<a: int64, b: string>", "nums": "list<int64>"}
    with lake.gateway.client() as c:
        c.create_table(table_name, schema, partitions=1)
        for start in (0, 10, 20):
            rows = [
                {"n": i, "pair": {"a": i, "b": f"s{i}"} if i % 3 else None, "nums": [i, None]}
                for i in range(start, start + 10)
            ]
            c.append(table_name, rows, partition=0)
    df = tg_spark.read.format("tidegate").options(**lake.options(table_name)).load()
    got = [r.asDict(recursive=True) for r in df.select("n", "pair", "nums").collect()]
    got.sort(key=lambda r: r["n"])
    assert [r["n"] for r in got] == list(range(30))
    assert got[4]["pair"] == {"a": 4, "b": "s4"} and got[3]["pair"] is None
    assert all(r["nums"] == [r["n"], None] for r in got)
