"""`df.write.format("tidegate")`: appends through the idempotent producer, so a task that
fails after appending and is retried adds each row exactly once."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.wire.routing import partition_for_key
from tests.spark.conftest import LakeGateway

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _failed_tasks(spark: Any, group: str) -> int:
    """Failed task attempts of the jobs of ``group`` (Spark's status tracker)."""
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job in tracker.getJobIdsForGroup(group):
        for stage in tracker.getJobInfo(job).stageIds:
            info = tracker.getStageInfo(stage)
            failed += info.numFailedTasks if info is not None else 0
    return failed


def test_a_retried_write_task_adds_each_row_once(
    lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    gw = lake.gateway
    assert gw.api_key is not None
    with gw.client() as c:
        c.create_table(table_name, {"id": "int64", "tag": "string"}, partitions=2)
    df = tg_spark.range(0, 2000, 1, 2).selectExpr("id", "concat('t', id % 5) as tag")
    # The first attempt of each task fails once it has appended 24 batches of 25 rows
    # (the connector's fault-injection option); Spark retries it (local[2,2]) and the
    # retry resends every batch, the oldest beyond the gateway's 16-batch window.
    options = lake.options(table_name, batch_rows=25, test_fail_after_batches=24)
    group = f"write-{table_name}"
    tg_spark.sparkContext.setJobGroup(group, "a write whose tasks fail once")
    try:
        df.write.format("tidegate").options(**options).mode("append").save()
    finally:
        tg_spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert _failed_tasks(tg_spark, group) == 2
    with gw.client() as c:
        info = c.table_info(table_name)
        rows = c.scan(table_name).to_pylist()
    assert info.high_watermarks == (1000, 1000)
    by_partition = {p: sorted(r["id"] for r in rows if r["_partition"] == p) for p in (0, 1)}
    # Each Spark partition's rows went to one table partition, each row once.
    assert by_partition == {0: list(range(1000)), 1: list(range(1000, 2000))}


def test_writes_route_rows_by_key_and_refuse_what_does_not_fit(
    lake: LakeGateway, tg_spark: Any, table_name: str
) -> None:
    with lake.gateway.client() as c:
        c.create_table(
            table_name, {"id": "int64", "tag": "string"}, partitions=3, key_columns=["tag"]
        )
    df = tg_spark.range(0, 300, 1, 2).selectExpr("id", "concat('t', id % 7) as tag")
    writer = df.write.format("tidegate").options(**lake.options(table_name)).mode("append")
    writer.save()
    with lake.gateway.client() as c:
        rows = c.scan(table_name).to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(300))
    assert all(r["_partition"] == partition_for_key([r["tag"]], 3) for r in rows)
    # Read back and written again: the system columns are the gateway's to assign.
    back = tg_spark.read.format("tidegate").options(**lake.options(table_name)).load()
    back.write.format("tidegate").options(**lake.options(table_name)).mode("append").save()
    with lake.gateway.client() as c:
        assert sum(c.table_info(table_name).high_watermarks) == 600

    for bad, words in [
        (df.selectExpr("id", "id as tag"), "'tag' is int64, expected string"),
        (df.selectExpr("id"), "missing column(s) ['tag']"),
        (df.selectExpr("id", "tag", "1 as extra"), "unexpected column(s) ['extra']"),
    ]:
        with pytest.raises(Exception, match=__import__("re").escape(words)):
            bad.write.format("tidegate").options(**lake.options(table_name)).mode("append").save()
    with pytest.raises(Exception, match="save mode 'overwrite' is not supported"):
        df.write.format("tidegate").options(**lake.options(table_name)).mode("overwrite").save()
    with lake.gateway.client() as c:  # nothing written by the refused writes
        assert sum(c.table_info(table_name).high_watermarks) == 600
