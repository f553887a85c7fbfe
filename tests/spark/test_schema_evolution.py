"""`spark.read.format("tidegate")` over an evolved table: data files and hot batches of two
schema versions read as one DataFrame of the new schema."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from tests.spark.conftest import LakeGateway
from tests.spark.test_read import gateway_rows, spark_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration]

V0 = pa.schema([pa.field("n", pa.int32(), nullable=False), pa.field("x", pa.float32())])
V1 = pa.schema([pa.field("n", pa.int64()), pa.field("x", pa.float64()), ("tag", pa.string())])


def _rows(schema: pa.Schema, start: int, count: int) -> pa.Table:
    rows = [{"n": i, "x": i + 0.5, "tag": f"t{i}"} for i in range(start, start + count)]
    return pa.Table.from_pylist([{k: r[k] for k in schema.names} for r in rows], schema=schema)


def test_spark_reads_an_evolved_table(
    source: str, lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    with lake.gateway.client() as c:
        c.create_table(table_name, [{"name": "n", "type": "int32", "nullable": False},
                                    {"name": "x", "type": "float32"}], partitions=2)  # fmt: skip
        for p in range(2):
            c.append(table_name, _rows(V0, p * 100, 5), partition=p)
        lake.tier(table_name)  # files of the first schema
        for p in range(2):
            c.append(table_name, _rows(V0, p * 100 + 5, 5), partition=p)  # hot, first schema
        c.alter_schema(
            table_name,
            [
                {"op": "add_column", "column": "tag", "type": "string"},
                {"op": "update_type", "column": "n", "type": "int64"},
                {"op": "update_type", "column": "x", "type": "float64"},
                {"op": "make_optional", "column": "n"},
            ],
        )
        for p in range(2):
            c.append(table_name, _rows(V1, p * 100 + 10, 5), partition=p)
        lake.tier(table_name)  # files of both schemas
        for p in range(2):
            c.append(table_name, _rows(V1, p * 100 + 15, 5), partition=p)  # hot, new schema
    df = tg_spark.read.format(source).options(**lake.options(table_name)).load()
    assert df.schema.simpleString() == (
        "struct<n:bigint,x:double,tag:string,_partition:int,_offset:bigint,_timestamp:timestamp>"
    )
    got = spark_rows(df)
    assert got == gateway_rows(lake, table_name)
    assert len(got) == 2 * 20
    assert [r["tag"] for r in got if r["_partition"] == 1] == [None] * 10 + [
        f"t{i}" for i in range(110, 120)
    ]
    assert df.filter("tag is null").count() == 20


def test_a_dataframe_loaded_before_a_schema_change(
    source: str, lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    """Planning reuses the table described at ``load()``: a column added since is not in
    the DataFrame (its hot rows still read), a column whose type changed is refused in one
    sentence when a query is planned."""
    with lake.gateway.client() as c:
        c.create_table(table_name, [{"name": "n", "type": "int32", "nullable": False},
                                    {"name": "x", "type": "float32"}], partitions=1)  # fmt: skip
        c.append(table_name, _rows(V0, 0, 5), partition=0)
        lake.tier(table_name)
        c.append(table_name, _rows(V0, 5, 5), partition=0)
        before_add = tg_spark.read.format(source).options(**lake.options(table_name)).load()
        c.alter_schema(table_name, [{"op": "add_column", "column": "tag", "type": "string"}])
        tagged = pa.schema([*V0, ("tag", pa.string())])
        c.append(table_name, _rows(tagged, 10, 5), partition=0)
        before_type = tg_spark.read.format(source).options(**lake.options(table_name)).load()
        assert before_add.columns == ["n", "x", "_partition", "_offset", "_timestamp"]
        assert sorted(r.n for r in before_add.collect()) == list(range(15))
        c.alter_schema(table_name, [{"op": "update_type", "column": "n", "type": "int64"}])
    with pytest.raises(Exception, match="column 'n' is int64 now, was int32\\); load it again"):
        before_type.filter("x > 1").collect()
    fresh = tg_spark.read.format(source).options(**lake.options(table_name)).load()
    assert sorted(r.n for r in fresh.filter("x > 1").collect()) == list(range(1, 15))
