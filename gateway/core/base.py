"""What every part of the core shares: the backends, the I/O pool, and the caches of table
definitions, cold table handles and snapshots."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

import pyarrow as pa

from gateway.config import Settings
from gateway.core.budget import ReadBudget
from gateway.core.recent import RecentBatches
from gateway.core.views import TableView
from gateway.hot import HotLog, LogOffsets, PartitionId
from gateway.meta import TABLE_VIEW_TTL_S, MetadataStore, StorageMark, TableDef
from gateway.wire.errors import (
    InvalidPartition,
    InvalidRequest,
    SnapshotNotFound,
    TableNotFound,
    Unavailable,
)
from gateway.wire.filters import FilterLimits
from gateway.wire.schema import parse_fields

if TYPE_CHECKING:
    from gateway.cold import ColdSnapshot, ColdStore, ColdTable
    from gateway.cold.base import StateTable

__all__ = ["TABLE_CACHE_MAX", "CoreBase", "LruDict"]

P = ParamSpec("P")
R = TypeVar("R")
K = TypeVar("K")

_TABLE_CACHE_TTL_S = TABLE_VIEW_TTL_S
#: Tables whose definition (and round-robin counter) a process keeps at most.
TABLE_CACHE_MAX = 8192
#: How often a process records the high watermarks it acknowledged (see ``_mark``).
MARKS_INTERVAL_S = 1.0
#: How long a gateway that found a shared hot tier's partition state lost waits before it
#: reads the high watermarks recorded (``AppendOps._reseed``): long enough for every live
#: gateway to have recorded what it acknowledged before the loss.
RESEED_WAIT_S = 2 * MARKS_INTERVAL_S + 0.5
#: Tenants whose tables' storage samples are kept (``TableOps.storage_of``).
STORAGE_TENANTS_MAX = 1024

log = logging.getLogger(__name__)


class _Notifier:
    """Wakes followers of a partition when this process appends to it."""

    def __init__(self) -> None:
        self._events: dict[PartitionId, asyncio.Event] = {}

    def event(self, part: PartitionId) -> asyncio.Event:
        ev = self._events.get(part)
        if ev is None:
            ev = self._events[part] = asyncio.Event()
        return ev

    def notify(self, part: PartitionId) -> None:
        ev = self._events.pop(part, None)
        if ev is not None:
            ev.set()


class BoundedSet(Generic[K]):
    """A set that forgets everything once it holds ``limit`` items: for memos whose
    loss only costs work done again."""

    def __init__(self, limit: int) -> None:
        self._items: set[K] = set()
        self._limit = limit

    def __contains__(self, item: K) -> bool:
        return item in self._items

    def add(self, item: K) -> None:
        if len(self._items) >= self._limit:
            self._items.clear()
        self._items.add(item)

    def discard(self, item: K) -> None:
        self._items.discard(item)


V = TypeVar("V")
D = TypeVar("D")


@dataclass(frozen=True, slots=True)
class StorageSample:
    """A table's bytes in each tier, sampled when its storage mark was ``mark``."""

    mark: StorageMark
    hot_bytes: int
    cold_bytes: int


class LruDict(OrderedDict[K, V]):
    """A dict that keeps its ``limit`` most recently used items (a read by ``get`` or
    ``[]`` counts as a use): for caches and per-tenant or per-table state whose loss only
    costs a lookup again, so that memory is bounded whatever the number of tenants and
    tables (issue 30.4)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __getitem__(self, key: K) -> V:
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    @overload
    def get(self, key: K, default: None = None, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V, /) -> V: ...
    @overload
    def get(self, key: K, default: D, /) -> V | D: ...
    def get(self, key: K, default: Any = None, /) -> Any:
        if key in self:
            return self[key]
        return default

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)

    def setdefault(self, key: K, default: V, /) -> V:
        if key in self:
            return self[key]
        self[key] = default
        return default


class SchemaMemo(BoundedSet[tuple[str, str, int, bytes]]):
    """A bounded set of ``(check, table id, schema version, schema message)``: the schema
    messages that passed ``check`` for that version. It forgets everything once full
    (dropped tables and clients sending ever-new schema bytes cannot grow it); forgetting
    only costs a check again."""

    def __init__(self, limit: int = 4096) -> None:
        super().__init__(limit)


class CoreBase:
    """The state the operation groups (:mod:`~gateway.core.tables`,
    :mod:`~gateway.core.appends`, :mod:`~gateway.core.reads`, :mod:`~gateway.core.scans`,
    :mod:`~gateway.core.groups`) share. It talks to the hot log, the cold store and the
    metadata store only through their interfaces."""

    def __init__(
        self,
        settings: Settings,
        meta: MetadataStore,
        hot: HotLog,
        cold: ColdStore | None = None,
    ) -> None:
        self.settings = settings
        self.meta = meta
        self.hot = hot
        hot.bind_placements(meta)
        #: The Iceberg tier; None serves the hot tier alone (``cold.enabled=false``).
        self.cold = cold
        #: Table id -> (schema version, handle).
        self._cold_tables: dict[str, tuple[int, ColdTable]] = {}
        #: A primary-key table's state table handle, as ``_cold_tables``, and the state
        #: snapshot its lookups of keys not hot last used.
        self._state_tables: dict[str, tuple[int, StateTable]] = {}
        self._state_snaps: dict[str, tuple[float, ColdSnapshot]] = {}
        self._snapshots: dict[str, tuple[float, ColdSnapshot]] = {}
        #: (table id, snapshot id) -> when the lease this process took for read plans of
        #: that snapshot ends (``time.monotonic``; ``ScanOps._plan_lease``). On the event
        #: loop only.
        self._plan_leases: LruDict[tuple[str, int], float] = LruDict(TABLE_CACHE_MAX)
        self._pool = ThreadPoolExecutor(settings.server.io_threads, thread_name_prefix="tg-io")
        #: Table definitions by name, and the round-robin counters of keyless tables:
        #: for the tables in use (bounded, whatever the number of tables).
        self._tables: LruDict[tuple[str, str, str], tuple[float, TableView]] = LruDict(
            TABLE_CACHE_MAX
        )
        self._round_robin: LruDict[str, itertools.count[int]] = LruDict(TABLE_CACHE_MAX)
        #: Arrow schema messages already checked against a table's schema version, so a
        #: schema seen before is recognised by its bytes: appended streams found to be
        #: exactly it (``AppendOps._as_is``), hot payloads found to read under it
        #: (``ReadOps._check_stored_schema``).
        self._schemas_checked = SchemaMemo()
        #: Partitions whose hot tier this process found at or above ``T(p)`` (checked at
        #: its first append to each; see ``AppendOps._hot_append``). Bounded: forgetting
        #: only costs a check again.
        self._hot_checked: BoundedSet[PartitionId] = BoundedSet(65536)
        #: Partitions this process marked for tiering at its first append to them (see
        #: ``AppendOps._hot_append``). Bounded: forgetting only costs a mark again.
        self._marked: BoundedSet[PartitionId] = BoundedSet(65536)
        #: Table id -> partition -> (the highest offset + 1 this process acknowledged since
        #: it last recorded them in the metadata store (every second, and at close), the
        #: time of the first of those appends): what a partition is re-seeded above if its
        #: hot state is lost (``AppendOps._reseed``), and what the lake jobs visit.
        self._marks: dict[str, dict[int, tuple[int, dt.datetime]]] = {}
        #: Tenant -> table id -> the table's last storage sample (``TableOps.storage_of``),
        #: for the tenants sampled lately (bounded). Worker threads of the metering flush
        #: and of the hot-bytes quota use it at once: under ``_storage_lock``.
        self._storage: LruDict[str, dict[str, StorageSample]] = LruDict(STORAGE_TENANTS_MAX)
        self._storage_lock = threading.Lock()
        self._marks_task: asyncio.Task[None] | None = None
        self._notifier = _Notifier()
        #: Key tables' change batches appended or read lately (``gateway.core.keyed``).
        self._recent = RecentBatches()
        #: Read data held at once, for the process and per tenant.
        self.budget = ReadBudget(
            settings.server.read_memory_bytes,
            settings.server.tenant_read_memory_bytes,
        )
        s = settings.server
        self._filter_limits = FilterLimits(
            s.max_filter_chars, s.max_filter_terms, s.max_filter_depth
        )

    def _reseed(self, table: TableView, part: PartitionId, why: str) -> None:
        """Re-open a partition whose hot state was lost (``AppendOps._reseed``)."""
        raise NotImplementedError

    def _unless_lost(
        self, table: TableView, part: PartitionId, o: LogOffsets, recorded: int, tiered: int
    ) -> LogOffsets:
        """``o``, the hot tier's offsets of ``part``; or, when they end below the high
        watermark the metadata store recorded (offsets acknowledged, and gone with the hot
        tier's state: an emptied Redis, a removed disk partition), the offsets once the
        partition is re-seeded and the range recorded lost, as the next append would do.
        A partition nobody appends to again would otherwise keep its loss unrecorded, and
        read as if those offsets had never been assigned."""
        if o.high >= recorded or o.high > tiered:
            return o
        self._reseed(
            table,
            part,
            f"the hot tier holds partition {part.path} up to offset {o.high}, below the "
            f"{recorded} acknowledged: it lost its state",
        )
        return self.hot.offsets(part)

    async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def offload(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run CPU-heavy work of an edge (encoding a response) on the I/O pool, so that
        the event loop keeps serving other requests meanwhile."""
        return await self._run(fn, *args, **kwargs)

    def close(self) -> None:
        if self._marks_task is not None:
            self._marks_task.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(Exception):  # best effort: the hot tier still has them
            self._record_marks()
        self.hot.close()
        if self.cold is not None:
            self.cold.close()
        self.meta.close()

    def _mark(self, part: PartitionId, end: int) -> None:
        """Remember that ``part`` has offsets assigned below ``end`` (an acknowledged
        append), to be recorded by :meth:`_record_marks`, with the time of the first
        append since the last recording (the oldest record the lake jobs must move)."""
        marks = self._marks.setdefault(part.table_id, {})
        had = marks.get(part.partition)
        if had is None:
            marks[part.partition] = (end, dt.datetime.now(dt.UTC))
        elif had[0] < end:
            marks[part.partition] = (end, had[1])

    def _record_marks(self) -> None:
        """Raise the metadata store's high watermarks to what this process acknowledged
        and mark those partitions for tiering (one transaction): the lake jobs visit
        only what was marked (issue 30)."""
        marks, self._marks = self._marks, {}
        try:
            self.meta.record_appends(marks)
        except BaseException:
            for table_id, rest in marks.items():  # kept for the next time
                mine = self._marks.setdefault(table_id, {})
                for p, (end, at) in rest.items():
                    had = mine.get(p)
                    mine[p] = (end, at) if had is None else (max(end, had[0]), min(at, had[1]))
            raise

    def _start_recording_marks(self) -> None:
        if self._marks_task is None:
            self._marks_task = asyncio.get_running_loop().create_task(self._record_marks_loop())

    async def _record_marks_loop(self) -> None:
        while True:
            await asyncio.sleep(MARKS_INTERVAL_S)
            if self._marks:
                try:
                    await self._run(self._record_marks)
                except Exception as exc:  # recorded next time; appends go on meanwhile
                    log.warning("recording high watermarks failed (%s); trying again", exc)

    async def table(
        self, tenant: str, namespace: str, name: str, *, fresh: bool = False
    ) -> TableView:
        """The table's definition and schema, cached for a moment (no live offsets);
        ``fresh`` reads the metadata store again.

        Raises:
            TableNotFound: no such table in this tenant.
        """
        key = (tenant, namespace, name)
        now = time.monotonic()
        hit = self._tables.get(key)
        if not fresh and hit is not None and hit[0] > now:
            return hit[1]

        def load() -> TableView:  # the schema is parsed off the event loop as well
            definition = self.meta.get_table(tenant, namespace, name)
            return TableView(definition, parse_fields(definition.fields, stored=True))

        view = await self._run(load)
        self._tables[key] = (now + _TABLE_CACHE_TTL_S, view)
        return view

    async def _unless_dropped(self, table: TableView, exc: Exception) -> Exception:
        """What to raise for ``exc``, which a read or scan of ``table`` met: the table's
        ``TableNotFound`` when it was dropped while the call ran (its Iceberg table, files
        and hot logs are going, and any of them may fail first), else ``exc`` itself.
        Bad input is never a drop; anything else asks the metadata store once."""
        if isinstance(exc, InvalidRequest):
            return exc
        d = table.definition
        key = (d.tenant, d.namespace, d.name)

        def same() -> bool:
            try:
                return self.meta.get_table(*key).table_id == d.table_id
            except TableNotFound:
                return False

        try:
            if await self._run(same):
                return exc
        except Exception:  # the metadata store cannot say: the error as it was
            return exc
        self._tables.pop(key, None)
        return TableNotFound(
            f"table {d.namespace}.{d.name} was dropped while this call read it",
            namespace=d.namespace,
            table=d.name,
        )

    def _part(self, table: TableView, partition: int) -> PartitionId:
        d = table.definition
        if (
            isinstance(partition, bool)
            or not isinstance(partition, int)
            or not (0 <= partition < d.partitions)
        ):
            raise InvalidPartition(
                f"partition {partition!r} does not exist in {d.namespace}.{d.name}, "
                f"which has partitions 0..{d.partitions - 1}",
                partitions=d.partitions,
            )
        return PartitionId(d.tenant, d.table_id, partition)

    def _partitions(self, table: TableView, partitions: Sequence[int] | None) -> list[int]:
        if not partitions:
            return list(range(table.definition.partitions))
        for p in partitions:
            self._part(table, p)
        return sorted(set(partitions))

    def _cold_table(self, table: TableView) -> ColdTable:
        """The table's cold handle, kept per table id (handles cache table metadata)."""
        assert self.cold is not None
        return _handle(self._cold_tables, table, self.cold.table)

    def _state_table(self, table: TableView) -> StateTable:
        """A primary-key table's state table handle, kept as :meth:`_cold_table`'s."""
        assert self.cold is not None
        return _handle(self._state_tables, table, self.cold.state_table)

    def _state_lookup(
        self, table: TableView
    ) -> Callable[[PartitionId, pa.Table, int], pa.Table] | None:
        """The live rows a key table's state table holds for keys its hot tier does not
        (``(partition, keys, low)`` -> rows in the state table's stored schema), for the
        resolution of writes and ``get``; None without a cold tier (nothing is trimmed).

        ``low`` is the partition's hot low mark read after the hot index was asked: every
        key the index did not answer changed last below it, and the hot tier is trimmed
        below ``A(p)`` only, so a state snapshot with ``A(p) >= low`` holds its row. The
        snapshot last used is reused while it does, for ``cold.snapshot_cache_ms`` at
        most (a compaction may replace its files, which expiry deletes later); else the
        current one is read.

        A hot tier that lost changes already in the changelog but not yet applied to the
        state table (a Redis emptied, or a sealed segment's shard, between tiering's two
        commits) starts above the current ``A(p)``: the rows of ``[A(p), low)`` are
        nowhere to look up until tiering applies them, so the lookup is refused
        (``Unavailable``, retried by clients) rather than answered from an older state
        (:meth:`_check_applied`; changes recorded lost are answered from the state table).

        Raises:
            Unavailable: the state table has not applied the changes below ``low`` yet.
        """
        if self.cold is None:
            return None
        state = self._state_table(table)
        table_id = table.definition.table_id

        ttl = self.settings.cold.snapshot_cache_ms / 1000

        def rows(part: PartitionId, keys: pa.Table, low: int) -> pa.Table:
            now = time.monotonic()
            at, snap = self._state_snaps.get(table_id, (0.0, None))
            if snap is None or now - at > ttl or snap.applied_through(part.partition) < low:
                snap = state.snapshot()
                if len(self._state_snaps) > 4096:
                    self._state_snaps.clear()
                self._state_snaps[table_id] = (now, snap)
            applied = snap.applied_through(part.partition)
            if applied < low or low <= 0:
                self._check_applied(table, part.partition, applied, low)
            return state.lookup(snap, part.partition, keys)

        return rows

    def _check_applied(self, table: TableView, partition: int, applied: int, low: int) -> None:
        """Refuse a state lookup when changes below the hot tier's ``low`` (0: the hot
        tier holds nothing, so below ``T(p)``) are in the changelog and not yet in the
        state table (``applied``). Changes recorded lost are in neither, and never will
        be: the state table's row is then the answer.

        Raises:
            Unavailable: tiering has yet to apply them.
        """
        try:
            tiered = self._read_snapshot(table, self._cold_table(table), fresh=True)
        except SnapshotNotFound:
            return  # no Iceberg table yet: nothing was tiered
        top = tiered.watermark(partition)
        if low > 0:
            top = min(top, low)
        if applied >= top or tiered.lost_through(partition, applied, top):
            return
        d = table.definition
        raise Unavailable(
            f"partition {partition} of {d.namespace}.{d.name}: the hot tier lost its "
            f"changes below offset {top} before the state table applied those from offset "
            f"{applied}; keys are looked up again once tiering applied them (retry)",
            retry_after_ms=1000,
        )

    def _read_snapshot(
        self, table: TableView, cold: ColdTable, *, fresh: bool = False
    ) -> ColdSnapshot:
        """The current snapshot for a stream read, reused for ``cold.snapshot_cache_ms``
        unless ``fresh``.

        An older snapshot is still a consistent view: its ``T(p)`` is lower, and the hot
        tier keeps records below the newest ``T(p)`` for ``hot_retention``, so the read
        finds them there. A caller that finds the hot tier trimmed above the reused
        snapshot's ``T(p)`` (a retention shorter than the reuse) asks again with
        ``fresh``."""
        ttl = self.settings.cold.snapshot_cache_ms / 1000
        key = table.definition.table_id
        now = time.monotonic()
        hit = self._snapshots.get(key)
        if not fresh and hit is not None and hit[0] > now:
            return hit[1]
        snap = cold.snapshot()
        if ttl > 0:
            if len(self._snapshots) > 4096:
                self._snapshots.clear()
            self._snapshots[key] = (now + ttl, snap)
        return snap


H = TypeVar("H")


def _handle(cache: dict[str, tuple[int, H]], table: TableView, make: Callable[[TableDef], H]) -> H:
    """The handle of ``table`` in ``cache``, made by ``make`` when missing or of an older
    schema version (a handle reads in the schema it was built with)."""
    d = table.definition
    hit = cache.get(d.table_id)
    if hit is not None and hit[0] == d.schema_version:
        return hit[1]
    if len(cache) > 4096:
        cache.clear()
    handle = make(d)
    cache[d.table_id] = (d.schema_version, handle)
    return handle
