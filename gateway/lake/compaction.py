"""Compaction without Spark: rewrite runs of small data files into files near the target
size, per table and partition.

Tiering commits a few files every interval, so a long-lived stream-table fills with small
files; every stream read and scan then opens many. Compaction, per table:

1. plans from the current snapshot ``S``: in each partition, files in offset order; a run
   of adjacent files each below ``compaction.small_file_bytes`` (on storage) is cut into
   bins of at most ``compaction.target_file_bytes``; a bin of at least
   ``compaction.min_files`` files is one :class:`RewriteTask`;
2. tasks (threads of the :class:`~gateway.lake.tiering.LocalRunner`, or Spark tasks of the
   same runner tiering uses) read their files with pyarrow and write one Parquet file sorted
   by ``(_partition, _offset)`` holding exactly their records (nothing is visible yet: a
   crash leaves orphan files only);
3. the driver commits ``commit_rewrite(removed, added, base=S)``: one Iceberg overwrite that
   keeps the current ``tidegate.watermarks``. A tiering commit that landed since ``S``
   only added files, so the rewrite applies to the new snapshot (its inputs are still
   live): it is retried from there. When an input is no longer live (another compaction
   won), the run gives up cleanly: nothing is committed and its files are deleted.

A crash at any point leaves either the old files or the new ones live, never both and
never neither: the commit is one metadata swap.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa

from gateway.cold.base import (
    DataFile,
    RewriteObsolete,
    StorageOptions,
    fs_path,
    write_data_file,
)
from gateway.lake import keyed
from gateway.lake.components import Components, TieringError
from gateway.lake.passes import (
    RunReport,
    commit_retry,
    each_table,
    record_failure,
    with_lake_work,
)
from gateway.lake.runners import LocalRunner, Runner
from gateway.lake.tasks import crash_point
from gateway.wire.errors import CommitConflict

if TYPE_CHECKING:
    from gateway.cold.base import ColdTable
    from gateway.hot import HotLog
    from gateway.meta import TableDef
    from gateway.wire.retry import Retry

__all__ = [
    "CRASH_POINT_ENV",
    "CompactionResult",
    "RewriteTask",
    "compact_all",
    "compact_table",
    "plan_bins",
    "rewrite_files",
]

log = logging.getLogger("tidegate.compaction")

#: Crash-test hook: the job SIGKILLs its own process at this point (``after_plan``,
#: ``after_write``, ``after_commit``). Only for tests of exactly-once; never set it else.
CRASH_POINT_ENV = "TIDEGATE_COMPACTION_CRASH_POINT"

_LAST_OFFSET = 2**63 - 1


@dataclass(frozen=True, slots=True)
class RewriteTask:
    """One run of small files of one partition to rewrite into one file: serialisable,
    shipped to a Spark executor like tiering's range tasks."""

    job: ClassVar[str] = "compact"
    needs_hot: ClassVar[bool] = False

    tenant: str
    table: str
    partition: int
    #: The files to rewrite, in offset order.
    inputs: tuple[DataFile, ...]
    location: str
    storage: StorageOptions
    file_schema: pa.Schema

    def run(self, hot: HotLog | None) -> list[DataFile]:
        return rewrite_files(self)


def rewrite_files(task: RewriteTask) -> list[DataFile]:
    """Read the task's files and write their records as one Parquet file sorted by
    offset, in the table's file schema. Pure pyarrow; nothing is committed here.

    Raises:
        TieringError: the files do not hold the records their metadata promises.
    """
    import pyarrow.dataset as ds

    filesystem, _ = task.storage.filesystem()
    # One dataset over the files: pyarrow reads them on its I/O threads, in parallel.
    rows = ds.dataset(
        [fs_path(f.path) for f in task.inputs],
        schema=task.file_schema,
        format="parquet",
        filesystem=filesystem,
    ).to_table()
    expected = sum(f.record_count for f in task.inputs)
    if rows.num_rows != expected:
        raise TieringError(
            f"{task.table} partition {task.partition}: the files to compact hold "
            f"{rows.num_rows} records, their metadata says {expected}"
        )
    return [write_data_file(task.storage, task.location, rows, task.file_schema)]


def plan_bins(
    files: Iterable[DataFile], *, small_bytes: int, target_bytes: int, min_files: int
) -> list[list[DataFile]]:
    """Runs of adjacent small files (in offset order) cut into bins of at most
    ``target_bytes`` on storage; bins of fewer than ``min_files`` files are left alone.
    A file of ``small_bytes`` or more ends a run: it is never rewritten, and files on
    either side of it are never merged across it (files stay disjoint in offsets). So
    does a gap in the offsets (a range lost with a hot tier's state): a file holds
    consecutive offsets only."""
    bins: list[list[DataFile]] = []
    run: list[DataFile] = []
    size = 0

    def close() -> None:
        nonlocal run, size
        if len(run) >= min_files:
            bins.append(run)
        run, size = [], 0

    for f in sorted(files, key=lambda f: (f.min_offset, f.path)):
        if f.file_size_bytes >= small_bytes:
            close()
            continue
        if run and (
            size + f.file_size_bytes > target_bytes or f.min_offset != run[-1].max_offset + 1
        ):
            close()
        run.append(f)
        size += f.file_size_bytes
    close()
    return bins


@dataclass(frozen=True, slots=True)
class CompactionResult:
    table: str
    tenant: str
    #: Files replaced and files written.
    removed: int = 0
    added: int = 0
    #: Records rewritten.
    records: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    attempts: int = 0
    conflicts: int = 0
    #: True when the run gave up because its inputs were replaced under it.
    obsolete: bool = False
    snapshot_id: int | None = None


def _plan(c: Components, d: TableDef, cold: ColdTable) -> list[RewriteTask]:
    cfg = c.settings.compaction
    base = cold.snapshot()
    if base.snapshot_id is None:
        return []
    storage = c.cold.storage_options()
    file_schema = cold.file_schema()
    tasks = []
    for p in range(d.partitions):
        files = cold.files(base, p, 0, _LAST_OFFSET)
        for run in plan_bins(
            files,
            small_bytes=cfg.small_file_bytes,
            target_bytes=cfg.target_file_bytes,
            min_files=cfg.min_files,
        ):
            tasks.append(
                RewriteTask(
                    tenant=d.tenant,
                    table=d.qualified_name,
                    partition=p,
                    inputs=tuple(run),
                    location=cold.data_location(p),
                    storage=storage,
                    file_schema=file_schema,
                )
            )
    return tasks


def _discard(c: Components, files: Sequence[DataFile]) -> None:
    """Delete files written by a rewrite that will never be committed (best effort:
    what is left is an orphan for the orphan clean-up)."""
    filesystem, _ = c.cold.storage_options().filesystem()
    for f in files:
        with contextlib.suppress(OSError):
            filesystem.delete_file(fs_path(f.path))


def compact_table(
    c: Components,
    d: TableDef,
    *,
    runner: Runner | None = None,
    retry: Retry | None = None,
) -> CompactionResult:
    """Compact one table: plan from the current snapshot, rewrite, commit once (retrying
    a conflicting commit from the new snapshot; giving up cleanly when the inputs were
    replaced meanwhile).

    Raises:
        CommitConflict: still conflicting after ``retry.attempts`` tries (nothing
            committed; the written files are deleted).
        TieringError, or the cold tier's error, when the table cannot be compacted.
    """
    runner = runner or LocalRunner(c)
    retry = retry or commit_retry(c)
    # A key table's state table first (its own small files, its own commit).
    state = keyed.compact_state(c, d) if d.primary_key is not None else keyed.StateCompaction()
    cold = c.cold.table(d)
    base = cold.snapshot()
    tasks = _plan(c, d, cold)
    if not tasks:
        what = (
            f"state table: rewrote {state.removed} files into {state.added}"
            if state.removed
            else "nothing to compact"
        )
        c.meta.record_run(d.table_id, "compact", "ok", what)
        return CompactionResult(
            d.qualified_name,
            d.tenant,
            removed=state.removed,
            added=state.added,
            records=state.rows,
            bytes_before=state.bytes_before,
            bytes_after=state.bytes_after,
            snapshot_id=base.snapshot_id,
        )
    crash_point("after_plan", CRASH_POINT_ENV)
    removed = [f for t in tasks for f in t.inputs]
    added = runner.write(d.tenant, tasks)
    crash_point("after_write", CRASH_POINT_ENV)
    started = time.monotonic()
    conflicts = 0
    attempt = 0
    while True:
        attempt += 1
        try:
            snap = cold.commit_rewrite(removed, added, base)
        except RewriteObsolete as err:
            log.info("%s: compaction dropped: %s", d.qualified_name, err.message)
            _discard(c, added)
            c.meta.record_run(d.table_id, "compact", "ok", f"dropped: {err.message}")
            return CompactionResult(
                d.qualified_name, d.tenant, attempts=attempt, conflicts=conflicts, obsolete=True
            )
        except CommitConflict as err:
            conflicts += 1
            delay = retry.next_delay(err, conflicts, started)
            if delay is None:
                _discard(c, added)
                raise
            time.sleep(delay)
            base = cold.snapshot()
            continue
        break
    crash_point("after_commit", CRASH_POINT_ENV)
    result = CompactionResult(
        table=d.qualified_name,
        tenant=d.tenant,
        removed=len(removed) + state.removed,
        added=len(added) + state.added,
        records=sum(f.record_count for f in added) + state.rows,
        bytes_before=sum(f.file_size_bytes for f in removed) + state.bytes_before,
        bytes_after=sum(f.file_size_bytes for f in added) + state.bytes_after,
        attempts=attempt,
        conflicts=conflicts,
        snapshot_id=snap.snapshot_id,
    )
    c.meta.record_run(
        d.table_id,
        "compact",
        "ok",
        f"rewrote {result.removed} files into {result.added} ({result.records} records)",
    )
    log.info(
        "%s: compacted %d files into %d (%d records)",
        d.qualified_name,
        result.removed,
        result.added,
        result.records,
    )
    return result


def compact_all(
    c: Components,
    *,
    runner: Runner | None = None,
    tables: Iterable[TableDef] | None = None,
    retry: Retry | None = None,
    max_parallel_tenants: int = 4,
    on_table: Callable[[TableDef, CompactionResult | BaseException], None] | None = None,
) -> RunReport[CompactionResult]:
    """Compact every table (or ``tables``), tenants side by side as tiering does: one
    tenant's failure or size neither stops nor starves another's compaction."""
    runner = runner or LocalRunner(c)
    return each_table(
        c,
        lambda d: with_lake_work(
            c, d, "compact", 0.0, lambda: compact_table(c, d, runner=runner, retry=retry)
        ),
        job="compaction",
        tables=tables,
        max_parallel_tenants=max_parallel_tenants,
        on_table=on_table or record_failure(c, "compact"),
    )
