"""Primary-key tables in the lake: a tiering run applies a key table's changes to its
*state table* (docs/decisions/primary-keys.md, "A key-table's lake half is
copy-on-write").

The changelog is tiered first, as any table's records are
(:func:`~gateway.lake.tiering.tier_table`): its Iceberg table then holds every change
below ``T(p)``. Then, per partition with
``A(p) < T(p)`` (``A`` = the state table's ``tidegate.applied``):

1. the changes ``[A(p), T(p))`` are read from the changelog table;
2. the state files whose bounds of the key's first column hold a changed key are read
   (a key lives in one file, and that file's bounds hold it), and
   :func:`~gateway.wire.changes.merge_snapshot` folds the changes into their rows
   (last-row: the log is resolved at write); keys no file holds join them;
3. the result is written as new files sorted by the key, and one overwrite commit of the
   state table replaces the files read by them and raises ``tidegate.applied`` to
   ``T(p)`` for every partition of the run.

Exactly once: a crash before the commit leaves orphan files only, and the next run finds
``A(p) < T(p)`` and applies the same range again from the changelog; after it, the
summary says ``A(p) = T(p)`` and nothing is applied twice. A concurrent commit (another
run of the same table) fails the commit's check of its base snapshot: the run re-plans
from the new snapshot, where the ranges start at the new ``A(p)``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from gateway.cold.base import ColdSnapshot, ColdTable, DataFile, StateTable, fs_path, key_values
from gateway.lake.components import Components
from gateway.lake.passes import commit_retry
from gateway.lake.tasks import crash_point
from gateway.wire.changes import CHANGE_COLUMN, CHANGE_TYPE, PrimaryKey, merge_snapshot
from gateway.wire.errors import CommitConflict, NotFound
from gateway.wire.schema import parse_fields

if TYPE_CHECKING:
    from gateway.meta import TableDef
    from gateway.wire.retry import Retry

__all__ = [
    "Applied",
    "StateCompaction",
    "applied_since",
    "apply_changes",
    "compact_state",
    "ensure_changelog",
]

log = logging.getLogger("tidegate.tiering")


@dataclass(frozen=True, slots=True)
class Applied:
    """What a run did to a key table's state table."""

    #: Partition -> (A(p) before, A(p) after) of the partitions it applied.
    ranges: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    #: Changes read, files replaced and written, live rows in the files written.
    changes: int = 0
    removed: int = 0
    added: int = 0
    rows: int = 0
    snapshot_id: int | None = None
    attempts: int = 1


def ensure_changelog(cold: ColdTable, d: TableDef) -> None:
    """Give a key table's changelog Iceberg table ``_change`` when it lacks it: one
    made at a first use (a scan, a describe) before key tables were tiered has the user
    and system columns only."""
    if CHANGE_COLUMN in cold.file_schema().names:
        return
    log_schema = parse_fields(d.fields, stored=True).append(
        pa.field(CHANGE_COLUMN, CHANGE_TYPE, nullable=False)
    )
    cold.evolve_schema(log_schema, {})


def apply_changes(
    c: Components, d: TableDef, changelog: ColdTable, *, retry: Retry | None = None
) -> Applied:
    """Apply the changes the changelog table holds above the state table's
    ``tidegate.applied`` to the state table, in one commit (see the module).

    Raises:
        CommitConflict: still conflicting after ``retry.attempts`` tries.
    """
    assert d.primary_key is not None
    state = c.cold.state_table(d)
    retry = retry or commit_retry(c)
    started = time.monotonic()
    conflicts = 0
    attempt = 0
    while True:
        attempt += 1
        marks = changelog.snapshot()
        base = state.snapshot()
        todo = {
            p: (base.applied_through(p), marks.watermark(p))
            for p in range(d.partitions)
            if base.applied_through(p) < marks.watermark(p)
        }
        if not todo:
            return Applied(snapshot_id=base.snapshot_id, attempts=attempt)
        run = _Run(c, d, changelog, state)
        try:
            for p, (a, t) in sorted(todo.items()):
                run.partition(marks, base, p, a, t)
            crash_point("before_state_commit")
            snap = state.commit_state(
                run.removed, run.added, {p: t for p, (_, t) in todo.items()}, base
            )
        except CommitConflict as err:
            run.discard()
            conflicts += 1
            delay = retry.next_delay(err, conflicts, started)
            if delay is None:
                raise
            log.info("%s: state table commit conflict, re-planning", d.qualified_name)
            time.sleep(delay)
            continue
        except BaseException:
            run.discard()
            raise
        crash_point("after_state_commit")
        return Applied(
            ranges=todo,
            changes=run.changes,
            removed=len(run.removed),
            added=len(run.added),
            rows=sum(f.record_count for f in run.added),
            snapshot_id=snap.snapshot_id,
            attempts=attempt,
        )


def applied_since(c: Components, d: TableDef, at: dt.datetime | None) -> dict[int, int]:
    """Per partition, the lower of the state table's ``A(p)`` now and at ``at`` (the
    snapshot current then; None: now only), what the hot tier may be trimmed below;
    empty when the state table had no snapshot at ``at``."""
    state = c.cold.state_table(d)
    now = state.snapshot()
    if at is None:
        return dict(now.applied)
    try:
        then = state.snapshot(at)
    except NotFound:
        return {}
    return {p: min(a, now.applied_through(p)) for p, a in then.applied.items()}


@dataclass(frozen=True, slots=True)
class StateCompaction:
    """What a compaction did to a key table's state table: files replaced and written,
    live rows rewritten, bytes on storage before and after."""

    removed: int = 0
    added: int = 0
    rows: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    snapshot_id: int | None = None


def compact_state(c: Components, d: TableDef) -> StateCompaction:
    """Merge each partition's small state files (below ``compaction.small_file_bytes``
    on storage, at least ``compaction.min_files`` of them) into files sorted by the key
    of about ``compaction.target_file_bytes`` on storage, in one commit that keeps
    ``tidegate.applied``. A tiering run that committed meanwhile wins: the compaction
    is dropped (its files deleted) and the next one plans afresh."""
    assert d.primary_key is not None
    cfg = c.settings.compaction
    state = c.cold.state_table(d)
    base = state.snapshot()
    if base.snapshot_id is None:
        return StateCompaction()
    run = _Run(c, d, c.cold.table(d), state)
    try:
        for p in range(d.partitions):
            small = [
                f.file
                for f in state.key_files(base, p)
                if f.file.file_size_bytes < cfg.small_file_bytes
            ]
            if len(small) < cfg.min_files:
                continue
            rows = state.read_files(small)
            stored = max(1, sum(f.file_size_bytes for f in small))
            # The target on storage in Arrow bytes, at the inputs' compression.
            target = int(cfg.target_file_bytes * max(1.0, rows.nbytes / stored))
            run.added.extend(state.write_files(p, rows, target))
            run.removed.extend(small)
        if not run.removed:
            return StateCompaction(snapshot_id=base.snapshot_id)
        snap = state.commit_state(run.removed, run.added, {}, base, operation="compact")
    except CommitConflict:
        run.discard()
        log.info("%s: state compaction dropped: a tiering run committed first", d.qualified_name)
        return StateCompaction(snapshot_id=base.snapshot_id)
    except BaseException:
        run.discard()
        raise
    return StateCompaction(
        removed=len(run.removed),
        added=len(run.added),
        rows=sum(f.record_count for f in run.added),
        bytes_before=sum(f.file_size_bytes for f in run.removed),
        bytes_after=sum(f.file_size_bytes for f in run.added),
        snapshot_id=snap.snapshot_id,
    )


@dataclass
class _Run:
    """One attempt's files: those it replaces and those it wrote."""

    c: Components
    d: TableDef
    changelog: ColdTable
    state: StateTable
    removed: list[DataFile] = field(default_factory=list)
    added: list[DataFile] = field(default_factory=list)
    changes: int = 0

    def partition(
        self, marks: ColdSnapshot, base: ColdSnapshot, p: int, start: int, end: int
    ) -> None:
        """Fold partition ``p``'s changes ``[start, end)`` into the state files whose
        keys they touch (module step 2) and write the result."""
        assert self.d.primary_key is not None
        key = self.d.primary_key.columns
        batches = list(self.changelog.read_range(marks, p, start, end))
        changes = pa.Table.from_batches(batches) if batches else None
        if changes is None or changes.num_rows == 0:
            return  # lost with a hot tier's state: nothing to apply, A(p) moves on
        self.changes += changes.num_rows
        firsts = key_values(changes.column(key[0]))
        touched = [f.file for f in self.state.key_files(base, p) if f.may_hold(firsts)]
        rows = merge_snapshot(self.state.read_files(touched), changes, PrimaryKey(key))
        target = self.c.settings.tiering.target_file_bytes
        self.added.extend(self.state.write_files(p, rows, target))
        self.removed.extend(touched)

    def discard(self) -> None:
        """Delete the files this attempt wrote (never committed: no reader knows them)."""
        if not self.added:
            return
        filesystem = self.c.cold.storage_options().filesystem()[0]
        for f in self.added:
            with contextlib.suppress(OSError):
                filesystem.delete_file(fs_path(f.path))
        self.added = []
