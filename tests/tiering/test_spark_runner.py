"""The Spark runner in local[2]: one task per (table, partition) range, a fair-scheduler
pool per tenant, and one tenant's failing table never stopping the others."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from gateway.hot import PartitionId
from gateway.lake.tiering import tier_all, tier_table
from tests.lake.conftest import Harness
from tiering.spark_runner import SparkRunner

pytestmark = pytest.mark.spark


def _rows(start: int, n: int) -> list[dict[str, Any]]:
    return [{"k": f"k{i}", "n": i} for i in range(start, start + n)]


def test_spark_runner_tiers_each_record_once(harness: Harness, spark: Any) -> None:
    runner = SparkRunner(harness.settings, spark)
    d = harness.create_table(partitions=3)
    for p in range(3):
        harness.append(d, p, _rows(0, 4))
        harness.append(d, p, _rows(4, 6))
    result = tier_table(harness.c, d, runner=runner, trim=False)
    assert result.moved == dict.fromkeys(range(3), (0, 10))
    harness.append(d, 1, _rows(10, 2))
    tier_table(harness.c, d, runner=runner, trim=False)
    rows = harness.cold_rows(d)
    assert [(r["_partition"], r["_offset"], r["n"]) for r in rows] == [
        *((0, i, i) for i in range(10)),
        *((1, i, i) for i in range(12)),
        *((2, i, i) for i in range(10)),
    ]
    assert harness.watermarks(d) == {0: 10, 1: 12, 2: 10}
    assert all(r["_timestamp"] is not None for r in rows)


def test_spark_poisoned_table_does_not_stop_other_tenants(harness: Harness, spark: Any) -> None:
    runner = SparkRunner(harness.settings, spark)
    good = [harness.create_table(partitions=2) for _ in range(3)]
    bad = harness.create_table(partitions=2)
    for d in [bad, *good]:
        harness.append(d, 0, _rows(0, 3))
        harness.append(d, 1, _rows(0, 3))
    # Poison: a batch whose payload is not Arrow IPC; its Spark task fails to decode it.
    harness.c.hot.append(
        PartitionId(bad.tenant, bad.table_id, 1), b"not arrow", 2, time.time_ns() // 1000
    )
    report = tier_all(harness.c, runner=runner, tables=[bad, *good], trim=False)
    assert list(report.failures) == [f"{bad.tenant}/{bad.qualified_name}"]
    for d in good:
        assert harness.watermarks(d) == {0: 3, 1: 3}
    # Nothing of the poisoned table was committed: its run failed as a whole.
    assert harness.watermarks(bad) == {}


class _SchedulerWarnings:
    """What Spark's fair scheduler logs at WARN, captured in the JVM (the session's log
    level is ERROR, and the JVM writes to the stderr pytest had when it started)."""

    LOGGER = "org.apache.spark.scheduler.FairSchedulableBuilder"

    def __init__(self, spark: Any) -> None:
        jvm = spark.sparkContext._jvm
        self.log4j = jvm.org.apache.logging.log4j
        core = self.log4j.core
        self.writer = jvm.java.io.StringWriter()
        layout = core.layout.PatternLayout.newBuilder().withPattern("%p %c: %m%n").build()
        self.appender = core.appender.WriterAppender.createAppender(
            layout, None, self.writer, "tidegate-test-capture", False, True
        )
        self.appender.start()
        self.context = self.log4j.LogManager.getContext(False)
        self.config = self.context.getConfiguration()
        self.config.addLoggerAppender(self.context.getLogger(self.LOGGER), self.appender)
        core.config.Configurator.setLevel(self.LOGGER, self.log4j.Level.WARN)

    def text(self) -> str:
        return str(self.writer.toString())

    def close(self) -> None:
        self.config.getLoggerConfig(self.LOGGER).removeAppender("tidegate-test-capture")
        self.log4j.core.config.Configurator.setLevel(self.LOGGER, self.log4j.Level.ERROR)
        self.appender.stop()


@pytest.mark.parametrize("hot_kind", ["disk"])  # pools do not depend on the hot tier
def test_spark_runner_declares_each_tenants_pool(harness: Harness, spark: Any) -> None:
    """Issue 16, item 7: no "pool ... has not been configured" warning per tenant."""
    captured = _SchedulerWarnings(spark)
    try:
        sc = spark.sparkContext
        # The control: a job in a pool nobody declared is warned about, and captured.
        control = f"undeclared-{uuid.uuid4().hex[:8]}"
        sc.setLocalProperty("spark.scheduler.pool", control)
        try:
            assert sc.parallelize([1, 2], 2).count() == 2
        finally:
            sc.setLocalProperty("spark.scheduler.pool", None)
        assert f"scheduler pool {control}, which has not been configured" in captured.text()

        runner = SparkRunner(harness.settings, spark)
        tables = [harness.create_table(partitions=2) for _ in range(2)]
        for d in tables:
            harness.append(d, 0, _rows(0, 3))
            harness.append(d, 1, _rows(0, 2))
        report = tier_all(harness.c, runner=runner, tables=tables, trim=False)
        assert not report.failures and report.records == 10
        warnings = captured.text().splitlines()
        assert [w for w in warnings if "has not been configured" in w and control not in w] == []
        root = sc._jsc.sc().taskScheduler().rootPool()
        for d in tables:  # each tenant ran in a pool of its own name
            assert root.getSchedulableByName(d.tenant).name() == d.tenant
    finally:
        captured.close()


def test_spark_runner_compacts_each_record_once(harness: Harness, spark: Any) -> None:
    from gateway.lake.compaction import compact_table

    runner = SparkRunner(harness.settings, spark)
    d = harness.create_table(partitions=2)
    for i in range(3):
        for p in range(2):
            harness.append(d, p, _rows(4 * i, 4))
        tier_table(harness.c, d, runner=runner, trim=False)
    result = compact_table(harness.c, d, runner=runner)
    assert (result.removed, result.added, result.records) == (6, 2, 24)
    cold = harness.c.cold.table(d)
    snap = cold.snapshot()
    assert [len(cold.files(snap, p, 0, 2**62)) for p in range(2)] == [1, 1]
    rows = harness.cold_rows(d)
    assert [(r["_partition"], r["_offset"], r["n"]) for r in rows] == [
        (p, i, i) for p in range(2) for i in range(12)
    ]
    assert harness.watermarks(d) == {0: 12, 1: 12}
