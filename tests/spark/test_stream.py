"""`spark.readStream.format("tidegate")` and `writeStream.format("tidegate")`: micro-batches
over offsets per partition, across the tiered watermark, resumed from a checkpoint with
no record repeated or skipped."""

from __future__ import annotations

import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.services import RedisServer
from tests.spark.conftest import SOURCES, LakeGateway, start_lake_gateway

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _append(lake: LakeGateway, table: str, start: int, count: int) -> None:
    with lake.gateway.client() as c:
        for p in range(2):
            c.append(
                table, [{"n": p * 100_000 + i} for i in range(start, start + count)], partition=p
            )


def _sink(spark: Any, path: Path) -> list[tuple[int, int, int]]:
    from pyspark.errors import AnalysisException

    if not path.exists():
        return []
    try:
        rows = spark.read.parquet(str(path)).collect()
    except AnalysisException:  # the sink's log names no file yet
        return []
    return sorted((r._partition, r._offset, r.n) for r in rows)


def _expected(per_partition: int, first: int = 0) -> list[tuple[int, int, int]]:
    return [(p, i, p * 100_000 + i) for p in range(2) for i in range(first, per_partition)]


def _drain(
    spark: Any, fmt: str, options: dict[str, str], out: Path, checkpoint: Path
) -> list[dict[str, Any]]:
    """One ``Trigger.AvailableNow`` query into a Parquet sink, which must end by itself;
    answers its micro-batches' progress."""
    stream = (
        spark.readStream.format(fmt)
        .options(**options)
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert stream.awaitTermination(120), stream.lastProgress
    finally:
        stream.stop()
    assert stream.exception() is None, stream.exception()
    return list(stream.recentProgress)


def _source_of(progress: list[dict[str, Any]]) -> str:
    """What Spark's progress calls the query's source."""
    (described,) = {p["sources"][0]["description"] for p in progress}
    return str(described)


def test_stream_reads_resume_from_the_checkpoint_exactly_once(
    lake: LakeGateway, stream_source: tuple[Any, str], table_name: str, tmp_path: Path
) -> None:
    spark, fmt = stream_source
    with lake.gateway.client() as c:
        c.create_table(table_name, {"n": "int64"}, partitions=2)
    _append(lake, table_name, 0, 60)
    lake.tier(table_name)
    _append(lake, table_name, 60, 40)  # offsets 60..99 are hot
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run(
        trigger: dict[str, Any], until: int | None = None, meanwhile: Any = None
    ) -> list[dict[str, Any]]:
        stop = threading.Event()
        worker = threading.Thread(target=meanwhile, args=(stop,)) if meanwhile else None
        stream = (
            spark.readStream.format(fmt)
            .options(**lake.options(table_name, maxRecordsPerTrigger=70))
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )
        if worker is not None:
            worker.start()
        try:
            if until is None:  # AvailableNow: ends by itself, at the offsets of its start
                assert stream.awaitTermination(120), stream.lastProgress
            else:  # micro-batches: producers and tiering go on meanwhile
                deadline = time.monotonic() + 120
                tiered = False
                while len(_sink(spark, out)) < 2 * until:
                    assert time.monotonic() < deadline, stream.lastProgress
                    if not tiered:
                        _append(lake, table_name, 140, 30)
                        lake.tier(table_name)
                        tiered = True
                    time.sleep(0.5)
        finally:
            stream.stop()
            stop.set()
            if worker is not None:
                worker.join(60)
        assert stream.exception() is None
        return list(stream.recentProgress)

    def produce_and_tier(stop: threading.Event) -> None:
        """A producer and tiering passes while the query runs: offsets 100..139 arrive in
        steps of 10, and each step is tiered at once."""
        for start in range(100, 140, 10):
            _append(lake, table_name, start, 10)
            lake.tier(table_name)
            stop.wait(0.2)  # all four steps happen, even if the query ends first
        while not stop.is_set():
            lake.tier(table_name)
            stop.wait(0.2)

    # Trigger.AvailableNow, limited to 70 records a batch: several batches, one of them
    # across the tiered watermark (cold 0..59 from files, hot 60.. through the gateway),
    # while a producer appends and tiering moves hot rows into Iceberg under the query.
    # AvailableNow reads up to the offsets it saw at its start: each partition's prefix,
    # of at least the 100 records there before, each record once.
    progress = run({"availableNow": True}, meanwhile=produce_and_tier)
    got = _sink(spark, out)
    for p in range(2):
        offsets = [o for q, o, _ in got if q == p]
        assert offsets == list(range(len(offsets))) and 100 <= len(offsets) <= 140
    assert set(got) <= set(_expected(140))
    # maxRecordsPerTrigger: a full first batch of 70, none larger, every record counted.
    sizes = [p["numInputRows"] for p in progress]
    assert sizes[0] == 70 and max(sizes) == 70 and sum(sizes) == len(got), sizes
    if fmt == SOURCES["jvm"]:  # natively: no Python data source in this session
        assert _source_of(progress) == f"TidegateMicroBatchStream[{table_name}]"
    with lake.gateway.client() as c:  # the producer finished: 140 per partition
        assert c.describe_table(table_name).high_watermarks == (140, 140)
    # Restarted from its checkpoint with ordinary micro-batches while rows arrive and
    # tiering moves them.
    run({"processingTime": "1 second"}, until=170)
    assert _sink(spark, out) == _expected(170)
    # Once more: nothing new is nothing read.
    run({"availableNow": True})
    assert _sink(spark, out) == _expected(170)


def test_a_checkpoint_moves_between_the_implementations(
    lake: LakeGateway, tg_spark: Any, table_name: str, tmp_path: Path
) -> None:
    """A query started on the Python source, resumed on the JVM connector (in a session
    with no Python source), then on the Python source again, from one checkpoint: each
    record once overall, and the offsets logged alike by both."""
    jvm = tg_spark.newSession()
    with lake.gateway.client() as c:
        c.create_table(table_name, {"n": "int64"}, partitions=2)
    options = lake.options(table_name, maxRecordsPerTrigger=30)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _append(lake, table_name, 0, 50)
    _drain(tg_spark, "tidegate_python", options, out, checkpoint)
    assert _sink(tg_spark, out) == _expected(50)
    # Cold 50..79 (tiered with 0..49) and hot 80..99: the JVM connector goes on from 50.
    _append(lake, table_name, 50, 30)
    lake.tier(table_name)
    _append(lake, table_name, 80, 20)
    with pytest.raises(Exception, match="tidegate_python"):  # not in this session
        jvm.readStream.format("tidegate_python").options(**options).load()
    progress = _drain(jvm, "tidegate", options, out, checkpoint)
    assert _source_of(progress) == f"TidegateMicroBatchStream[{table_name}]"
    assert _sink(tg_spark, out) == _expected(100)
    # The offsets log reads as the Python source writes it (json.dumps of a dict).
    last = max((checkpoint / "offsets").glob("[0-9]*"), key=lambda f: int(f.name))
    assert last.read_text().splitlines()[-1] == '{"0": 100, "1": 100}'
    # And back: the Python source resumes the JVM connector's checkpoint.
    _append(lake, table_name, 100, 20)
    _drain(tg_spark, "tidegate_python", options, out, checkpoint)
    assert _sink(tg_spark, out) == _expected(120)


#: Spark's own failure to start a Python worker within its fixed connect-back time (a
#: loaded 2-core machine): not the source's answer, so the query is run again.
SPARK_WORKER_STARTUP = "Python worker failed to connect back"


def _refusal(spark: Any, fmt: str, options: dict[str, str], folder: Path) -> str:
    """The message a stream query that must be refused fails with."""
    for attempt in range(3):
        try:
            _drain(spark, fmt, options, folder / f"out{attempt}", folder / f"cp{attempt}")
        except Exception as exc:
            if SPARK_WORKER_STARTUP in str(exc) and attempt < 2:
                continue
            return str(exc)
        raise AssertionError(f"the query with {options} was not refused")
    raise AssertionError("unreachable")


def test_stream_options_start_where_told_or_are_refused_in_one_sentence(
    lake: LakeGateway, stream_source: tuple[Any, str], table_name: str, tmp_path: Path
) -> None:
    spark, fmt = stream_source
    with lake.gateway.client() as c:
        c.create_table(table_name, {"n": "int64"}, partitions=2)
    _append(lake, table_name, 0, 10)
    # Partition 0 from offset 7, partition 1 from its high watermark (latest).
    starting = '{"0": 7, "1": -1}'
    options = lake.options(table_name, startingOffsets=starting)
    _drain(spark, fmt, options, tmp_path / "out", tmp_path / "checkpoint")
    assert _sink(spark, tmp_path / "out") == [(0, i, i) for i in range(7, 10)]
    refused = {
        "startingOffsets": (
            '{"0": 42',
            "option 'startingOffsets' is '{\"0\": 42'; give 'earliest', 'latest' or JSON",
        ),
        "partitions": (
            '{"5": 1}',
            "option 'startingOffsets' names partition '5'; the read covers partitions [0, 1]",
        ),
        "offset": (
            '{"0": -3}',
            "option 'startingOffsets' gives partition 0 the offset -3; "
            "give an offset >= 0, -2 (earliest) or -1 (latest)",
        ),
        "range": (
            '{"1": 42}',
            "startingOffsets gives partition 1 offset 42; it holds offsets "
            "0..10 (the high watermark)",
        ),
    }
    for name, (text, sentence) in refused.items():
        options = lake.options(table_name, startingOffsets=text)
        assert sentence in _refusal(spark, fmt, options, tmp_path / name)
    with pytest.raises(
        Exception, match=re.escape("option 'maxRecordsPerTrigger' is '-1'; give an integer >= 0")
    ):
        options = lake.options(table_name, maxRecordsPerTrigger=-1)
        _drain(spark, fmt, options, tmp_path / "max", tmp_path / "max-checkpoint")


def test_stream_writes_replayed_after_a_crash_store_nothing_twice(
    lake: LakeGateway, tg_spark: Any, table_name: str, tmp_path: Path
) -> None:
    source, sink = table_name, table_name + "copy"
    with lake.gateway.client() as c:
        c.create_table(source, {"n": "int64"}, partitions=2)
        c.create_table(sink, {"n": "int64"}, partitions=2)
    _append(lake, source, 0, 50)
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        stream = (
            tg_spark.readStream.format("tidegate")
            .options(**lake.options(source))
            .load()
            .select("n")
            .writeStream.format("tidegate")
            .options(**lake.options(sink))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        stream.awaitTermination(120)
        assert stream.exception() is None

    run()
    _append(lake, source, 50, 30)
    run()
    # A crash after the sink stored micro-batch 1 but before Spark recorded its commit:
    # the restarted query runs batch 1 again, and the gateway answers it as duplicates.
    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: p.name)
    assert [p.name for p in commits if not p.name.startswith(".")][-1] == "1"
    for p in (checkpoint / "commits").glob("*1*"):
        p.unlink()
    run()
    assert (checkpoint / "commits" / "1").exists()  # batch 1 ran again
    with lake.gateway.client() as c:
        got = sorted(r["n"] for r in c.scan(sink).to_pylist())
    assert got == sorted(p * 100_000 + i for p in range(2) for i in range(80))
    shutil.rmtree(checkpoint)


def test_a_stream_rides_through_two_gateway_restarts(
    redis_server: RedisServer,
    stream_source: tuple[Any, str],
    table_name: str,
    tmp_path: Path,
) -> None:
    """A streaming query whose gateway is SIGKILLed and started again, twice: the driver
    waits and reconnects (reconnectTimeout, for ever by default) instead of failing the
    query (its clients do not retry on their own: the stream rides each outage, with one
    log line, on Spark's worker's stderr), and every record reaches the sink once."""
    spark, fmt = stream_source
    lake = start_lake_gateway(tmp_path / "gw", redis_server, {}, {})
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    stream = None
    try:
        with lake.gateway.client() as c:
            c.create_table(table_name, {"n": "int64"}, partitions=2)
        _append(lake, table_name, 0, 50)
        stream = (
            spark.readStream.format(fmt)
            .options(**lake.options(table_name))
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        for n in (50, 100, 150):
            if n > 50:
                lake.gateway.restart()  # SIGKILL, then the same ports again
                _append(lake, table_name, n - 50, 50)
            deadline = time.monotonic() + 120
            while len(_sink(spark, out)) < 2 * n:
                assert time.monotonic() < deadline, stream.lastProgress
                assert stream.exception() is None, stream.exception()
                time.sleep(0.3)
        assert stream.isActive and stream.exception() is None
        assert _sink(spark, out) == _expected(150)
    finally:
        if stream is not None:
            stream.stop()
        lake.gateway.stop()
