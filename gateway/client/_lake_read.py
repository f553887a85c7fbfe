"""Client-side stream reads: offsets below the tiered watermark read from the lake's files
by the SDK itself, the rest through the gateway, stitched into one read.

A read of partition ``p`` from ``offset`` below ``T(p)`` asks the gateway for a read plan
of the partition (``PlanRead`` with ``_partition = p``, the route client-side scans use),
keeps it as a :class:`ColdView` (its files by offset range, the offset ``end`` below which
they hold every record, retention's earliest offset) and reads the records
``[offset, min(end, offset + max_records))`` from the files itself: only the files and row
groups whose ``_offset`` statistics overlap them, a file's footer read once per view (reads
on several threads at once each open their own reader over it). What
the limits leave (``[end, ...)``: the hot tail, or records tiered since the plan) comes
from the gateway's stitched read, as one answer. A view serves later reads of its range
without asking the gateway again, for :data:`VIEW_TTL_S` at most (its files are leased
for the plan's lifetime, ``cold.presign_expiry_s``, which is longer); a read at or above
``end`` goes to the gateway directly (no plan: a consumer at the head plans once), and
learns from the gateway's answer (records it served from the cold tier) when ``T(p)`` has
moved past the view, so that the next read below it plans again.

The records are those of the gateway's read: the same offsets in order (no gap, no
duplicate, whatever tiering commits meanwhile: records below ``end`` never change, and the
gateway's read stitches the rest) and the same columns and types (files keep int8/int16
as int32; columns added after a file was written read as nulls). Where the files do not
hold the range densely (offsets lost with a hot tier's state, recorded in the snapshot)
or the offset is below retention's earliest, the read is the gateway's, which knows
those rules. ``mode`` is scan's (:mod:`._lake_scan`): ``"auto"`` reads through the
gateway where the files cannot be reached, ``"client"`` refuses, ``"server"`` never
plans. See docs/client.md and docs/decisions/client.md.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gateway.client._lake_files import HttpPool, LakeFile, PlanFiles, locate, probe
from gateway.client._lake_scan import check_mode, conform, no_plans
from gateway.client._reading import TIER_COLUMN
from gateway.client._types import TableRef
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import TidegateError, Unavailable
from gateway.wire.schema import OFFSET_COLUMN

__all__ = [
    "DEFAULT_READ_RECORDS",
    "VIEW_TTL_S",
    "AsyncReadHost",
    "ColdView",
    "ColdViews",
    "SyncReadHost",
    "lake_read",
    "lake_read_async",
]

#: Records a read takes when ``max_records`` is 0: the gateway's default
#: (``server.default_read_records``), so that either side answers the same records.
DEFAULT_READ_RECORDS = 10_000
#: Seconds a plan's view of a partition's files serves reads (a link's lifetime bounds it).
VIEW_TTL_S = 30.0
#: What reading a file may fail with when this host cannot reach it.
_UNREACHED = (OSError, pa.ArrowException)

Batches = list[pa.RecordBatch]


class SyncReadHost(Protocol):
    """What a client-side read needs of the sync client."""

    warehouse: str | None
    lake_views: ColdViews

    def plan_read(
        self, table: str | TableRef, *, filter: str = "", as_of: int | str | None = None
    ) -> pb.PlanReadResponse: ...

    def read_batches(
        self,
        table: str | TableRef,
        *,
        partition: int,
        offset: int,
        max_records: int = 0,
        max_bytes: int = 0,
        with_tier: bool = False,
    ) -> Iterator[tuple[Batches, int, int]]: ...


class AsyncReadHost(Protocol):
    """What a client-side read needs of the asyncio client."""

    warehouse: str | None
    lake_views: ColdViews

    async def plan_read(
        self, table: str | TableRef, *, filter: str = "", as_of: int | str | None = None
    ) -> pb.PlanReadResponse: ...

    def read_batches(
        self,
        table: str | TableRef,
        *,
        partition: int,
        offset: int,
        max_records: int = 0,
        max_bytes: int = 0,
        with_tier: bool = False,
    ) -> AsyncIterator[tuple[Batches, int, int]]: ...


@dataclass
class ColdView:
    """One partition's data files as one plan gave them, read by offset range."""

    table: str
    partition: int
    stored: pa.Schema
    #: The partition's files, by their first offset, with ``(min, max)`` offsets each.
    files: list[tuple[int, int, LakeFile]]
    #: Offsets below it are in ``files`` (0: none are).
    end: int
    #: Retention's earliest offset (0: none).
    earliest: int
    #: Why this client cannot read the files (None: it can).
    unreached: str | None
    expires: float
    pool: HttpPool = field(default_factory=HttpPool)
    _footers: dict[str, pq.FileMetaData] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        self.pool.close()

    def refusal(self, why: object) -> Unavailable:
        return Unavailable(
            f"this client could not read the data files of {self.table} itself ({why}); "
            "read with mode='server' to read them through the gateway",
            files_unreachable=True,
        )

    def read(self, lo: int, hi: int, max_bytes: int) -> pa.Table | None:
        """Records ``[lo, hi)`` from the files (at most about ``max_bytes`` of Arrow data
        when given, at least one record), in the stored schema; None when the files do
        not hold them densely (the gateway reads those).

        Raises:
            OSError, pyarrow.ArrowException: a file could not be read.
        """
        parts: list[pa.Table] = []
        for first, last, f in self.files:
            if last >= lo and first < hi:
                parts.extend(self._rows(f, lo, hi))
        rows = pa.concat_tables(parts) if parts else self.stored.empty_table()
        offsets = rows.column(OFFSET_COLUMN).combine_chunks()
        n = rows.num_rows
        if n != hi - lo or (n and (offsets[0].as_py() != lo or offsets[-1].as_py() != hi - 1)):
            return None
        if n > 1 and not pc.all(pc.equal(pc.pairwise_diff(offsets), 1)).as_py():
            return None
        if max_bytes and rows.nbytes > max_bytes:
            rows = rows.slice(0, max(1, max_bytes * n // rows.nbytes))
        return rows

    def _file(self, f: LakeFile) -> tuple[pa.NativeFile, pq.ParquetFile]:
        """The file opened for one read; its footer is read once per view and kept, so
        that reads on several threads at once each have their own reader and no footer
        to fetch again."""
        source = PlanFiles({f.key: f}, self.pool).open_input_file(f.key)
        with self._lock:
            meta = self._footers.get(f.key)
        parquet = pq.ParquetFile(source, metadata=meta)
        if meta is None:
            with self._lock:
                self._footers[f.key] = parquet.metadata
        return source, parquet

    def _stored(self, rows: pa.Table, held: set[str]) -> pa.Table:
        """``rows`` in the stored schema (columns a file lacks as nulls)."""
        arrays = [
            rows.column(n) if n in held else pa.nulls(rows.num_rows, self.stored.field(n).type)
            for n in self.stored.names
        ]
        return conform(pa.Table.from_arrays(arrays, names=self.stored.names), self.stored)

    def _rows(self, f: LakeFile, lo: int, hi: int) -> Iterator[pa.Table]:
        """The file's records ``[lo, hi)``, row group by row group (those whose offset
        statistics miss the range are not read), in the stored schema."""
        source, parquet = self._file(f)
        try:
            held = set(parquet.schema_arrow.names)
            present = [n for n in self.stored.names if n in held]
            meta = parquet.metadata
            # The leaf column's index (nested columns have several leaves each).
            index = next(
                j for j in range(meta.num_columns) if meta.schema.column(j).path == OFFSET_COLUMN
            )
            for rg in range(meta.num_row_groups):
                group = meta.row_group(rg)
                stats = group.column(index).statistics
                known = stats is not None and stats.has_min_max
                if known and (stats.max < lo or stats.min >= hi):
                    continue
                rows = parquet.read_row_group(rg, columns=present)
                if known and stats.max - stats.min + 1 == group.num_rows:  # dense: slice
                    start = max(0, lo - stats.min)
                    rows = rows.slice(start, max(0, min(hi, stats.max + 1) - stats.min - start))
                else:
                    column = rows.column(OFFSET_COLUMN)
                    rows = rows.filter(pc.and_(pc.greater_equal(column, lo), pc.less(column, hi)))
                yield self._stored(rows, held)
        finally:
            source.close()


def view_of(
    response: pb.PlanReadResponse, table: str, partition: int, warehouse: str | None
) -> ColdView:
    """The view of one partition in a plan (its files located, then probed: see
    :func:`gateway.client._lake_files.probe`)."""
    stored = pa.ipc.open_stream(pa.py_buffer(response.arrow_schema)).schema
    files = sorted(
        (
            (f.min_offset, f.max_offset, locate(f"f{i}", f.url, f.warehouse_path,
                                               f.file_size_bytes, f.partition, warehouse))
            for i, f in enumerate(response.files)
            if f.partition == partition
        ),
        key=lambda t: t[0],
    )  # fmt: skip
    end = max((last + 1 for _, last, _ in files), default=0)
    earliest = next((e.offset for e in response.earliest_offsets if e.partition == partition), 0)
    expiry = [f.expires_at_ms / 1000 for f in response.files if f.expires_at_ms]
    ttl = min([VIEW_TTL_S, *((e - time.time()) / 2 for e in expiry)])
    return ColdView(
        table, partition, stored, files, end, earliest,
        probe(f for _, _, f in files), time.monotonic() + ttl,
    )  # fmt: skip


class ColdViews:
    """A client's views of partitions' files, and what it knows of their ``T(p)``."""

    def __init__(self) -> None:
        self._views: dict[tuple[str, int], ColdView] = {}
        #: A lower bound of ``T(p)``: records below it were tiered when last seen.
        self._tiered: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def find(self, key: tuple[str, int], offset: int) -> ColdView | bool:
        """The view whose files hold ``offset``; else True when a plan is needed (no
        view, or ``T(p)`` is known past ``offset``) or False (the gateway's read)."""
        with self._lock:
            view = self._views.get(key)
            if view is not None and view.expires <= time.monotonic():
                del self._views[key]
                view.close()
                view = None
            if view is not None and offset < view.end:
                return view
            tiered = self._tiered.get(key)
        return tiered is None or offset < tiered

    def keep(self, key: tuple[str, int], view: ColdView) -> None:
        with self._lock:
            old = self._views.get(key)
            self._views[key] = view
            self._tiered[key] = max(self._tiered.get(key, 0), view.end)
        if old is not None:
            old.close()

    def learn(self, key: tuple[str, int], tiered: int) -> None:
        """The gateway served records below ``tiered`` from its cold tier."""
        with self._lock:
            self._tiered[key] = max(self._tiered.get(key, 0), tiered)

    def drop(self, key: tuple[str, int]) -> None:
        with self._lock:
            view = self._views.pop(key, None)
        if view is not None:
            view.close()

    def close(self) -> None:
        with self._lock:
            views, self._views = list(self._views.values()), {}
        for view in views:
            view.close()


def _stripped(key: tuple[str, int], views: ColdViews, batches: Batches) -> Batches:
    """The gateway's batches without their tier labels, learning from them how far
    ``T(p)`` has come."""
    out = []
    for b in batches:
        tier = b.column(TIER_COLUMN)
        cold = pc.equal(tier, "iceberg")
        if pc.any(cold).as_py():
            offsets = pc.filter(b.column(OFFSET_COLUMN), cold)
            views.learn(key, pc.max(offsets).as_py() + 1)
        out.append(b.drop_columns([TIER_COLUMN]))
    return out


def _stitched(cold: pa.Table, hot: Batches) -> Batches:
    """Cold records then the gateway's, in the gateway's schema when it has changed."""
    rows = cold.to_batches()
    if hot and not hot[0].schema.equals(cold.schema):
        have = set(cold.schema.names)
        arrays = [
            cold.column(f.name).cast(f.type) if f.name in have else pa.nulls(cold.num_rows, f.type)
            for f in hot[0].schema
        ]
        rows = pa.Table.from_arrays(arrays, schema=hot[0].schema).to_batches()
    return [b for b in rows if b.num_rows] + hot


@dataclass(frozen=True)
class _Step:
    """What a read does next: read the gateway alone (``view`` None), or the files of
    ``view`` for ``[lo, hi)`` then the gateway for the rest."""

    key: tuple[str, int]
    #: Ask the gateway which tier served each record (to learn ``T(p)``): not in
    #: ``"server"`` mode, which plans nothing.
    learn: bool = True
    view: ColdView | None = None
    lo: int = 0
    hi: int = 0
    limit: int = 0


def _step(view: ColdView | None, key: tuple[str, int], offset: int, max_records: int,
          mode: str) -> _Step:  # fmt: skip
    limit = max_records or DEFAULT_READ_RECORDS
    if view is None or not view.earliest <= offset < view.end or limit <= 0:
        return _Step(key)  # below retention's earliest, or above the files: the gateway's
    if view.unreached is not None:
        if mode == "client":
            raise view.refusal(view.unreached)
        return _Step(key)
    return _Step(key, True, view, offset, min(view.end, offset + limit), limit)


def _replan(found: ColdView | bool, offset: int, max_records: int) -> bool:
    """Whether a read asks for a new plan: there is no view of the partition, ``T(p)`` is
    known past ``offset``, or the read goes past the view's files (``T(p)`` may have
    moved since the view was planned: planning again keeps every record below it off the
    gateway's data plane, for the price of one call more on reads that cross it)."""
    if isinstance(found, ColdView):
        return not found.unreached and offset + (max_records or DEFAULT_READ_RECORDS) > found.end
    return found


def _rest(step: _Step, cold: pa.Table, max_bytes: int) -> tuple[int, int, int] | None:
    """``(offset, records, bytes)`` the gateway reads after ``cold``; None: nothing."""
    got = cold.num_rows
    room = step.limit - got
    if room <= 0 or step.lo + got < step.hi or (max_bytes and cold.nbytes >= max_bytes):
        return None  # the limits are reached (a byte cap cut the cold part short)
    return step.lo + got, room, (max_bytes - cold.nbytes) if max_bytes else 0


def _server(host: SyncReadHost, step: _Step, table: str | TableRef, partition: int,
            offset: int, max_records: int, max_bytes: int) -> tuple[Batches, int]:  # fmt: skip
    out: Batches = []
    nxt = offset
    for chunk, next_offset, _ in host.read_batches(
        table, partition=partition, offset=offset, max_records=max_records,
        max_bytes=max_bytes, with_tier=step.learn,
    ):  # fmt: skip
        if step.learn:
            chunk = _stripped(step.key, host.lake_views, chunk)
        out.extend(b for b in chunk if b.num_rows)
        nxt = max(nxt, next_offset)
    return out, nxt


def lake_read(
    host: SyncReadHost,
    table: str | TableRef,
    partition: int,
    offset: int,
    max_records: int,
    max_bytes: int,
    mode: str,
) -> tuple[Batches, int]:
    """A stream read, its records below ``T(p)`` read from the files by this client;
    ``(non-empty batches, next offset)``."""
    check_mode(mode)
    key = (str(TableRef.parse(table)), partition)
    if mode == "server":
        return _server(host, _Step(key, False), table, partition, offset, max_records, max_bytes)
    found = host.lake_views.find(key, offset)
    if _replan(found, offset, max_records):
        response = _plan(host, table, partition, mode)
        found = False
        if response is not None:
            found = view_of(response, key[0], partition, host.warehouse)
            host.lake_views.keep(key, found)
    step = _step(found if isinstance(found, ColdView) else None, key, offset, max_records, mode)
    if step.view is None:
        return _server(host, step, table, partition, offset, max_records, max_bytes)
    try:
        cold = step.view.read(step.lo, step.hi, max_bytes)
    except _UNREACHED as exc:
        host.lake_views.drop(key)
        if mode == "client":
            raise step.view.refusal(exc) from None
        cold = None
    if cold is None:
        return _server(host, _Step(key), table, partition, offset, max_records, max_bytes)
    rest = _rest(step, cold, max_bytes)
    hot, nxt = _server(host, step, table, partition, *rest) if rest else ([], step.lo)
    return _stitched(cold, hot), max(nxt, step.lo + cold.num_rows)


def _plan(
    host: SyncReadHost, table: str | TableRef, partition: int, mode: str
) -> pb.PlanReadResponse | None:
    try:
        return host.plan_read(table, filter=f"_partition = {partition}")
    except TidegateError as err:
        if mode == "auto" and no_plans(err):
            return None  # a gateway older than PlanRead: it reads
        raise


# asyncio -----------------------------------------------------------------------------
async def _server_async(host: AsyncReadHost, step: _Step, table: str | TableRef, partition: int,
                        offset: int, max_records: int,
                        max_bytes: int) -> tuple[Batches, int]:  # fmt: skip
    out: Batches = []
    nxt = offset
    async for chunk, next_offset, _ in host.read_batches(
        table, partition=partition, offset=offset, max_records=max_records,
        max_bytes=max_bytes, with_tier=step.learn,
    ):  # fmt: skip
        if step.learn:
            chunk = _stripped(step.key, host.lake_views, chunk)
        out.extend(b for b in chunk if b.num_rows)
        nxt = max(nxt, next_offset)
    return out, nxt


async def lake_read_async(
    host: AsyncReadHost,
    table: str | TableRef,
    partition: int,
    offset: int,
    max_records: int,
    max_bytes: int,
    mode: str,
) -> tuple[Batches, int]:
    """:func:`lake_read` for the asyncio client: the files are located, probed and read
    on a worker thread."""
    check_mode(mode)
    key = (str(TableRef.parse(table)), partition)
    args = (table, partition, offset, max_records, max_bytes)
    if mode == "server":
        return await _server_async(host, _Step(key, False), *args)
    found = host.lake_views.find(key, offset)
    if _replan(found, offset, max_records):
        found = False
        try:
            response = await host.plan_read(table, filter=f"_partition = {partition}")
        except TidegateError as err:
            if not (mode == "auto" and no_plans(err)):
                raise
        else:
            found = await asyncio.to_thread(view_of, response, key[0], partition, host.warehouse)
            host.lake_views.keep(key, found)
    step = _step(found if isinstance(found, ColdView) else None, key, offset, max_records, mode)
    if step.view is None:
        return await _server_async(host, step, *args)
    try:
        cold = await asyncio.to_thread(step.view.read, step.lo, step.hi, max_bytes)
    except _UNREACHED as exc:
        host.lake_views.drop(key)
        if mode == "client":
            raise step.view.refusal(exc) from None
        cold = None
    if cold is None:
        return await _server_async(host, _Step(key), *args)
    rest = _rest(step, cold, max_bytes)
    hot, nxt = await _server_async(host, step, table, partition, *rest) if rest else ([], step.lo)
    return _stitched(cold, hot), max(nxt, step.lo + cold.num_rows)
