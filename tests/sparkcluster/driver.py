"""A Spark driver the cluster tests talk to: ``spark-submit`` of this file on the standalone
cluster (tests/services.py, :class:`~tests.services.SparkCluster`), one application for the
tests of a module, answering one command per line.

It runs in a process of its own because a Python process holds one SparkContext, and the
test process may hold the suite's ``local[2]`` one. Commands and answers are files in a
folder (the first argument), as ``spark-submit`` hands the Python driver no standard
input: the test writes ``<n>.command`` (one JSON object), the driver answers with
``<n>.answer`` (``{"result": ...}`` or ``{"error": traceback}``); ``ready.answer`` says
the SparkSession is up. Each file appears whole (written aside, then renamed).

- ``{"op": "probe"}``: what the executors' Python workers see: per task its process, the
  folder it runs in (a worker's work folder: which worker ran it), its interpreter and its
  environment's ``TIDEGATE_*``, ``AWS_*`` and ``PYTHONPATH`` variables.
- ``{"op": "read", "format": name, "options": {...}, "out": path}``:
  ``spark.read.format(name)`` (``tidegate``: the JVM connector when its jar is on the
  session; ``tidegate_python``: the Python source) with those options, the rows written to
  ``out`` as an Arrow IPC file; answers the number of Spark partitions, how many rows each
  worker's executor read and whether the scan was columnar.
- ``{"op": "stream", "options": {...}, "checkpoint": path, "out": path}``:
  ``readStream.format("tidegate")`` drained with ``Trigger.AvailableNow``, its micro-batches
  collected on the driver (``foreachBatch``) and written to ``out`` (no file when there
  were no rows); answers the input rows of each micro-batch and their sum.
- ``{"op": "stop"}``: stop the SparkSession and exit.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PREFIXES = ("TIDEGATE_", "AWS_", "PYTHONPATH", "VIRTUAL_ENV")


def _worker_of(cwd: str) -> str:
    """The worker whose work folder ``cwd`` is in: ``<work>/<app>/<executor>``."""
    return os.path.basename(os.path.dirname(os.path.dirname(cwd)))


def _probe(_: Any) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "worker": _worker_of(os.getcwd()),
        "python": sys.executable,
        "env": {k: v for k, v in os.environ.items() if k.startswith(PREFIXES)},
    }


def _count_rows(rows: Iterator[Any]) -> Iterator[tuple[str, int]]:
    yield _worker_of(os.getcwd()), sum(1 for _ in rows)


def _write(table: Any, path: str) -> None:
    import pyarrow as pa

    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def probe(spark: Any, command: dict[str, Any]) -> Any:
    # Four tasks on two one-core executors: both workers run some.
    return spark.sparkContext.parallelize(range(4), 4).map(_probe).collect()


def read(spark: Any, command: dict[str, Any]) -> Any:
    df = spark.read.format(command.get("format", "tidegate")).options(**command["options"]).load()
    _write(df.toArrow(), command["out"])
    per_worker: dict[str, int] = {}
    for worker, count in df.rdd.mapPartitions(_count_rows).collect():
        per_worker[worker] = per_worker.get(worker, 0) + count
    plan = df._jdf.queryExecution().executedPlan().toString()
    return {
        "partitions": df.rdd.getNumPartitions(),
        "per_worker": per_worker,
        "columnar": "ColumnarToRow" in plan,
    }


def stream(spark: Any, command: dict[str, Any]) -> Any:
    import pyarrow as pa

    # foreachBatch, not the memory sink: a query writing to memory cannot resume from
    # its checkpoint. The batches are collected here, on the driver.
    collected: list[Any] = []

    def sink(batch: Any, batch_id: int) -> None:
        collected.append(batch.toArrow())

    query = (
        spark.readStream.format(command.get("format", "tidegate"))
        .options(**command["options"])
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", command["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    try:
        finished = query.awaitTermination(float(command.get("timeout", 240)))
    finally:
        query.stop()
    if not finished:
        raise TimeoutError(f"the AvailableNow query did not finish: {query.lastProgress}")
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    if collected:
        _write(pa.concat_tables(collected), command["out"])
    return {
        "batches": [p["numInputRows"] for p in query.recentProgress],
        "rows": sum(t.num_rows for t in collected),
    }


OPS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "probe": probe,
    "read": read,
    "stream": stream,
}


def _put(folder: Path, name: str, answer: dict[str, Any]) -> None:
    partial = folder / f".{name}.partial"
    partial.write_text(json.dumps(answer))
    partial.replace(folder / name)


def main() -> int:
    from pyspark.sql import SparkSession

    import gateway.spark

    folder = Path(sys.argv[1])
    spark = SparkSession.builder.appName("tidegate-cluster-tests").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    gateway.spark.register(spark)
    _put(folder, "ready.answer", {"result": spark.sparkContext.master})
    n = 0
    while True:
        path = folder / f"{n}.command"
        if not path.exists():
            time.sleep(0.05)
            continue
        command = json.loads(path.read_text())
        if command["op"] == "stop":
            break
        try:
            answer = {"result": OPS[command["op"]](spark, command)}
        except Exception:
            answer = {"error": traceback.format_exc()}
        _put(folder, f"{n}.answer", answer)
        n += 1
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
