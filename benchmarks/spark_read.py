"""``spark.read.format("tidegate")`` (the JVM connector) and the Python source
(``format("tidegate_python")``) against ``spark.read.parquet`` of the same data files, in
one Spark session (``local[2]``, the connector's jar on it), on one tiered table:
``count()``, ``sum(id)`` over the whole table, a sum over every column, a selective
filter (one partition's first 1% of offsets), and an ``AvailableNow`` drain (see
:func:`_drains`).

The table is all cold (tiered in this process, as ``tidegate tier`` would), so all three
read the same Parquet files; the JVM connector adds its plan (one ``POST /plan``) and reads
the files with Spark's own vectorized Parquet reader in the warehouse folder (the
``warehouse`` option: Spark shares the gateway's host, as ``spark.read.parquet`` of the
files must), the Python source its own pyarrow readers in Python workers. The row
``format("tidegate") through links`` is the JVM connector without that option, reading
through the gateway's file links (range requests), as executors that cannot see the folder
do. Ratios are records/s of the table against records/s; the readers take turns, query by
query.

``python -m benchmarks --only spark-read --set read_sizes=[400000,2000000,4000000]``
runs the queries over tables of each size in one run (rows ``spark-read-2M-count``...;
the workload's own size keeps its plain names).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from benchmarks.cold import _local_path, _tier
from benchmarks.harness import Bench, compare
from benchmarks.loadgen import Result, Workload
from benchmarks.scenarios import create_table, drop_table, fill_workload

#: An aggregate over every column of the table: sums, the payload by its length, and
#: maxima where a sum would overflow (nanosecond times).
EVERY_COLUMN = (
    "sum(id)",
    "max(sent_ns)",
    "sum(length(payload))",
    "sum(_partition)",
    "sum(_offset)",
    "max(_timestamp)",
)


def _queries(n: int, partitions: int) -> dict[str, Any]:
    """name -> query. (The Python Data Source API passes no projection to its reader, so
    there ``sum`` ships every column to Spark; the JVM connector reads ``id`` alone.)"""
    per = n // partitions
    selective = f"_partition = 0 and _offset < {max(1, per // 100)}"
    return {
        "count": lambda df: df.count(),
        "sum": lambda df: df.selectExpr("sum(id)").collect()[0][0],
        "sum-all": lambda df: df.selectExpr(*EVERY_COLUMN).collect()[0],
        "filter": lambda df: df.filter(selective).selectExpr("sum(id)").collect()[0][0],
    }


async def run(b: Bench, w: Workload) -> list[dict[str, Any]]:
    import gateway.spark
    from tiering.spark_runner import spark_session

    gw = b.tiered
    md = b.auth(gw)
    rows: list[dict[str, Any]] = []
    # Started before any gRPC channel of this process is open: launching the JVM forks.
    spark = spark_session("local[2]", "tidegate-bench", {"spark.jars": gateway.spark.jar_path()})
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
        links = {
            "endpoint": gw.http_url,
            "api_key": gw.api_key or "",
            "table": f"{ref.namespace}.{ref.name}",
        }
        # Spark and the gateway share the host, as spark.read.parquet needs: the readers
        # read the plan's files in the warehouse folder (one JVM row reads them through the
        # gateway's links instead, the default where executors cannot see the folder).
        options = {**links, "warehouse": b.settings().cold_warehouse}
        parquet = spark.read.parquet(*paths)
        reps = max(1, round(w.duration_s * 1.25))
        for name, query in _queries(n, w.partitions).items():
            # A DataFrame per query: the Python source reuses a DataFrame's pushed filters.
            readers = {
                'spark.read.format("tidegate")': spark.read.format("tidegate")
                .options(**options)
                .load(),
                'format("tidegate") through links': spark.read.format("tidegate")
                .options(**links)
                .load(),
                'format("tidegate_python")': spark.read.format("tidegate_python")
                .options(**options)
                .load(),
            }
            base, results = await asyncio.to_thread(
                _measure, f"{w.name}-{name}", query, parquet, readers, n, reps
            )
            rows.append(base.summary())
            rows += [compare(r.summary(), [base.summary()]) for r in results]
        with tempfile.TemporaryDirectory(prefix="tidegate-drain-files-") as files:
            # The same files in one folder (links), for Spark's streaming file source.
            for i, path in enumerate(paths):
                os.symlink(path, os.path.join(files, f"{i:05d}.parquet"))
            baseline, drains = _drains(spark, files, len(paths), options, n)
            base, results = await asyncio.to_thread(
                _measure,
                f"{w.name}-drain",
                _run,
                baseline,
                drains,
                n,
                reps,
                "readStream.parquet (baseline)",
            )
        rows.append(base.summary())
        rows += [compare(r.summary(), [base.summary()]) for r in results]
    finally:
        await drop_table(stub, ref, md)
    return rows


def _run(drain: Callable[[], None]) -> None:
    drain()


def _drains(
    spark: Any, files: str, count: int, options: dict[str, str], n: int
) -> tuple[Callable[[], None], dict[str, Callable[[], None]]]:
    """The whole table drained by ``readStream`` with ``Trigger.AvailableNow`` into Spark's
    ``noop`` sink (every column, as a sink takes them) in about four micro-batches, from a
    fresh checkpoint each time: on each implementation (``maxRecordsPerTrigger``), and as the
    baseline Spark's own streaming Parquet source over the same ``count`` files in the
    folder ``files`` (``maxFilesPerTrigger``)."""
    schema = spark.read.parquet(files).schema

    def drain(name: str, stream: Any) -> None:
        with tempfile.TemporaryDirectory(prefix="tidegate-drain-") as checkpoint:
            query = (
                stream.writeStream.format("noop")
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(f"{name}: the drain failed: {query.exception()}")
            read = sum(p["numInputRows"] for p in query.recentProgress)
            if read != n:
                raise RuntimeError(f"{name}: the drain read {read} records of {n}")

    def connector(fmt: str) -> Callable[[], None]:
        return lambda: drain(
            fmt,
            spark.readStream.format(fmt)
            .options(**options)
            .option("maxRecordsPerTrigger", max(1, -(-n // 4)))
            .load(),
        )

    def baseline() -> None:
        per_trigger = max(1, -(-count // 4))
        drain(
            "parquet",
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", per_trigger)
            .parquet(files),
        )

    return baseline, {
        'readStream.format("tidegate")': connector("tidegate"),
        'readStream.format("tidegate_python")': connector("tidegate_python"),
    }


def _measure(
    workload: str,
    query: Any,
    parquet: Any,
    readers: dict[str, Any],
    n: int,
    reps: int,
    baseline: str = "spark.read.parquet (baseline)",
) -> tuple[Result, list[Result]]:
    """One warm-up run of ``query`` on each DataFrame (JIT, Python workers), then ``reps``
    timed runs of each, taking turns so that a change in the machine's load (the
    benchmark shares it) falls on both alike. Each run counts as a pass over the table's
    ``n`` records (a query takes a fraction of a second: the closed loop's window would
    see too few of them)."""
    systems = [(Result(workload, baseline), parquet)]
    systems += [(Result(workload, name), df) for name, df in readers.items()]
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
    return systems[0][0], [r for r, _ in systems[1:]]
