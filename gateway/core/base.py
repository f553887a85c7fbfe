"""What every part of the core shares: the backends, the I/O pool, and the caches of table
definitions, cold table handles and snapshots."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from gateway.config import Settings
from gateway.core.budget import ReadBudget
from gateway.core.views import TableView
from gateway.hot import HotLog, PartitionId
from gateway.meta import TABLE_VIEW_TTL_S, MetadataStore
from gateway.wire.errors import InvalidPartition
from gateway.wire.filters import FilterLimits
from gateway.wire.schema import parse_fields

if TYPE_CHECKING:
    from gateway.cold import ColdSnapshot, ColdStore, ColdTable

__all__ = ["CoreBase"]

P = ParamSpec("P")
R = TypeVar("R")

_TABLE_CACHE_TTL_S = TABLE_VIEW_TTL_S


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


class SchemaMemo:
    """A bounded set of ``(check, table id, schema version, schema message)``: the schema
    messages that passed ``check`` for that version. It forgets everything once full
    (dropped tables and clients sending ever-new schema bytes cannot grow it); forgetting
    only costs a check again."""

    def __init__(self, limit: int = 4096) -> None:
        self._seen: set[tuple[str, str, int, bytes]] = set()
        self._limit = limit

    def __contains__(self, key: tuple[str, str, int, bytes]) -> bool:
        return key in self._seen

    def add(self, key: tuple[str, str, int, bytes]) -> None:
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen.add(key)


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
        self._snapshots: dict[str, tuple[float, ColdSnapshot]] = {}
        self._pool = ThreadPoolExecutor(settings.server.io_threads, thread_name_prefix="tg-io")
        self._tables: dict[tuple[str, str, str], tuple[float, TableView]] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}
        #: Arrow schema messages already checked against a table's schema version, so a
        #: schema seen before is recognised by its bytes: appended streams found to be
        #: exactly it (``AppendOps._as_is``), hot payloads found to read under it
        #: (``ReadOps._check_stored_schema``).
        self._schemas_checked = SchemaMemo()
        self._notifier = _Notifier()
        #: Read data held at once, for the process and per tenant.
        self.budget = ReadBudget(
            settings.server.read_memory_bytes,
            settings.server.tenant_read_memory_bytes,
        )
        s = settings.server
        self._filter_limits = FilterLimits(
            s.max_filter_chars, s.max_filter_terms, s.max_filter_depth
        )

    async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def offload(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run CPU-heavy work of an edge (encoding a response) on the I/O pool, so that
        the event loop keeps serving other requests meanwhile."""
        return await self._run(fn, *args, **kwargs)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.hot.close()
        if self.cold is not None:
            self.cold.close()
        self.meta.close()

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
        definition = await self._run(self.meta.get_table, tenant, namespace, name)
        view = TableView(definition, parse_fields(definition.fields, stored=True))
        self._tables[key] = (now + _TABLE_CACHE_TTL_S, view)
        return view

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
        d = table.definition
        hit = self._cold_tables.get(d.table_id)
        if hit is not None and hit[0] == d.schema_version:
            return hit[1]
        # A handle reads in the schema it was built with: a new one per schema version.
        if len(self._cold_tables) > 4096:
            self._cold_tables.clear()
        handle = self.cold.table(d)
        self._cold_tables[d.table_id] = (d.schema_version, handle)
        return handle

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
