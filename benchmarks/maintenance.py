"""Lake maintenance: what compaction buys a table made of many small tiering commits, and
what it costs against pyiceberg rewriting the same rows.

The table (one partition on the Redis-backed gateway, whose embedded schedule is off) is
built by ``files`` tiering commits of ``records_per_file`` records each, one small file per
commit, run in this process as ``tidegate tier`` would. Then, in the same run:

* stream reads of ``read_chunk`` records at random offsets (closed loop) and one whole-table
  scan (timed whole) through the gateway, before compaction;
* pyiceberg reading the same small files (a ``scan().to_arrow()`` of the table) and
  appending the rows, sorted by offset, as one file to a new table of the same catalog and
  warehouse: what a rewrite with pyiceberg alone costs (baseline of the next row);
* ``compact_table`` with the local runner (plan, rewrite, commit), timed;
* the same stream reads and scans after compaction, compared with those before.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from dataclasses import replace
from typing import Any

from benchmarks.cold import _one_pass, gateway_scanner
from benchmarks.harness import Bench, compare
from benchmarks.loadgen import Result, Workload, closed_loop
from benchmarks.scenarios import create_table, drop_table, fill, gateway_reader


async def run_compaction(b: Bench, w: Workload) -> list[dict[str, Any]]:
    gw = b.tiered
    md = b.auth(gw)
    commits = w.files[0]
    name = f"{w.name}-{commits}-commits"
    one = replace(w, producers=1)
    rows: list[dict[str, Any]] = []
    async with b.stub(gw) as stub:
        ref = await create_table(stub, f"small{commits}", 1, md)
        try:
            with b.components() as c:
                from gateway.lake.compaction import compact_table

                d = b.table_def(c, ref)
                n = await fill(
                    stub,
                    ref,
                    md,
                    records=commits * w.records_per_file,
                    batch_records=w.records_per_file,
                    record_bytes=w.record_bytes,
                )
                await asyncio.to_thread(_small_commits, c, d, commits, w.records_per_file)
                await asyncio.sleep(1.0)  # the gateway's snapshot cache turns over
                read = gateway_reader(stub, ref, md)
                rng = random.Random(commits)
                starts = [rng.randrange(0, n - w.read_chunk) for _ in range(100_000)]

                async def read_op(r: int, call: int) -> tuple[int, int]:
                    at = starts[call % len(starts)]
                    return await read(0, at, w.read_chunk)  # type: ignore[no-any-return]

                scan_op = gateway_scanner(stub, ref, md)

                async def measure() -> tuple[Result, Result]:
                    """Stream reads (closed loop), then one whole-table scan, timed whole
                    (a scan of many small files can outlast the loop's window), of the
                    table as it is now."""
                    files = c.cold.table(d).file_stats(1, 1 << 62).data_files
                    read_res = Result(f"{name}-read", f"tidegate stream read, {files} files")
                    await closed_loop(one, read_res, read_op)
                    scan_res = Result(f"{name}-scan", f"tidegate Scan, {files} files")
                    t0 = time.monotonic()
                    records, _ = await scan_op(0, 0)
                    _one_pass(scan_res, records, w, time.monotonic() - t0)
                    return read_res, scan_res

                read_before, scan_before = await measure()

                table = await asyncio.to_thread(b.iceberg_table, ref)
                base = Result(
                    f"{name}-compaction",
                    "pyiceberg scan().to_arrow() + append sorted, one file (baseline)",
                )
                took = await asyncio.to_thread(_pyiceberg_rewrite, b, table)
                _one_pass(base, n, w, took)
                t0 = time.monotonic()
                result = await asyncio.to_thread(compact_table, c, d)
                took = time.monotonic() - t0
                if result.records != n:
                    raise RuntimeError(f"compacted {result.records} records of {n}")
                comp = Result(f"{name}-compaction", "tidegate compact_table (local runner)")
                _one_pass(comp, n, w, took)
                comp.extra["files_before"] = result.removed
                comp.extra["files_after"] = result.added
                await asyncio.sleep(1.0)

                read_after, scan_after = await measure()
        finally:
            await drop_table(stub, ref, md)
    rows += [read_before.summary(), compare(read_after.summary(), [read_before.summary()])]
    rows += [scan_before.summary(), compare(scan_after.summary(), [scan_before.summary()])]
    rows += [base.summary(), compare(comp.summary(), [base.summary()])]
    return rows


def _pyiceberg_rewrite(b: Bench, table: Any) -> float:
    """Seconds pyiceberg takes to read the table's small files and write their rows as
    one file of a new table (created and dropped around the measurement)."""
    catalog = b.catalog()
    ns = f"bench_rewrite_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(ns)
    try:
        target = catalog.create_table((ns, "rewrite"), schema=table.schema())
        t0 = time.monotonic()
        rows = (
            table.scan().to_arrow().sort_by([("_partition", "ascending"), ("_offset", "ascending")])
        )
        target.append(rows)
        return time.monotonic() - t0
    finally:
        with contextlib.suppress(Exception):
            catalog.purge_table((ns, "rewrite"))
            catalog.drop_namespace(ns)


def _small_commits(c: Any, d: Any, commits: int, per: int) -> None:
    """Tier partition 0 as ``commits`` tiering commits of ``per`` records, one file each:
    the ranges a tiering run every interval would have moved (the same tasks and commit as
    ``tier_table``, cut by hand so the table is built without waiting for intervals)."""
    from gateway.lake.tasks import RangeTask, write_range

    cold = c.cold.table(d)
    storage = c.cold.storage_options()
    schema = cold.file_schema()
    for k in range(commits):
        base = cold.snapshot()
        task = RangeTask(
            tenant=d.tenant,
            table_id=d.table_id,
            table=d.qualified_name,
            partition=0,
            start=k * per,
            end=(k + 1) * per,
            fields=tuple(d.fields),
            location=cold.data_location(0),
            storage=storage,
            file_schema=schema,
            target_file_bytes=1 << 40,
            run_id=f"bench-{k}",
        )
        cold.commit_tiered(write_range(task, c.hot), {0: task.end}, base)
