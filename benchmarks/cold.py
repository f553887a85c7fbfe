"""Scenarios over the Iceberg cold tier: stream reads cold and across the boundary, table
scans, how a read's cost grows with the table, tiering throughput and freshness.

They run on the Redis-backed gateway, whose embedded schedule is off: a scenario tiers
its table itself, in this process (``gateway.lake.tiering``, as ``tidegate tier`` would) or with
a ``tidegate tier --every`` job beside the gateway. Baselines open the same Iceberg table
with pyiceberg and the same Parquet files with pyarrow, with no Tidegate code in the way.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import random
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import redis.asyncio as aioredis

from benchmarks.harness import Bench, compare
from benchmarks.loadgen import BatchFactory, Result, Workload, closed_loop, drive
from benchmarks.scenarios import (
    FlightReader,
    create_table,
    drop_table,
    fill,
    fill_workload,
    gateway_reader,
)
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from tests.services import REPO_ROOT


def _local_path(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri


@dataclass(frozen=True)
class FileIndex:
    """The data files of one partition of an Iceberg table with their ``_offset`` range,
    read once from the Parquet footers: what a reader that knows the layout needs."""

    starts: list[int]
    files: list[tuple[int, int, str]]  # (first offset, last offset, local path)

    @classmethod
    def of(cls, table: Any, partition: int = 0) -> FileIndex:
        files = []
        for task in table.scan(row_filter=f"_partition == {partition}").plan_files():
            path = _local_path(task.file.file_path)
            meta = pq.ParquetFile(path).metadata
            first = meta.row_group(0)
            col = next(
                j for j in range(first.num_columns) if first.column(j).path_in_schema == "_offset"
            )
            stats = [meta.row_group(i).column(col).statistics for i in range(meta.num_row_groups)]
            lo, hi = min(s.min for s in stats), max(s.max for s in stats)
            files.append((lo, hi, path))
        files.sort()
        return cls([f[0] for f in files], files)

    def read(self, start: int, end: int) -> pa.Table:
        """Records ``[start, end)`` with pyarrow alone: open just the files holding them."""
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        parts = []
        while i < len(self.files) and self.files[i][0] < end:
            _, hi, path = self.files[i]
            if hi >= start:
                parts.append(
                    pq.read_table(path, filters=[("_offset", ">=", start), ("_offset", "<", end)])
                )
            i += 1
        return pa.concat_tables(parts) if parts else pa.table({})

    @property
    def paths(self) -> list[str]:
        return [f[2] for f in self.files]


async def _tier(b: Bench, ref: Any, **tiering: Any) -> tuple[float, Any]:
    """Tier ``ref`` now, in this process; returns (seconds, TableResult)."""
    from gateway.lake.tiering import tier_table

    def run() -> tuple[float, Any]:
        with b.components(**tiering) as c:
            d = b.table_def(c, ref)
            t0 = time.monotonic()
            res = tier_table(c, d)
            return time.monotonic() - t0, res

    return await asyncio.to_thread(run)


async def _until_tiered(stub: Any, ref: Any, metadata: Any, expected: int) -> None:
    """Wait until the gateway serves ``expected`` as partition 0's tiered watermark and its
    stream-read snapshot cache (``cold.snapshot_cache_ms``, 500 ms) has turned over."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = await stub.DescribeTable(pb.DescribeTableRequest(table=ref), metadata=metadata)
        if min(p.tiered_watermark for p in info.partition_info) >= expected:
            await asyncio.sleep(1.0)
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"tiered watermark never reached {expected}")


def gateway_scanner(stub: Any, ref: Any, metadata: Any) -> Any:
    """A closed-loop op: one whole-table ``Scan`` through the gateway."""

    async def op(r: int, call: int) -> tuple[int, int]:
        records = nbytes = 0
        async for msg in stub.Scan(pb.ScanRequest(table=ref), metadata=metadata):
            for batch in pa.ipc.open_stream(pa.py_buffer(msg.arrow_ipc)):
                records += batch.num_rows
                nbytes += batch.nbytes
        return records, nbytes

    return op


def _blocking(fn: Any) -> Any:
    """A closed-loop op running the blocking baseline ``fn(worker, call)`` in a thread."""

    async def op(r: int, call: int) -> tuple[int, int]:
        t: pa.Table = await asyncio.to_thread(fn, r, call)
        return t.num_rows, t.nbytes

    return op


# --------------------------------------------------------------------------------------
# Stream reads cold and across the boundary, and table scans
# --------------------------------------------------------------------------------------
async def run_reads(b: Bench, w: Workload) -> list[dict[str, Any]]:
    """One partition of ``read_records`` records, all tiered (cold reads and scans), then
    ``hot_records`` more appended on top (reads across the boundary)."""
    gw = b.tiered
    md = b.auth(gw)
    rows: list[dict[str, Any]] = []
    async with b.stub(gw) as stub:
        ref = await create_table(stub, "cold", 1, md)
        try:
            n = await fill_workload(stub, ref, md, w)
            await _tier(b, ref)
            await _until_tiered(stub, ref, md, n)
            table = await asyncio.to_thread(b.iceberg_table, ref)
            index = await asyncio.to_thread(FileIndex.of, table)
            read = gateway_reader(stub, ref, md)
            chunk = w.read_chunk
            edge = b.passthroughs["redis"]
            await asyncio.to_thread(edge.register, ref, index.files)

            def seq(r: int, call: int) -> int:
                first = (r * n // max(1, w.producers)) // chunk * chunk
                return (first + call * chunk) % n

            # Stream reads, cold ---------------------------------------------------------
            cold_w = f"{w.name}-stream-cold"
            base = Result(cold_w, "pyarrow on the Parquet files (baseline)")
            await closed_loop(
                w, base, _blocking(lambda r, c: index.read(seq(r, c), seq(r, c) + chunk))
            )
            res = Result(cold_w, "tidegate stream read (cold)")

            async def cold_op(r: int, call: int) -> tuple[int, int]:
                return await read(0, seq(r, call), chunk)  # type: ignore[no-any-return]

            await closed_loop(w, res, cold_op)
            flight = FlightReader(gw.flight_port, ref, md)
            by_flight = Result(cold_w, "tidegate Flight stream read (cold)")

            async def flight_op(r: int, call: int) -> tuple[int, int]:
                return await flight.read(0, seq(r, call), chunk)

            await closed_loop(w, by_flight, flight_op)
            async with b.stub_at(edge.grpc_target) as edge_stub:
                edge_read = gateway_reader(edge_stub, ref, ())
                through = Result(cold_w, "pass-through gRPC edge, Parquet files (baseline)")

                async def through_op(r: int, call: int) -> tuple[int, int]:
                    return await edge_read(0, seq(r, call), chunk)  # type: ignore[no-any-return]

                await through_op(0, 0)  # a first call connects (Tidegate's stub is warm)
                await closed_loop(w, through, through_op)
                edge_scan = gateway_scanner(edge_stub, ref, ())
                through_scan = Result(
                    f"{w.name}-scan", "pass-through gRPC edge, Parquet files (baseline)"
                )
                await closed_loop(replace(w, producers=1), through_scan, edge_scan)
            edge_flight = FlightReader(edge.flight_port, ref, ())
            through_flight = Result(cold_w, "pass-through Flight edge, Parquet files (baseline)")

            async def through_flight_op(r: int, call: int) -> tuple[int, int]:
                return await edge_flight.read(0, seq(r, call), chunk)

            await through_flight_op(0, 0)
            await closed_loop(w, through_flight, through_flight_op)
            through_flight_scan = Result(
                f"{w.name}-scan", "pass-through Flight edge, Parquet files (baseline)"
            )
            await closed_loop(replace(w, producers=1), through_flight_scan, edge_flight.scan)
            edge_flight.close()
            grpc_edge = compare(through.summary(), [base.summary()])
            flight_edge = compare(through_flight.summary(), [base.summary()])
            sdk_reads = await _sdk_reads(b, gw, ref, w, cold_w, seq)
            rows += [
                base.summary(),
                grpc_edge,
                flight_edge,
                compare(res.summary(), [base.summary(), grpc_edge]),
                compare(by_flight.summary(), [base.summary(), flight_edge]),
                *(compare(r, [base.summary()]) for r in sdk_reads),
            ]

            # Table scans ------------------------------------------------------------------
            scan_w = replace(w, producers=1)
            scan_name = f"{w.name}-scan"
            arrow = Result(scan_name, "pyarrow read_table of the files (baseline)")
            await closed_loop(
                scan_w, arrow, _blocking(lambda r, c: ds.dataset(index.paths).to_table())
            )
            iceberg = Result(scan_name, "pyiceberg scan().to_arrow() (baseline)")
            await closed_loop(
                scan_w,
                iceberg,
                _blocking(lambda r, c: table.scan().to_arrow()),
            )
            duck = Result(scan_name, "DuckDB iceberg_scan of the table (baseline)")
            await closed_loop(scan_w, duck, _blocking(_duckdb_scan(table.metadata_location)))
            scan = Result(scan_name, "tidegate Scan (all cold)")

            await closed_loop(scan_w, scan, gateway_scanner(stub, ref, md))
            flight_scan = Result(scan_name, "tidegate Flight scan (all cold)")
            await closed_loop(scan_w, flight_scan, flight.scan)
            sdk_rows = await _sdk_scans(b, gw, ref, scan_w, scan_name)
            bases = [arrow.summary(), iceberg.summary(), duck.summary()]
            grpc_scan_edge = compare(through_scan.summary(), bases)
            flight_scan_edge = compare(through_flight_scan.summary(), bases)
            rows += [
                *bases,
                grpc_scan_edge,
                flight_scan_edge,
                compare(scan.summary(), [*bases, grpc_scan_edge]),
                compare(flight_scan.summary(), [*bases, flight_scan_edge]),
                *(compare(r, bases) for r in sdk_rows),
            ]

            # Stream reads across the cold/hot boundary -------------------------------------
            hot = await fill(
                stub,
                ref,
                md,
                records=w.hot_records,
                batch_records=w.batch_records,
                record_bytes=w.record_bytes,
            )
            rows += await _boundary(b, w, n, hot, index, read, flight.read)
            flight.close()
        finally:
            await drop_table(stub, ref, md)
    return rows


async def _sdk_reads(
    b: Bench, gw: Any, ref: Any, w: Workload, name: str, seq: Any
) -> list[dict[str, Any]]:
    """The SDK's client-side stream reads (issue 43): ``Client.read(mode="client")`` of the
    same chunks as the other cold reads, the records read from the Parquet files by the
    client (one plan of the partition, kept; a footer per file, kept), from the warehouse
    folder and through the gateway's file links. One client per row, shared by the
    workload's concurrent readers, as an application would share it."""
    from gateway.client import Client

    table = f"{ref.namespace}.{ref.name}"
    folder = b.settings().cold_warehouse
    chunk = w.read_chunk
    rows = []
    for system, warehouse in (
        ("tidegate SDK client-side read, warehouse folder (cold)", folder),
        ("tidegate SDK client-side read, file links (cold)", None),
    ):
        with Client(gw.grpc_target, api_key=gw.api_key, warehouse=warehouse) as sdk:

            def op(r: int, c: int, sdk: Any = sdk) -> pa.Table:
                return sdk.read(
                    table, partition=0, offset=seq(r, c), max_records=chunk, mode="client"
                )

            op(0, 0)  # connects and plans, as the other rows' first call connects
            res = Result(name, system)
            await closed_loop(w, res, _blocking(op))
        rows.append(res.summary())
    return rows


async def _sdk_scans(b: Bench, gw: Any, ref: Any, w: Workload, name: str) -> list[dict[str, Any]]:
    """The SDK's client-side scans (issue 43): ``Client.scan(mode="client")`` plans once
    and reads the Parquet files itself, from the warehouse folder (as a client on the
    gateway's host, or with the warehouse mounted, reads them) and through the gateway's
    file links (as any other client does)."""
    from gateway.client import Client

    table = f"{ref.namespace}.{ref.name}"
    folder = b.settings().cold_warehouse
    rows = []
    for system, warehouse in (
        ("tidegate SDK client-side scan, warehouse folder (all cold)", folder),
        ("tidegate SDK client-side scan, file links (all cold)", None),
    ):
        with Client(gw.grpc_target, api_key=gw.api_key, warehouse=warehouse) as sdk:
            sdk.scan(table, mode="client")  # connects, finds the Flight edge
            res = Result(name, system)
            await closed_loop(w, res, _blocking(lambda r, c: sdk.scan(table, mode="client")))
        rows.append(res.summary())
    return rows


def _duckdb_scan(metadata_location: str) -> Any:
    """A scan of the whole table by DuckDB's ``iceberg_scan`` (the offline extension
    packages of PyPI), the engine a user might pick for scans instead of pyiceberg: one
    connection with the extensions loaded, a fresh cursor per scan."""
    import duckdb

    from tests.cold.helpers import extension_file

    con = duckdb.connect()
    for name in ("avro", "iceberg"):
        con.execute(f"INSTALL '{extension_file(name)}'")
        con.execute(f"LOAD {name}")
    location = metadata_location.removeprefix("file://")

    def scan(r: int, c: int) -> pa.Table:
        cur = con.cursor()
        try:
            return cur.execute(f"SELECT * FROM iceberg_scan('{location}')").arrow().read_all()
        finally:
            cur.close()

    return scan


async def _boundary(
    b: Bench, w: Workload, cold: int, hot: int, index: FileIndex, read: Any, flight_read: Any
) -> list[dict[str, Any]]:
    """Reads of ``read_chunk`` records that start below the tiered watermark and end
    above it. Baseline: pyarrow for the cold part plus XRANGE of the same records kept in
    a Redis stream for the hot part, decoded with pyarrow."""
    chunk = min(w.read_chunk, 2 * hot)
    name = f"{w.name}-stream-boundary"

    def start_of(r: int, call: int) -> int:
        # Starts spread over the chunk-1 positions whose read crosses the watermark.
        return cold - chunk + 1 + (r * 7919 + call * 997) % (chunk - 1)

    factory = BatchFactory(w.batch_records, w.record_bytes)
    client = aioredis.from_url(b.redis.url)
    key = f"bench:{uuid.uuid4().hex[:8]}:boundary"
    try:
        for i in range(hot // w.batch_records):
            await client.xadd(key, {"d": factory.ipc(i)}, id=f"{cold + i * w.batch_records}-1")

        async def baseline(r: int, call: int) -> tuple[int, int]:
            start = start_of(r, call)
            cold_part = await asyncio.to_thread(index.read, start, cold)
            n, nbytes = cold_part.num_rows, cold_part.nbytes
            entries = await client.xrange(
                key, min=f"{cold}-1", count=-(-(start + chunk - cold) // w.batch_records)
            )
            for _, fields in entries:
                for batch in pa.ipc.open_stream(pa.py_buffer(fields[b"d"])):
                    n += batch.num_rows
                    nbytes += batch.nbytes
            return n, nbytes

        base = Result(name, "pyarrow files + redis-py XRANGE (baseline)")
        await closed_loop(w, base, baseline)
    finally:
        await client.delete(key)
        await client.aclose()
    res = Result(name, "tidegate stream read (cold + hot)")

    async def op(r: int, call: int) -> tuple[int, int]:
        return await read(0, start_of(r, call), chunk)  # type: ignore[no-any-return]

    await closed_loop(w, res, op)
    by_flight = Result(name, "tidegate Flight stream read (cold + hot)")

    async def flight_op(r: int, call: int) -> tuple[int, int]:
        return await flight_read(0, start_of(r, call), chunk)  # type: ignore[no-any-return]

    await closed_loop(w, by_flight, flight_op)
    return [
        base.summary(),
        compare(res.summary(), [base.summary()]),
        compare(by_flight.summary(), [base.summary()]),
    ]


# --------------------------------------------------------------------------------------
# How a read's cost grows with the table's size
# --------------------------------------------------------------------------------------
async def run_read_cost(b: Bench, w: Workload) -> list[dict[str, Any]]:
    """Tables of ``files`` data files of ``records_per_file`` records each (one tiering
    commit, one file per appended batch); a closed loop of single reads of
    ``read_chunk`` records at a random offset, by one reader."""
    rows: list[dict[str, Any]] = []
    async with b.stub(b.tiered) as stub:
        for files in w.files:
            rows += await _read_cost(b, w, stub, files)
    return rows


async def _read_cost(b: Bench, w: Workload, stub: Any, files: int) -> list[dict[str, Any]]:
    md = b.auth(b.tiered)
    name = f"{w.name}-{files}-files"
    one = replace(w, producers=1)
    ref = await create_table(stub, f"files{files}", 1, md)
    try:
        n = await fill(
            stub,
            ref,
            md,
            records=files * w.records_per_file,
            batch_records=w.records_per_file,
            record_bytes=w.record_bytes,
        )
        # Files roll after each stored batch: exactly one per appended batch.
        await _tier(b, ref, target_file_bytes=1024)
        await _until_tiered(stub, ref, md, n)
        table = await asyncio.to_thread(b.iceberg_table, ref)
        index = await asyncio.to_thread(FileIndex.of, table)
        rng = random.Random(files)
        starts = [rng.randrange(0, n - w.read_chunk) for _ in range(100_000)]

        def at(call: int) -> int:
            return starts[call % len(starts)]

        def pyarrow_read(r: int, c: int) -> pa.Table:
            return index.read(at(c), at(c) + w.read_chunk)

        def pyiceberg_read(r: int, c: int) -> pa.Table:
            expr = f"_offset >= {at(c)} and _offset < {at(c) + w.read_chunk}"
            return table.scan(row_filter=expr).to_arrow()

        arrow = Result(name, "pyarrow on the files holding the range (baseline)")
        await closed_loop(one, arrow, _blocking(pyarrow_read))
        iceberg = Result(name, "pyiceberg filtered scan (baseline)")
        await closed_loop(one, iceberg, _blocking(pyiceberg_read))
        read = gateway_reader(stub, ref, md)
        res = Result(name, "tidegate stream read")

        async def op(r: int, call: int) -> tuple[int, int]:
            return await read(0, at(call), w.read_chunk)  # type: ignore[no-any-return]

        await closed_loop(one, res, op)
    finally:
        await drop_table(stub, ref, md)
    bases = [arrow.summary(), iceberg.summary()]
    rows = [*bases, compare(res.summary(), bases)]
    for row in rows:
        row["data_files"] = len(index.files)
    return rows


# --------------------------------------------------------------------------------------
# Tiering throughput and freshness
# --------------------------------------------------------------------------------------
async def run_tiering(b: Bench, w: Workload) -> list[dict[str, Any]]:
    """One tiering pass over a backlog of ``read_records`` records in ``partitions``
    partitions, against pyiceberg appending the same rows from memory into a new table of
    the same catalog and warehouse."""
    gw = b.tiered
    md = b.auth(gw)
    factory = BatchFactory(w.batch_records, w.record_bytes)
    batches = max(1, w.read_records // w.batch_records)
    rows_in_memory = pa.Table.from_batches([factory.batch(i) for i in range(batches)])

    def pyiceberg_append() -> float:
        catalog = b.catalog()
        ns = f"bench_baseline_{uuid.uuid4().hex[:8]}"
        catalog.create_namespace(ns)
        table = catalog.create_table((ns, "append"), schema=rows_in_memory.schema)
        t0 = time.monotonic()
        table.append(rows_in_memory)
        took = time.monotonic() - t0
        with contextlib.suppress(Exception):
            catalog.purge_table((ns, "append"))
            catalog.drop_namespace(ns)
        return took

    base = Result(w.name, "pyiceberg append of the same rows (baseline)")
    _one_pass(base, rows_in_memory.num_rows, w, await asyncio.to_thread(pyiceberg_append))
    res = Result(w.name, f"tidegate tiering pass ({w.partitions} partitions, local runner)")
    async with b.stub(gw) as stub:
        ref = await create_table(stub, "tiering", w.partitions, md)
        try:
            n = await fill_workload(stub, ref, md, w, partitions=w.partitions)
            took, report = await _tier(b, ref)
            if report.records != n:
                raise RuntimeError(f"tiered {report.records} records of {n}")
            _one_pass(res, n, w, took)
            res.extra["data_files"] = report.files
        finally:
            await drop_table(stub, ref, md)
    return [base.summary(), compare(res.summary(), [base.summary()])]


def _one_pass(result: Result, records: int, w: Workload, seconds: float) -> None:
    result.batches = 1
    result.records = records
    result.bytes = records * w.record_bytes
    result.seconds = seconds
    result.ack.record_value(max(1, int(seconds * 1e6)))


async def run_freshness(b: Bench, w: Workload) -> list[dict[str, Any]]:
    """Appends at a fixed rate while a ``tidegate tier --every`` job runs beside the
    gateway; a watcher polls the Iceberg table (pyiceberg, every 50 ms) and records, per
    acknowledged batch, the time from its intended send to the first snapshot whose
    tiered watermark covers it (``e2e`` in the results)."""
    gw = b.tiered
    md = b.auth(gw)
    result = Result(w.name, f"tidegate tier --every {w.tier_every_s:g} (local runner)")
    factory = BatchFactory(w.batch_records, w.record_bytes)
    job: subprocess.Popen[bytes] | None = None
    async with b.stub(gw) as stub:
        ref = await create_table(stub, "fresh", w.partitions, md)
        try:
            job = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gateway",
                    "tier",
                    "--every",
                    str(w.tier_every_s),
                    "--log-level",
                    "WARNING",
                ],
                env=gw.env(),
                cwd=str(REPO_ROOT),
            )
            table = await asyncio.to_thread(b.iceberg_table, ref)
            # partition -> [(last offset, intended wall ns)], in offset order.
            waiting: dict[int, list[tuple[int, int]]] = defaultdict(list)
            measure_from = time.time_ns() + int(w.warmup_s * 1e9)

            async def send(p: int, sent_ns: int) -> None:
                part = p % w.partitions
                resp = await stub.Append(
                    pb.AppendRequest(table=ref, arrow_ipc=factory.ipc(sent_ns), partition=part),
                    metadata=md,
                )
                r = resp.ranges[0]
                if sent_ns >= measure_from:
                    bisect.insort(waiting[part], (r.base_offset + r.count - 1, sent_ns))

            done = asyncio.Event()

            async def watch() -> None:
                while not (done.is_set() and not any(waiting.values())):
                    await asyncio.to_thread(table.refresh)
                    now = time.time_ns()
                    marks = _watermarks(table)
                    for part, items in waiting.items():
                        t = marks.get(part, 0)
                        while items and items[0][0] < t:
                            _, sent = items.pop(0)
                            result.e2e.record_value(max(1, (now - sent) // 1000))
                    await asyncio.sleep(0.05)

            watcher = asyncio.create_task(watch())
            await drive(w, result, send, w.batch_records, w.batch_bytes)
            done.set()
            await asyncio.wait_for(watcher, 60 + 5 * w.tier_every_s)
        finally:
            if job is not None:
                job.terminate()
                try:
                    job.wait(30)
                except subprocess.TimeoutExpired:
                    job.kill()
            await drop_table(stub, ref, md)
    row = result.summary()
    row["tier_every_s"] = w.tier_every_s
    return [row]


def _watermarks(table: Any) -> dict[int, int]:
    snap = table.current_snapshot()
    if snap is None or snap.summary is None:
        return {}
    raw = snap.summary.additional_properties.get("tidegate.watermarks")
    return {int(k): int(v) for k, v in json.loads(raw).items()} if raw else {}
