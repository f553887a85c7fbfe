"""``spark.read.format("tidegate")`` against ``spark.read.parquet`` of the same data files,
in one Spark session (``local[2]``), on one tiered table: ``count()``, ``sum(id)`` over the
whole table, and a selective filter (one partition's first 1% of offsets).

The table is all cold (tiered in this process, as ``tidegate tier`` would), so both read
the same Parquet files; the connector adds its plan (one PlanRead) and its own pyarrow
readers in Python workers. Ratios are records/s of the table against records/s; the two
readers take turns, query by query.

``python -m benchmarks --only spark-read --set read_sizes=[400000,2000000,4000000]``
runs the queries over tables of each size in one run (rows ``spark-read-2M-count``...;
the workload's own size keeps its plain names).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from benchmarks.cold import _local_path, _tier
from benchmarks.harness import Bench, compare
from benchmarks.loadgen import Result, Workload
from benchmarks.scenarios import create_table, drop_table, fill_workload


def _queries(n: int, partitions: int) -> dict[str, tuple[Any, str]]:
    """name -> (query, the connector's ``columns`` option: "" for all). The Python Data
    Source API passes no projection to the reader, so ``sum`` ships every column to Spark
    unless the query names its columns; ``sum-columns`` measures that."""
    per = n // partitions
    selective = f"_partition = 0 and _offset < {max(1, per // 100)}"
    return {
        "count": (lambda df: df.count(), ""),
        "sum": (lambda df: df.selectExpr("sum(id)").collect()[0][0], ""),
        "sum-columns": (lambda df: df.selectExpr("sum(id)").collect()[0][0], "id"),
        "filter": (
            lambda df: df.filter(selective).selectExpr("sum(id)").collect()[0][0],
            "",
        ),
    }


async def run(b: Bench, w: Workload) -> list[dict[str, Any]]:
    import gateway.spark
    from tiering.spark import spark_session

    gw = b.tiered
    md = b.auth(gw)
    rows: list[dict[str, Any]] = []
    # Started before any gRPC channel of this process is open: launching the JVM forks.
    spark = spark_session("local[2]", "tidegate-bench")
    gateway.spark.register(spark)
    try:
        async with b.stub(gw) as stub:
            for size in w.read_sizes or (w.read_records,):
                # Rows of other sizes than the workload's own say theirs in the name.
                name = w.name if size == w.read_records else f"{w.name}-{_short(size)}"
                sized = replace(w, name=name, read_records=size)
                rows += await _one_table(b, gw, md, stub, spark, sized)
    finally:
        spark.stop()
    return rows


def _short(n: int) -> str:
    """400000 -> "400k", 2000000 -> "2M"."""
    for unit, scale in (("M", 1_000_000), ("k", 1_000)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


async def _one_table(
    b: Bench, gw: Any, md: Any, stub: Any, spark: Any, w: Workload
) -> list[dict[str, Any]]:
    """The queries of :func:`_queries` over one table of ``w.read_records`` records."""
    rows: list[dict[str, Any]] = []
    ref = await create_table(stub, "spark", w.partitions, md)
    try:
        n = await fill_workload(stub, ref, md, w, partitions=w.partitions)
        await _tier(b, ref)
        table = await asyncio.to_thread(b.iceberg_table, ref)
        paths = [_local_path(t.file.file_path) for t in table.scan().plan_files()]
        options = {
            "endpoint": gw.grpc_target,
            "api_key": gw.api_key or "",
            "table": f"{ref.namespace}.{ref.name}",
        }
        parquet = spark.read.parquet(*paths)
        reps = max(1, round(w.duration_s * 1.25))
        for name, (query, columns) in _queries(n, w.partitions).items():
            read = spark.read.format("tidegate").options(**options)
            tidegate = (read.option("columns", columns) if columns else read).load()
            base, res = await asyncio.to_thread(
                _measure, f"{w.name}-{name}", query, parquet, tidegate, n, reps
            )
            rows += [base.summary(), compare(res.summary(), [base.summary()])]
    finally:
        await drop_table(stub, ref, md)
    return rows


def _measure(
    workload: str, query: Any, parquet: Any, tidegate: Any, n: int, reps: int
) -> tuple[Result, Result]:
    """One warm-up run of ``query`` on each DataFrame (JIT, Python workers), then ``reps``
    timed runs of each, taking turns so that a change in the machine's load (the
    benchmark shares it) falls on both alike. Each run counts as a pass over the table's
    ``n`` records (a query takes a fraction of a second: the closed loop's window would
    see too few of them)."""
    systems = [
        (Result(workload, "spark.read.parquet (baseline)"), parquet),
        (Result(workload, 'spark.read.format("tidegate")'), tidegate),
    ]
    for _, df in systems:
        query(df)
    for _ in range(reps):
        for result, df in systems:
            t0 = time.monotonic()
            query(df)
            elapsed = time.monotonic() - t0
            result.ack.record_value(max(1, int(elapsed * 1e6)))
            result.seconds += elapsed
            result.batches += 1
            result.records += n
    return systems[0][0], systems[1][0]
