"""Client-side scans: the SDK reads the lake itself, as the JVM Spark connector does.

A scan asks the gateway for a read plan (``PlanRead``: one pinned Iceberg snapshot's data
files, pruned by the filter, plus per partition the hot range ``[T_S(p), HW(p))`` above
it), reads the plan's Parquet files directly with ``pyarrow.dataset`` (column projection,
row groups pruned by the filter's statistics, pre-buffered column chunks, files read in
parallel by Arrow's threads) and fetches only the hot ranges from the gateway (over its
Flight edge when it has one, else gRPC) while the files are read. Both parts get the
filter and projection the gateway's own scan applies (:mod:`gateway.wire.filters`, bound
to the plan's schema), rows below a partition's earliest offset (retention) are left out
as the gateway does, and the plan's pin gives the same view as a server-side scan: every
record below the high watermarks exactly once, whatever tiering commits meanwhile (the
plan's snapshot is leased for ``cold.presign_expiry_s``, and the hot tier keeps tiered
records for ``tiering.hot_retention_s``).

``mode`` picks where a scan runs: ``"server"`` (the gateway reads and sends every row),
``"client"`` (this module; an error when the files cannot be reached) or ``"auto"`` (this
module when every file can be reached, else the gateway's scan). See docs/client.md.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from gateway.client._lake_files import HttpPool, LakeFile, PlanFiles, locate, probe
from gateway.client._types import TableRef
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import TidegateError, Unavailable, Unimplemented
from gateway.wire.filters import compile_filter, to_arrow
from gateway.wire.scans import check_limit, projection
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN

__all__ = [
    "SCAN_MODES",
    "AsyncLakeHost",
    "LakeScan",
    "ScanMode",
    "SyncLakeHost",
    "check_mode",
    "conform",
    "lake_batches",
    "lake_batches_async",
    "lake_scan",
    "lake_scan_async",
    "no_plans",
]

# The hot ranges' batches come from Arrow Flight's or gRPC's buffers, which Arrow does not
# align; filtering them (Acero) would print a warning per batch to stderr. Acero reads
# this once, at its first use: copy such buffers, silently (a user's setting is kept).
os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "reallocate")

ScanMode = Literal["auto", "client", "server"]
SCAN_MODES: tuple[str, ...] = ("auto", "client", "server")

#: Rows per batch of the files' reader (Arrow's default is 128 Ki).
_BATCH_ROWS = 128 * 1024
#: The Parquet reading: pre-buffered column chunks (coalesced ranges: a few large
#: requests per file over HTTP), row groups pruned by the filter's statistics.
_FORMAT = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True)
)
#: Files read at once by a scan with neither filter nor limit.
_FILE_THREADS = 8
#: What reading a file may fail with when this host cannot reach it.
_UNREACHED = (OSError, pa.ArrowException)


class SyncLakeHost(Protocol):
    """What a client-side scan needs of the sync client."""

    warehouse: str | None

    def plan_read(
        self, table: str | TableRef, *, filter: str = "", as_of: int | str | None = None
    ) -> pb.PlanReadResponse: ...

    def read_range(
        self, table: str | TableRef, *, partition: int, start: int, end: int
    ) -> Iterator[list[pa.RecordBatch]]: ...


class AsyncLakeHost(Protocol):
    """What a client-side scan needs of the asyncio client."""

    warehouse: str | None

    async def plan_read(
        self, table: str | TableRef, *, filter: str = "", as_of: int | str | None = None
    ) -> pb.PlanReadResponse: ...

    def read_range(
        self, table: str | TableRef, *, partition: int, start: int, end: int
    ) -> AsyncIterator[list[pa.RecordBatch]]: ...


def check_mode(mode: str) -> None:
    if mode not in SCAN_MODES:
        raise ValueError(f"mode must be 'auto', 'client' or 'server', not {mode!r}")


def _retained(keep: pc.Expression | None, earliest: dict[int, int]) -> pc.Expression | None:
    """``keep`` and, in each partition with an earliest offset, ``_offset >= earliest``:
    rows retention recorded as gone, still in a file until its next commit."""
    for p, e in sorted(earliest.items()):
        term = (pc.field(PARTITION_COLUMN) != pa.scalar(p, pa.int32())) | (
            pc.field(OFFSET_COLUMN) >= pa.scalar(e, pa.int64())
        )
        keep = term if keep is None else keep & term
    return keep


def conform(rows: pa.Table, out: pa.Schema) -> pa.Table:
    """``rows`` with exactly the types of ``out`` (files store int8 and int16 as int32;
    a hot batch may come in a schema widened since the plan)."""
    if rows.schema.equals(out):
        return rows
    arrays = [
        rows.column(f.name) if rows.schema.field(f.name).type.equals(f.type)
        else rows.column(f.name).cast(f.type)
        for f in out
    ]  # fmt: skip
    return pa.Table.from_arrays(arrays, schema=out)


class _Cut:
    """A scan's limit over the batches it hands out (None: no limit)."""

    def __init__(self, limit: int | None) -> None:
        self.left = limit

    @property
    def done(self) -> bool:
        return self.left == 0

    def __call__(self, *batches: pa.RecordBatch) -> list[pa.RecordBatch]:
        out = []
        for b in batches:
            if self.left is not None:
                b = b.slice(0, self.left)
                self.left -= b.num_rows
            if b.num_rows:
                out.append(b)
        return out


@dataclass(frozen=True)
class LakeScan:
    """One client-side scan: the plan's files as this client reaches them, its hot
    ranges, and the filter and projection both get."""

    table: str
    snapshot_id: int | None
    #: The stored schema when the plan was made (user columns, then system columns).
    stored: pa.Schema
    names: tuple[str, ...]
    files: tuple[LakeFile, ...]
    #: ``(partition, start, end)`` per hot range.
    hot: tuple[tuple[int, int, int], ...]
    keep: pc.Expression | None
    cold_keep: pc.Expression | None
    limit: int | None

    @property
    def output(self) -> pa.Schema:
        return pa.schema([self.stored.field(n) for n in self.names])

    @property
    def hot_records(self) -> int:
        return sum(end - start for _, start, end in self.hot)

    def unreached(self, exc: BaseException | str) -> Unavailable:
        return Unavailable(
            f"this client could not read the data files of {self.table} itself ({exc}); "
            "scan with mode='server' to read them through the gateway",
            files_unreachable=True,
        )

    def _scanner(self, pool: HttpPool) -> ds.Scanner:
        fs = pafs.PyFileSystem(PlanFiles({f.key: f for f in self.files}, pool))
        dataset = ds.dataset(
            [f.key for f in self.files], schema=self.stored, format=_FORMAT, filesystem=fs
        )
        return dataset.scanner(
            columns=list(self.names),
            filter=self.cold_keep,
            batch_size=_BATCH_ROWS,
            use_threads=True,
        )

    def read_cold(self) -> pa.Table:
        """The rows the plan's files keep (at most :attr:`limit`), read by Arrow's
        threads, in the files' order."""
        if not self.files or self.limit == 0:
            return self.output.empty_table()
        pool = HttpPool()
        try:
            if self.cold_keep is None and self.limit is None:
                return self._read_whole(pool)
            scanner = self._scanner(pool)
            rows = scanner.head(self.limit) if self.limit is not None else scanner.to_table()
        finally:
            pool.close()
        return conform(rows, self.output)

    def _read_whole(self, pool: HttpPool) -> pa.Table:
        """Every row of every file (no filter, no limit): each file read whole by
        ``ParquetFile.read``, whose threads decode its columns in parallel (the dataset
        reader decodes one row group at a time: a third slower on a file of one row
        group), the files themselves read in parallel."""
        files = PlanFiles({f.key: f for f in self.files}, pool)
        if len(self.files) == 1:
            return self._read_file(files, self.files[0])
        with ThreadPoolExecutor(min(_FILE_THREADS, len(self.files))) as threads:
            parts = list(threads.map(lambda f: self._read_file(files, f), self.files))
        return pa.concat_tables(parts)

    def _read_file(self, files: PlanFiles, f: LakeFile) -> pa.Table:
        with files.open_input_file(f.key) as source:
            parquet = pq.ParquetFile(source, pre_buffer=True)
            held = set(parquet.schema_arrow.names)
            present = [n for n in self.names if n in held]
            rows = parquet.read(columns=present, use_threads=True)
            count = parquet.metadata.num_rows
        # Columns added after the file was written read as nulls.
        arrays = [
            rows.column(n) if n in held else pa.nulls(count, self.stored.field(n).type)
            for n in self.names
        ]
        return conform(pa.Table.from_arrays(arrays, names=list(self.names)), self.output)

    def cold_batches(self) -> Generator[pa.RecordBatch, None, None]:
        """The rows the plan's files keep, batch by batch (the links' connections are
        closed when the iterator ends or is closed)."""
        if not self.files:
            return
        out = self.output
        pool = HttpPool()
        try:
            for b in self._scanner(pool).to_batches():
                if b.num_rows:
                    yield conform(pa.Table.from_batches([b]), out).to_batches()[0]
        finally:
            pool.close()

    def hot_rows(self, batches: list[pa.RecordBatch]) -> pa.Table | None:
        """The rows of a hot range's chunk the filter keeps, in the scan's columns."""
        kept = [b for b in batches if b.num_rows]
        if not kept:
            return None
        rows = pa.Table.from_batches(kept)
        if self.keep is not None:
            rows = rows.filter(self.keep)
        if not rows.num_rows:
            return None
        return conform(rows.select(list(self.names)), self.output)

    def hot_batches(self, batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        rows = self.hot_rows(batches)
        return rows.to_batches() if rows is not None else []

    def assemble(self, cold: pa.Table, hot: list[pa.Table]) -> pa.Table:
        """Cold rows then hot rows (partition by partition), cut at the limit."""
        out = pa.concat_tables([cold, *hot]) if hot else cold
        if self.limit is not None and out.num_rows > self.limit:
            out = out.slice(0, self.limit)
        return out


def plan_scan(
    response: pb.PlanReadResponse,
    table: str | TableRef,
    columns: Sequence[str],
    filter: str,
    limit: int | None,
    warehouse: str | None,
) -> LakeScan:
    """The scan of a plan: its columns and limit checked as the gateway checks them, its
    filter bound to the plan's schema, each file located (see :func:`locate`).

    Raises:
        InvalidRequest: bad columns or limit (the filter was checked by the plan).
    """
    stored = pa.ipc.open_stream(pa.py_buffer(response.arrow_schema)).schema
    names = projection(stored, columns)
    check_limit(limit)
    expr = compile_filter(filter or None, stored)
    keep = to_arrow(expr, stored) if expr is not None else None
    earliest = {e.partition: e.offset for e in response.earliest_offsets}
    files = tuple(
        locate(f"f{i}", f.url, f.warehouse_path, f.file_size_bytes, f.partition, warehouse)
        for i, f in enumerate(response.files)
    )
    hot = tuple(
        (r.partition, r.from_offset, r.to_offset)
        for r in response.hot_ranges
        if r.to_offset > r.from_offset
    )
    return LakeScan(
        str(TableRef.parse(table)),
        response.snapshot_id or None,
        stored,
        tuple(names),
        files,
        hot,
        keep,
        _retained(keep, earliest),
        limit,
    )


def no_plans(err: TidegateError) -> bool:
    """Whether ``err`` says the gateway predates ``PlanRead`` (it scans, never plans) or
    plans no such table (a primary-key table: its scan answers current state)."""
    return isinstance(err, Unimplemented) or err.details.get("grpc_code") == "UNIMPLEMENTED"


def _reachable(scan: LakeScan, mode: str) -> bool:
    """Whether to read ``scan``'s files here: yes when they can be reached; else no in
    ``auto`` mode (the gateway scans), an error in ``client`` mode."""
    why = probe(scan.files)
    if why is None:
        return True
    if mode == "client":
        raise scan.unreached(why)
    return False


def _planned(host: SyncLakeHost, table: str | TableRef, columns: Sequence[str], filter: str,
             as_of: int | str | None, limit: int | None, mode: str) -> LakeScan | None:  # fmt: skip
    try:
        response = host.plan_read(table, filter=filter, as_of=as_of)
    except TidegateError as err:
        if mode == "auto" and no_plans(err):
            return None
        raise
    scan = plan_scan(response, table, columns, filter, limit, host.warehouse)
    return scan if _reachable(scan, mode) else None


class _HotRows:
    """The hot ranges' kept rows of a scan as their chunks come, up to about ``room``
    (None: all): what both clients' loops over ``read_range`` share."""

    def __init__(self, scan: LakeScan, room: int | None) -> None:
        self.scan, self.room = scan, room
        self.tables: list[pa.Table] = []
        self.got = 0

    def add(self, chunk: list[pa.RecordBatch]) -> bool:
        """Keep ``chunk``'s rows; True once ``room`` is filled."""
        rows = self.scan.hot_rows(chunk)
        if rows is not None:
            self.tables.append(rows)
            self.got += rows.num_rows
        return self.room is not None and self.got >= self.room


def _fallen_back(scan: LakeScan, mode: str, exc: BaseException) -> None:
    """A file could not be read before any row was handed out: in ``auto`` mode the
    caller scans on the gateway (this returns); in ``client`` mode, an error."""
    if mode != "auto":
        raise scan.unreached(exc) from None


def _hot_tables(host: SyncLakeHost, scan: LakeScan, room: int | None) -> list[pa.Table]:
    """The hot ranges' kept rows, read through the gateway; at most about ``room``."""
    hot = _HotRows(scan, room)
    for p, start, end in scan.hot:
        for chunk in host.read_range(scan.table, partition=p, start=start, end=end):
            if hot.add(chunk):
                return hot.tables
    return hot.tables


def lake_scan(
    host: SyncLakeHost,
    table: str | TableRef,
    columns: Sequence[str],
    filter: str,
    as_of: int | str | None,
    limit: int | None,
    mode: str,
) -> pa.Table | None:
    """A client-side scan as one table; None when ``auto`` finds the files out of reach
    (the caller scans on the gateway; nothing was read)."""
    scan = _planned(host, table, columns, filter, as_of, limit, mode)
    if scan is None:
        return None
    if limit is not None or not scan.hot:  # the files first; the hot ranges for what they miss
        try:
            cold = scan.read_cold()
        except _UNREACHED as exc:
            _fallen_back(scan, mode, exc)
            return None
        room = None if limit is None else limit - cold.num_rows
        hot = _hot_tables(host, scan, room) if scan.hot and (room is None or room > 0) else []
        return scan.assemble(cold, hot)
    with ThreadPoolExecutor(1, thread_name_prefix="tidegate-lake") as pool:
        reading = pool.submit(scan.read_cold)  # while the hot ranges come
        hot = _hot_tables(host, scan, None)
        try:
            cold = reading.result()
        except _UNREACHED as exc:
            _fallen_back(scan, mode, exc)
            return None
    return scan.assemble(cold, hot)


def lake_batches(
    host: SyncLakeHost,
    table: str | TableRef,
    columns: Sequence[str],
    filter: str,
    as_of: int | str | None,
    limit: int | None,
    mode: str,
) -> Iterator[pa.RecordBatch] | None:
    """A client-side scan as batches (files, then hot ranges); None when ``auto`` finds
    the files out of reach. Planned and probed now; a file that fails once batches have
    been handed out raises :class:`Unavailable`."""
    scan = _planned(host, table, columns, filter, as_of, limit, mode)
    if scan is None:
        return None

    def batches() -> Iterator[pa.RecordBatch]:
        cut = _Cut(limit)
        cold = scan.cold_batches()
        try:
            while not cut.done and (b := next(cold, None)) is not None:
                yield from cut(b)
        except _UNREACHED as exc:
            raise scan.unreached(exc) from None
        finally:
            cold.close()
        for p, start, end in scan.hot:
            for chunk in host.read_range(scan.table, partition=p, start=start, end=end):
                if cut.done:
                    return
                yield from cut(*scan.hot_batches(chunk))

    return batches()


# asyncio -----------------------------------------------------------------------------
async def _planned_async(host: AsyncLakeHost, table: str | TableRef, columns: Sequence[str],
                         filter: str, as_of: int | str | None, limit: int | None,
                         mode: str) -> LakeScan | None:  # fmt: skip
    try:
        response = await host.plan_read(table, filter=filter, as_of=as_of)
    except TidegateError as err:
        if mode == "auto" and no_plans(err):
            return None
        raise
    # Locating the files (they are looked for on disk) and the probe (it asks the links'
    # hosts) run off the event loop.
    scan = await asyncio.to_thread(
        plan_scan, response, table, columns, filter, limit, host.warehouse
    )
    return scan if await asyncio.to_thread(_reachable, scan, mode) else None


async def _hot_tables_async(
    host: AsyncLakeHost, scan: LakeScan, room: int | None
) -> list[pa.Table]:
    hot = _HotRows(scan, room)
    for p, start, end in scan.hot:
        async for chunk in host.read_range(scan.table, partition=p, start=start, end=end):
            if hot.add(chunk):
                return hot.tables
    return hot.tables


async def lake_scan_async(
    host: AsyncLakeHost,
    table: str | TableRef,
    columns: Sequence[str],
    filter: str,
    as_of: int | str | None,
    limit: int | None,
    mode: str,
) -> pa.Table | None:
    """:func:`lake_scan` for the asyncio client: the files are read on a worker thread
    while the hot ranges come on the event loop."""
    scan = await _planned_async(host, table, columns, filter, as_of, limit, mode)
    if scan is None:
        return None
    reading = asyncio.ensure_future(asyncio.to_thread(scan.read_cold))
    try:
        if limit is not None:
            cold = await reading
            room = limit - cold.num_rows
            hot = await _hot_tables_async(host, scan, room) if room > 0 else []
        else:
            hot = await _hot_tables_async(host, scan, None)
            cold = await reading
    except _UNREACHED as exc:
        _fallen_back(scan, mode, exc)
        return None
    finally:
        if not reading.done():
            reading.cancel()
    return scan.assemble(cold, hot)


async def lake_batches_async(
    host: AsyncLakeHost,
    table: str | TableRef,
    columns: Sequence[str],
    filter: str,
    as_of: int | str | None,
    limit: int | None,
    mode: str,
) -> AsyncIterator[pa.RecordBatch] | None:
    """:func:`lake_batches` for the asyncio client (each file batch is read on a worker
    thread)."""
    scan = await _planned_async(host, table, columns, filter, as_of, limit, mode)
    if scan is None:
        return None

    async def batches() -> AsyncIterator[pa.RecordBatch]:
        cut = _Cut(limit)
        cold = scan.cold_batches()
        try:
            while not cut.done:
                try:
                    b = await asyncio.to_thread(next, cold, None)
                except _UNREACHED as exc:
                    raise scan.unreached(exc) from None
                if b is None:
                    break
                for piece in cut(b):
                    yield piece
        finally:
            cold.close()
        for p, start, end in scan.hot:
            async for chunk in host.read_range(scan.table, partition=p, start=start, end=end):
                if cut.done:
                    return
                for piece in cut(*scan.hot_batches(chunk)):
                    yield piece

    return batches()
