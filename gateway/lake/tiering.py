"""Tiering without Spark: move each partition's hot range ``[T(p), HW(p))`` into Iceberg.

Usable in-process, with no Spark at all, through the :class:`LocalRunner` (plain threads)::

    from gateway.lake.components import Components
    from gateway.lake.runners import LocalRunner
    from gateway.lake.tiering import tier_table
    with Components.open(settings) as c:
        tier_table(c, table_def, runner=LocalRunner(c))

The Spark runner (``tiering.spark_runner``, chosen by name in :mod:`gateway.lake.runners`) runs
the very same :func:`~gateway.lake.tasks.write_range` as one Spark task per ``(table,
partition)`` range. Either way the driver commits once per table.

Exactly once, per table:

1. plan from the current snapshot ``S``: ``T(p)`` from its ``tidegate.watermarks`` and
   the sealed high watermark ``HW(p)`` read now (records appended later wait for the
   next run);
2. tasks write Parquet files sorted by ``(_partition, _offset)`` and return their
   :class:`~gateway.cold.base.DataFile` metadata (nothing is visible yet: a crash here
   leaves orphan files only, removed later by compaction's orphan clean-up);
3. the driver calls ``commit_tiered(files, {p: HW(p)}, base=S)``: data and watermarks in
   one Iceberg commit. A crash after it is harmless: the next run reads the new ``T(p)``
   from the snapshot and moves on. A concurrent commit raises ``CommitConflict``: we
   re-plan from the new snapshot (keeping the files whose range still starts at the new
   ``T(p)``) and retry, with backoff, a bounded number of times;
4. only then the cached watermarks in the metadata store are raised (a cache: the
   snapshot wins), and the hot tier is trimmed below the watermark that has been
   committed for at least ``hot_retention_s`` (:func:`trim_hot`).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.cold.base import (
    ColdSnapshot,
    ColdTable,
    DataFile,
)
from gateway.hot import PartitionId
from gateway.lake import keyed
from gateway.lake.components import Components, TieringError
from gateway.lake.passes import (
    CREATION_GRACE_S,
    RunReport,
    being_created,
    commit_retry,
    dropped,
    each_table,
    record_failure,
    with_lake_work,
)
from gateway.lake.runners import LocalRunner, Runner
from gateway.lake.tasks import RangeTask, crash_point
from gateway.wire.errors import CommitConflict, NotFound
from gateway.wire.retry import Retry

if TYPE_CHECKING:
    from gateway.meta import TableDef

# RunReport, commit_retry, each_table, record_failure and with_lake_work live in
# gateway.lake.passes (every lake job's pass over the tables) and stay importable from here.
__all__ = [
    "CREATION_GRACE_S",
    "RunReport",
    "TableResult",
    "being_created",
    "commit_retry",
    "crash_point",
    "dropped",
    "each_table",
    "record_failure",
    "tier_all",
    "tier_table",
    "trim_hot",
    "with_lake_work",
]

log = logging.getLogger("tidegate.tiering")


# --------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TableResult:
    table: str
    tenant: str
    #: Partition -> (old T(p), new T(p)) of the partitions this run moved.
    moved: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    records: int = 0
    bytes: int = 0
    files: int = 0
    attempts: int = 1
    conflicts: int = 0
    trimmed: Mapping[int, int] = field(default_factory=dict)
    snapshot_id: int | None = None
    #: A primary-key table's state table: partition -> (A(p) before, after) of the
    #: partitions this run applied (:mod:`gateway.lake.keyed`).
    applied: Mapping[int, tuple[int, int]] = field(default_factory=dict)


class _Lost(Exception):
    """The hot tier of a partition starts above its tiered watermark: it lost its state
    and was re-seeded higher (see ``AppendOps._hot_append``)."""

    def __init__(self, partition: int, tiered: int, low: int) -> None:
        super().__init__(partition, tiered, low)
        self.partition, self.tiered, self.low = partition, tiered, low


def _tasks(
    c: Components, d: TableDef, cold: ColdTable, base: ColdSnapshot, run_id: str
) -> list[RangeTask]:
    """The ranges to move, one per partition with records above ``T(p)``.

    Raises:
        _Lost: a partition's hot tier starts above ``T(p)``.
    """
    ranges = []
    for p in range(d.partitions):
        part = PartitionId(d.tenant, d.table_id, p)
        t = base.watermark(p)
        o = c.hot.offsets(part)
        if o.high <= t:
            continue
        if o.low > t:
            raise _Lost(p, t, o.low)
        ranges.append((p, t, o.high))
    if not ranges:
        return []
    # The schema is read after the high watermarks: a batch below them was accepted
    # against a schema the metadata store held before this read, so these fields know
    # every column of the rows to move; the Iceberg schema, read after, holds them too
    # (a schema change commits to Iceberg before the metadata store).
    fields = _current_fields(c, d)
    storage = c.cold.storage_options()
    target = c.settings.tiering.target_file_bytes
    file_schema = cold.file_schema()
    return [
        RangeTask(
            tenant=d.tenant,
            table_id=d.table_id,
            table=d.qualified_name,
            partition=p,
            start=start,
            end=end,
            fields=fields,
            location=cold.data_location(p),
            storage=storage,
            file_schema=file_schema,
            target_file_bytes=target,
            run_id=run_id,
            keyed=d.primary_key is not None,
        )
        for p, start, end in ranges
    ]


def _current_fields(c: Components, d: TableDef) -> tuple[Mapping[str, Any], ...]:
    """The table's user schema as the metadata store holds it now (``d`` may have been
    listed before a schema change)."""
    try:
        now = c.meta.get_table(d.tenant, d.namespace, d.name)
    except NotFound:
        return tuple(d.fields)
    return tuple(now.fields if now.table_id == d.table_id else d.fields)


@dataclass
class _Attempts:
    """One tiering run's state across its attempts: the ranges already written (kept when a
    new plan after a conflict still starts them at the same ``T(p)``) and the conflicts
    met so far."""

    c: Components
    d: TableDef
    cold: ColdTable
    runner: Runner
    retry: Retry
    run_id: str = field(default_factory=lambda: f"tier-{uuid.uuid4().hex[:16]}")
    started: float = field(default_factory=time.monotonic)
    written: dict[int, tuple[RangeTask, list[DataFile]]] = field(default_factory=dict)
    conflicts: int = 0
    attempt: int = 0

    def back_off(self, err: CommitConflict) -> None:
        """Wait before re-planning after ``err``; re-raise it once the retries are spent."""
        self.conflicts += 1
        delay = self.retry.next_delay(err, self.conflicts, self.started)
        if delay is None:
            raise err
        time.sleep(delay)

    def moved_on(self, base: ColdSnapshot, exc: Exception) -> bool:
        """:func:`_moved_on` for this run (counting the conflict when it re-plans)."""
        if not _moved_on(
            self.c, self.cold, base, exc, self.conflicts + 1, self.retry, self.started
        ):
            return False
        self.conflicts += 1
        return True

    def once(self) -> _Committed | None:
        """One attempt: plan from the current snapshot, write what is not written yet,
        commit. ``None`` when the run must re-plan."""
        self.attempt += 1
        base = self.cold.snapshot()
        try:
            tasks = _tasks(self.c, self.d, self.cold, base, self.run_id)
        except _Lost as lost:
            self.record_lost(lost, base)
            return None
        except TieringError as exc:
            if not self.moved_on(base, exc):
                raise
            return None
        if not tasks:
            tiered = {p: base.watermark(p) for p in range(self.d.partitions)}
            return _Committed(base, base.snapshot_id, {}, [], tiered)
        try:
            files = self.write(tasks)
        except Exception as exc:
            if not self.moved_on(base, exc):
                raise
            return None
        plan = {t.partition: self.written[t.partition][0] for t in tasks}
        marks = {p: t.end for p, t in plan.items()}
        crash_point("before_commit")
        try:
            snap = self.cold.commit_tiered(files, marks, base)
        except CommitConflict as err:
            self.back_off(err)
            log.info(
                "%s: commit conflict, re-planning (attempt %d)", self.d.qualified_name, self.attempt
            )
            return None
        crash_point("after_commit")
        moved = {p: (t.start, t.end) for p, t in plan.items()}
        tiered = {p: marks.get(p, base.watermark(p)) for p in range(self.d.partitions)}
        return _Committed(base, snap.snapshot_id, moved, files, tiered)

    def record_lost(self, lost: _Lost, base: ColdSnapshot) -> None:
        """Record a partition's range lost with its hot tier's state.

        Only ever after the hot tier lost its state (trims stay below committed
        watermarks, retention commits before it trims): the gateway that re-seeded the
        partition records the range as lost; this does it when that did not get through.
        On the current snapshot only (a conflict re-plans)."""
        try:
            self.cold.commit_lost(lost.partition, lost.low, base)
        except CommitConflict as err:
            self.back_off(err)
            return
        log.error(
            "%s partition %d: the hot tier starts at %d, above the tiered watermark %d: "
            "offsets %d to %d were lost with the hot tier's state; recorded as lost",
            self.d.qualified_name,
            lost.partition,
            lost.low,
            lost.tiered,
            lost.tiered,
            lost.low - 1,
        )

    def write(self, tasks: list[RangeTask]) -> list[DataFile]:
        """The files of ``tasks``: those already written for a range that still starts at
        ``T(p)`` (up to its planned end; what was appended since waits for the next run),
        and the rest written now (a new plan after a conflict may start and end later)."""
        todo = []
        files = []
        for t in tasks:
            prev = self.written.get(t.partition)
            if prev is not None and prev[0].start == t.start:
                files.extend(prev[1])
            else:
                todo.append(t)
        new_files = self.runner.write(self.d.tenant, todo)
        by_part: dict[int, list[DataFile]] = defaultdict(list)
        for f in new_files:
            by_part[f.partition].append(f)
        for t in todo:
            self.written[t.partition] = (t, by_part.get(t.partition, []))
        files.extend(new_files)
        return files


@dataclass(frozen=True, slots=True)
class _Committed:
    """What the attempt that ended a run left: the snapshot it planned from, the one it
    made (the same when there was nothing to move), the ranges and files it committed and
    each partition's ``T(p)`` after it."""

    base: ColdSnapshot
    snapshot_id: int | None
    moved: dict[int, tuple[int, int]]
    files: list[DataFile]
    tiered: dict[int, int]


def tier_table(
    c: Components,
    d: TableDef,
    *,
    runner: Runner | None = None,
    retry: Retry | None = None,
    trim: bool = True,
) -> TableResult:
    """Tier one table: plan, write, commit once (retrying a conflict from the new
    snapshot), refresh the cached watermarks, then trim the hot tier (:func:`trim_hot`).

    Raises:
        CommitConflict: still conflicting after ``retry.attempts`` tries.
        TieringError, or the hot or cold tier's error, when the table cannot be tiered.
    """
    began = dt.datetime.now(dt.UTC)
    cold = c.cold.table(d)
    if d.primary_key is not None:
        keyed.ensure_changelog(cold, d)
    run = _Attempts(c, d, cold, runner or LocalRunner(c), retry or commit_retry(c))
    done = None
    while done is None:
        done = run.once()
    # A key table's state table before the bookkeeping: the run's lake work is marked
    # done only once its changes are applied too (a run killed in between leaves the
    # mark, so the next pass applies them).
    applied = (
        keyed.apply_changes(c, d, cold, retry=retry).ranges if d.primary_key is not None else {}
    )
    _bookkeep(c, d, done, began)
    trimmed: dict[int, int] = {}
    if trim and (done.base.snapshot_id is not None or c.settings.tiering.hot_retention_s <= 0):
        # A table's first commit (no snapshot before it) leaves nothing committed
        # hot_retention_s ago to trim: skipped without two more loads of its metadata.
        trimmed = trim_hot(c, d, cold)
        _trim_done(c, d)
    result = TableResult(
        table=d.qualified_name,
        tenant=d.tenant,
        moved=done.moved,
        records=sum(e - s for s, e in done.moved.values()),
        bytes=sum(f.file_size_bytes for f in done.files),
        files=len(done.files),
        attempts=run.attempt,
        conflicts=run.conflicts,
        trimmed=trimmed,
        snapshot_id=done.snapshot_id,
        applied=applied,
    )
    _observe(result)
    return result


def _bookkeep(c: Components, d: TableDef, done: _Committed, began: dt.datetime) -> None:
    """The metadata store's side of a run, in one commit (issue 30): the cached
    watermarks, the run's record and the lake work it covered and made due."""
    moved = done.moved
    compactable = may_compact(done.files, done.base, moved, c.settings.compaction.min_files)
    with c.meta.transaction():
        if moved:
            c.meta.update_tiered_watermarks(d.table_id, {p: e for p, (_, e) in moved.items()})
            count = sum(e - s for s, e in moved.values())
            c.meta.record_run(
                d.table_id, "tier", "ok", f"{count} records in snapshot {done.snapshot_id}"
            )
        _after_tiering(c, d, done.tiered, began, committed=bool(moved), compactable=compactable)
    if moved:
        crash_point("after_cache")


def _after_tiering(
    c: Components,
    d: TableDef,
    tiered: Mapping[int, int],
    began: dt.datetime,
    *,
    committed: bool,
    compactable: bool,
) -> None:
    """The lake work of ``d`` after a tiering run that began at ``began`` (issue 30):
    the ``tier`` marks it covered go (a partition's once ``T(p)`` reached what was
    acknowledged); a commit asks for the work it makes due later (the hot tier's trim
    ``hot_retention_s`` on, compaction now if it left something to compact (see
    :func:`may_compact`), snapshot expiry and orphan clean-up once their windows have
    passed)."""
    from gateway.meta.work import TABLE_LEVEL, Mark

    now = dt.datetime.now(dt.UTC)
    s = c.settings
    hold = s.tiering.hot_retention_s
    if committed:
        # Whether or not this process schedules them: a Spark deployment runs them
        # as CronJobs, with the embedded schedules off.
        later = [
            *([("compact", 0.0)] if compactable else []),
            ("expire", s.expiry.retention_s),
            ("orphans", s.expiry.orphan_age_s),
            *([("trim", hold)] if hold > 0 else []),
        ]
        c.meta.mark_work(
            Mark(d.table_id, TABLE_LEVEL, job, since=now, due_at=now + dt.timedelta(seconds=w))
            for job, w in later
        )
    c.meta.finish_tiering(d.table_id, tiered, began)


def _trim_done(c: Components, d: TableDef) -> None:
    """After :func:`trim_hot`: the ``trim`` mark of every commit made ``hot_retention_s``
    ago or more is done. Never fails the run: a mark that stays costs a visit."""
    hold = c.settings.tiering.hot_retention_s
    if hold <= 0:
        return
    now = dt.datetime.now(dt.UTC)
    try:
        c.meta.finish_work(d.table_id, "trim", now - dt.timedelta(seconds=hold), hold)
    except Exception as exc:
        log.warning("%s: recording its lake work failed (%s)", d.qualified_name, exc)


def may_compact(
    files: Iterable[DataFile], base: ColdSnapshot, moved: Mapping[int, Any], min_files: int
) -> bool:
    """Whether a commit of ``files`` (the ranges ``moved``, onto ``base``) can have left a
    partition that compaction would rewrite: one that held files before it (``T(p)`` above
    0 in ``base``) or that got ``min_files`` or more now. A table's first commit of one
    file per partition, which every table written once and then left idle makes, leaves
    nothing to compact: it asks for no compaction visit (issue 30)."""
    per_partition = Counter(f.partition for f in files)
    return any(base.watermark(p) > 0 or per_partition[p] >= min_files for p in moved)


def _moved_on(
    c: Components,
    cold: ColdTable,
    base: ColdSnapshot,
    exc: Exception,
    conflicts: int,
    retry: Retry,
    started: float,
) -> bool:
    """Whether a run that failed reading the hot tier should re-plan: a retention that
    committed since ``base`` raised T(p) and trimmed the hot tier under the plan (then
    wait as after a commit conflict and say yes); else the failure is the run's own."""
    if cold.snapshot().snapshot_id == base.snapshot_id:
        return False
    delay = retry.next_delay(CommitConflict(str(exc)), conflicts, started)
    if delay is None:
        return False
    log.info("%s: the table moved on under the run (%s); re-planning", cold.name, exc)
    time.sleep(delay)
    return True


def trim_hot(
    c: Components, d: TableDef, cold: ColdTable | None = None, *, now: float | None = None
) -> dict[int, int]:
    """Trim the hot tier of ``d`` below the tiered watermark that was already committed
    ``hot_retention_s`` ago: ``T_{now - retention}(p)``, the watermark of the last
    snapshot at or before that time (when each watermark was reached is the snapshot's
    own timestamp). Never above the current ``T(p)``; a primary-key table's never above
    its state table's ``A(p)`` either, then or now (a scan pinned to a state snapshot
    reads the changes above its ``A(p)`` from the hot tier). Returns partition -> new low
    mark for the partitions trimmed."""
    cold = cold or c.cold.table(d)
    current = cold.snapshot()
    if current.snapshot_id is None:
        return {}
    retention = c.settings.tiering.hot_retention_s
    at: dt.datetime | None = None
    if retention > 0:
        at = dt.datetime.fromtimestamp((now or time.time()) - retention, dt.UTC)
        try:
            old = cold.snapshot(at)
        except NotFound:
            return {}
    else:
        old = current
    applied = keyed.applied_since(c, d, at) if d.primary_key is not None else None
    out = {}
    for p in range(d.partitions):
        below = min(old.watermark(p), current.watermark(p))
        if applied is not None:
            below = min(below, applied.get(p, 0))
        if below <= 0:
            continue
        part = PartitionId(d.tenant, d.table_id, p)
        if not c.hot.needs_trim(part, below):
            continue
        out[p] = c.hot.trim(part, below)
    return out


def _observe(result: TableResult) -> None:
    try:
        from gateway import metrics
    except ImportError:  # pragma: no cover - the server extra is absent
        return
    record = getattr(metrics, "record_tiering", None)
    if record is not None:
        record(result)


def tier_all(
    c: Components,
    *,
    runner: Runner | None = None,
    tables: Iterable[TableDef] | None = None,
    retry: Retry | None = None,
    trim: bool = True,
    max_parallel_tenants: int = 4,
    on_table: Callable[[TableDef, TableResult | BaseException], None] | None = None,
) -> RunReport[TableResult]:
    """Tier every table (or ``tables``). Tenants run side by side (one driver thread
    each, so a Spark runner puts each in its own fair-scheduler pool); a table that fails
    is reported and never stops another table or tenant."""
    runner = runner or LocalRunner(c)
    return each_table(
        c,
        lambda d: tier_table(c, d, runner=runner, retry=retry, trim=trim),
        job="tiering",
        tables=tables,
        max_parallel_tenants=max_parallel_tenants,
        on_table=on_table or record_failure(c, "tier"),
        on_failure=_observe_failure,
    )


def _observe_failure() -> None:
    try:
        from gateway import metrics
    except ImportError:  # pragma: no cover
        return
    fail = getattr(metrics, "record_tiering_failure", None)
    if fail is not None:
        fail()
