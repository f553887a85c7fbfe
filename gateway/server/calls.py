"""The data plane as both edges serve it: each operation of the core with the work every
request needs done once, here, for gRPC and HTTP alike.

That work is: the tenant's quota charged before (table counts, append bytes, the read
bucket), usage metered and Prometheus metrics counted after, the read-memory budget held
for reads, follows and scans alike, Arrow append bodies measured, decoded and validated
(:meth:`DataCalls.append_arrow`), and encoding of large answers kept off the event loop.
An edge only turns its wire format into these calls and their answers back into its wire
format. Errors are turned into wire errors in one place too, :func:`wire_error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from gateway import metrics
from gateway.core import ClientStream, ReadPlan, ReadResult, ScanResult, StreamTables, TableView
from gateway.core.budget import READ_COPIES, ReadBudget
from gateway.tenancy import Gate, Tenancy
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.codec import check_request, decode_valid
from gateway.wire.errors import (
    RequestTooLarge,
    ResourceUnavailable,
    TidegateError,
    Unauthenticated,
)
from gateway.wire.types import AppendRange

__all__ = [
    "OFFLOAD_BYTES",
    "OFFLOAD_RECORDS",
    "RESOURCE_ERRNOS",
    "AppendBody",
    "DataCalls",
    "append_response",
    "resource_error",
    "wire_error",
]

log = logging.getLogger("tidegate.server")

T = TypeVar("T")


#: Answers of at least this many records are encoded on the I/O pool.
OFFLOAD_RECORDS = 2_000
#: What a unary read reserves before it knows its answer's size.
_READ_START = 64 * 1024
#: Longest a scan waits for room in the read budget before it is refused.
_SCAN_WAIT_S = 60.0
#: Longest a follow stream waits for room in the read budget before it is refused.
_FOLLOW_WAIT_S = 60.0
#: Bodies of at least this many bytes (on the wire or decompressed) are read on the I/O pool.
OFFLOAD_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class AppendBody:
    """A decoded append request: its rows and where they go (and the Arrow IPC stream
    they were decoded from, which the core may store as it came)."""

    batches: Sequence[pa.RecordBatch]
    partition: int | None = None
    producer_id: str | None = None
    sequence: int | None = None
    stream: ClientStream | None = None


def append_response(ranges: Sequence[AppendRange]) -> pb.AppendResponse:
    """The ranges an append stored, as the gRPC and Flight edges answer them."""
    return pb.AppendResponse(
        ranges=[
            pb.AppendRange(
                partition=r.partition,
                base_offset=r.base_offset,
                count=r.count,
                duplicate=r.duplicate,
            )
            for r in ranges
        ]
    )


class _FollowHold:
    """A follow stream's share of the read budget: each answer is read and held until the
    stream takes the next one, and the one before it while the stream keeps answering
    (the transport may still hold it), so a slow stream holds at most two answers and
    many streams wait rather than grow the gateway; nothing is held while the stream
    waits for records or once it ends."""

    def __init__(self, budget: ReadBudget, tenant: str) -> None:
        self.budget = budget
        self.tenant = tenant
        self.held: list[int] = []

    async def reading(self, nbytes: int) -> None:
        size = READ_COPIES * nbytes
        # Streams wait for room (back-pressure) rather than fail.
        await self.budget.reserve(self.tenant, size, wait_s=_FOLLOW_WAIT_S)
        self.held.append(size)
        if len(self.held) > 2:
            self.budget.release(self.tenant, self.held.pop(0))

    def idle(self) -> None:
        while self.held:
            self.budget.release(self.tenant, self.held.pop())


#: ``errno`` values of a resource the process or the machine ran out of: descriptors,
#: disk space, memory. Retrying later may succeed, so they are never an INTERNAL error.
RESOURCE_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.ENOBUFS}
)

#: Seconds a client is told to wait before retrying after a resource error.
RESOURCE_RETRY_AFTER_MS = 1000


def resource_error(exc: BaseException) -> OSError | MemoryError | None:
    """The resource exhaustion behind ``exc`` (itself, or what it was raised from or
    while handling: pyiceberg, pyarrow and SQLAlchemy wrap the ``OSError``), or None."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, MemoryError):
            return at
        if isinstance(at, OSError) and at.errno in RESOURCE_ERRNOS:
            return at
        at = at.__cause__ or at.__context__
    return None


def wire_error(exc: BaseException, where: str = "a call") -> TidegateError:
    """The error to send for ``exc``: a :class:`TidegateError` as it is; a resource the
    gateway ran out of (descriptors, disk space, memory: :func:`resource_error`) as a
    retryable :class:`~gateway.wire.errors.ResourceUnavailable`; anything else is logged
    with its traceback and answered as a bare INTERNAL error, whose message names nothing
    of the gateway's internals."""
    if isinstance(exc, TidegateError):
        return exc
    short = resource_error(exc)
    if short is not None:
        what = "memory" if isinstance(short, MemoryError) else os.strerror(short.errno or 0).lower()
        log.warning("%s failed for want of a resource: %s", where, what)
        return ResourceUnavailable(
            f"the gateway is short of a resource ({what}); retry later",
            retry_after_ms=RESOURCE_RETRY_AFTER_MS,
        )
    log.error("unexpected error in %s", where, exc_info=exc)
    return TidegateError("internal error; see the gateway log")


class DataCalls:
    """The metered data-plane operations of one gateway process."""

    def __init__(self, service: StreamTables, gate: Gate) -> None:
        self.service = service
        self.gate = gate

    async def offload(self, big: bool, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the I/O pool when ``big``, else here."""
        if big:
            return await self.service.offload(fn, *args)
        return fn(*args)

    # Tables ----------------------------------------------------------------------------
    async def create_table(
        self,
        tenant: str,
        namespace: str,
        name: str,
        fields: Any,
        partitions: int,
        key_columns: Sequence[str] = (),
        *,
        retention_ms: int | None = None,
        retention_records: int | None = None,
    ) -> TableView:
        return await self.service.create_table(
            tenant,
            namespace,
            name,
            fields,
            partitions,
            key_columns,
            retention_ms=retention_ms,
            retention_records=retention_records,
            limits=await self.gate.table_limits(tenant),
        )

    # Appends ---------------------------------------------------------------------------
    async def append(
        self,
        tenant: str,
        namespace: str,
        name: str,
        nbytes: int,
        decode: Callable[[], Awaitable[AppendBody]],
        *,
        charge_bytes: int | None = None,
    ) -> list[AppendRange]:
        """Charge the append quota ``charge_bytes`` (the body's decompressed size; default
        ``nbytes``), refunded if nothing is stored; decode the body with ``decode`` and
        append it; meter the ``nbytes`` that came over the wire once acknowledged."""
        async with self.gate.append_charge(
            tenant, nbytes if charge_bytes is None else charge_bytes
        ):
            body = await decode()
            ranges = await self.service.append(
                tenant,
                namespace,
                name,
                body.batches,
                partition=body.partition,
                producer_id=body.producer_id,
                sequence=body.sequence,
                stream=body.stream,
            )
        records = sum(r.count for r in ranges)
        metrics.record_append(records, nbytes)
        self.gate.record_append(tenant, records, nbytes)
        return ranges

    def refuse_append_early(self, tenant: str) -> None:
        """Refuse an append of a caller that holds its slot already before its body is
        read, when this replica refuses the tenant's appends for a while after a throttle
        (no I/O: an over-quota tenant costs the gateway next to nothing).

        Raises: Throttled."""
        self.gate.refuse_early(tenant, append=True, slot=False)

    @contextlib.asynccontextmanager
    async def stream_message(self, tenant: str, authorization: str | None) -> AsyncIterator[None]:
        """Serve one message of a long-lived call (an append stream's) as a request of its
        own: its credential checked again (a revoked key ends the stream), counted and
        charged to the tenant's requests/s, holding one of its in-flight slots.

        Raises:
            Unauthenticated, TenantSuspended: the stream must end.
            Throttled: over requests/s or no free slot (the message is refused).
        """
        if await self.gate.tenant_of(authorization) != tenant:
            raise Unauthenticated("invalid API key")
        async with self.gate.admit(tenant):
            yield

    async def append_arrow(
        self,
        tenant: str,
        namespace: str,
        name: str,
        body: bytes,
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[AppendRange]:
        """Append an Arrow IPC stream as it came over the wire (every edge that takes
        Arrow appends calls this).

        The body is measured from its messages' metadata before anything is decompressed
        (the request limit and the append quota count decompressed bytes), then decoded
        and fully validated only once the quota admitted it, and stored as it came when
        the core can.

        Raises:
            RequestTooLarge: over ``server.max_request_bytes`` on the wire or decompressed.
            MalformedPayload, and whatever :meth:`append` raises.
        """
        nbytes = len(body)
        limit = self.service.settings.server.max_request_bytes
        if nbytes > limit:
            raise RequestTooLarge(
                f"the append carries {nbytes} bytes; the limit is {limit}", limit=limit
            )
        info = await self.offload(nbytes >= OFFLOAD_BYTES, check_request, body, limit)
        big = max(nbytes, info.decoded_bytes) >= OFFLOAD_BYTES

        async def decode() -> AppendBody:
            _, batches = await self.offload(big, decode_valid, body)
            return AppendBody(batches, partition, producer_id, sequence, ClientStream(body, info))

        return await self.append(
            tenant, namespace, name, nbytes, decode, charge_bytes=info.decoded_bytes
        )

    async def append_batches(
        self,
        tenant: str,
        namespace: str,
        name: str,
        batches: Sequence[pa.RecordBatch],
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[AppendRange]:
        """Append record batches an edge decoded and validated already (Flight's
        ``DoPut``: Arrow's C++ read them off the wire, :func:`validate_batches` checked them
        on the edge's thread), charged and metered by their Arrow size.

        Raises:
            RequestTooLarge: over ``server.max_request_bytes``.
            Whatever :meth:`append` raises.
        """
        nbytes = sum(b.nbytes for b in batches)
        limit = self.service.settings.server.max_request_bytes
        if nbytes > limit:
            raise RequestTooLarge(
                f"the append carries {nbytes} bytes of Arrow data; the limit is {limit}",
                limit=limit,
            )

        async def decoded() -> AppendBody:
            return AppendBody(batches, partition, producer_id, sequence, None)

        return await self.append(tenant, namespace, name, nbytes, decoded)

    # Reads -----------------------------------------------------------------------------
    async def _answer(
        self,
        tenant: str,
        result: ReadResult,
        encode: Callable[[ReadResult], tuple[T, int]],
        in_place: bool = False,
    ) -> T:
        big = not in_place and result.num_records >= OFFLOAD_RECORDS
        out, nbytes = await self.offload(big, encode, result)
        metrics.record_read(result.num_records)
        await self.gate.record_read(tenant, result.num_records, nbytes)
        return out

    async def read(
        self,
        tenant: str,
        namespace: str,
        name: str,
        partition: int,
        offset: int,
        max_records: int | None,
        max_bytes: int | None,
        encode: Callable[[ReadResult], tuple[T, int]],
        *,
        raw_hot: bool = False,
        in_place: bool = False,
    ) -> T:
        """One stream read, encoded by ``encode`` (which answers the wire form and its size
        in bytes) and metered by that size; with ``raw_hot`` its hot records come as stored
        (see :meth:`gateway.core.StreamTables.read`); with ``in_place`` ``encode`` runs
        here whatever the size (an encode that costs next to nothing).

        A read starts only with room in the read budget (else it is refused at once,
        Throttled) and then holds what its answer really weighs until it is encoded: most
        reads are far smaller than their cap, so reserving the cap up front would starve
        concurrency for nothing."""
        await self.gate.check_read(tenant)
        budget = self.service.budget
        async with budget.hold(tenant, READ_COPIES * _READ_START):
            result = await self.service.read(
                tenant, namespace, name, partition, offset, max_records, max_bytes, raw_hot=raw_hot
            )
        async with budget.hold(tenant, READ_COPIES * result.nbytes, force=True):
            return await self._answer(tenant, result, encode, in_place)

    async def follow(
        self,
        tenant: str,
        namespace: str,
        name: str,
        partition: int,
        offset: int,
        encode: Callable[[ReadResult], tuple[T, int]],
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        max_wait_s: float | None = None,
        authorization: str | None = None,
        raw_hot: bool = False,
    ) -> AsyncIterator[T]:
        """Follow reads, each encoded and metered, each answer held under the tenant's
        share of the read budget until the stream takes the next. The caller's
        credential is checked again before every answer and at least every
        ``auth.key_cache_ttl_s`` while the stream waits, and the read quota before every
        answer after the first: a long-lived stream ends (UNAUTHENTICATED,
        PERMISSION_DENIED) once its key is revoked or its tenant suspended."""
        await self.gate.check_read(tenant)

        async def allowed() -> None:
            await self.gate.still_allowed(authorization, tenant)

        hold = _FollowHold(self.service.budget, tenant)
        results = self.service.follow(
            tenant,
            namespace,
            name,
            partition,
            offset,
            max_records=max_records,
            max_bytes=max_bytes,
            max_wait_s=max_wait_s,
            still_allowed=allowed,
            check_every_s=max(0.1, self.service.settings.auth.key_cache_ttl_s),
            raw_hot=raw_hot,
            hold=hold,
        )
        try:
            first = True
            async for result in results:
                if not first:
                    await self.gate.check_read(tenant)
                first = False
                yield await self._answer(tenant, result, encode)
        finally:
            await results.aclose()  # type: ignore[attr-defined]
            hold.idle()

    async def offsets_for_times(
        self,
        tenant: str,
        namespace: str,
        name: str,
        timestamp_us: int,
        partitions: Sequence[int] | None,
    ) -> dict[int, int]:
        return await self.service.offsets_for_times(
            tenant, namespace, name, timestamp_us, partitions
        )

    async def offset_bounds(
        self, tenant: str, namespace: str, name: str, partitions: Sequence[int] | None
    ) -> dict[int, tuple[int, int]]:
        """Per partition, (earliest offset, high watermark) across the tiers."""
        return await self.service.offset_bounds(tenant, namespace, name, partitions)

    # Scans and plans -------------------------------------------------------------------
    async def scan(
        self,
        tenant: str,
        namespace: str,
        name: str,
        *,
        columns: Sequence[str] | None,
        row_filter: str | None,
        as_of: Any,
        limit: int | None,
    ) -> ScanResult:
        """A scan's pinned view; its batches are metered as they are consumed (see
        :meth:`scan_chunks`)."""
        await self.gate.check_read(tenant)
        return await self.service.scan(
            tenant,
            namespace,
            name,
            columns=columns,
            row_filter=row_filter,
            as_of=as_of,
            limit=limit,
        )

    async def scan_schema(
        self, tenant: str, namespace: str, name: str, columns: Sequence[str] | None
    ) -> pa.Schema:
        """The schema a scan of ``columns`` would answer (Flight's GetSchema)."""
        return await self.service.scan_schema(tenant, namespace, name, columns)

    async def scan_chunks(
        self,
        tenant: str,
        result: ScanResult,
        encode: Callable[[list[pa.RecordBatch]], tuple[T, int]],
        target_bytes: int | None,
        *,
        always_one: bool = False,
        in_place: bool = False,
    ) -> AsyncIterator[T]:
        """The scan's batches in chunks of about ``target_bytes`` of Arrow data (one chunk
        for None), each encoded on the I/O pool (on the event loop with ``in_place``, for
        an encode that costs next to nothing) and metered; with ``always_one`` an empty
        scan still yields one (empty) chunk."""
        pending: list[pa.RecordBatch] = []
        size, sent = 0, False
        # Each chunk is read, encoded and sent under the tenant's share of the read budget
        # (a scan waits for room rather than fail half-way).
        bound = READ_COPIES * (target_bytes or self.service.settings.server.max_read_bytes)
        budget = self.service.budget

        async def flush() -> T:
            records = sum(b.num_rows for b in pending)
            if in_place:
                out, nbytes = encode(list(pending))
            else:
                out, nbytes = await self.service.offload(encode, list(pending))
            metrics.record_read(records)
            await self.gate.record_read(tenant, records, nbytes)
            return out

        batches = aiter(result.batches)
        carry: list[pa.RecordBatch] = []  # pieces of the last batch not sent yet
        exhausted = False
        while not exhausted:
            async with budget.hold(tenant, bound, wait_s=_SCAN_WAIT_S):
                full = False
                while not full:
                    if not carry:
                        batch = await anext(batches, None)
                        if batch is None:
                            exhausted = True
                            break
                        # A whole data file can come as one batch: cut it so that chunks
                        # stay near the target and the next is encoded while one is sent.
                        carry = list(pieces(batch, target_bytes))
                    piece = carry.pop(0)
                    pending.append(piece)
                    size += piece.nbytes
                    full = target_bytes is not None and size >= target_bytes
                if pending or (always_one and not sent):
                    yield await flush()
                    pending, size, sent = [], 0, True

    async def scan_parts(
        self, tenant: str, result: ScanResult, batch_bytes: int
    ) -> AsyncIterator[pa.RecordBatchReader]:
        """The scan's rows as C++ readers over whole tables (:attr:`ScanResult.parts`),
        for an edge that hands them to Arrow's transport: Python runs once per part,
        never per batch, and the readers cut batches of about ``batch_bytes``.

        Each part is read on the I/O pool under the tenant's share of the read budget
        (a scan waits for room rather than fail half-way) and metered once read. The
        next part is read while the transport sends the one before it, so a scan holds
        at most two parts at once.
        """
        assert result.parts is not None
        budget = self.service.budget
        parts = result.parts
        # (hold, read) of the part being read; the hold of the part being sent.
        pending: tuple[int, asyncio.Task[pa.Table | None]] | None = None
        sending = 0

        async def start() -> tuple[int, asyncio.Task[pa.Table | None]] | None:
            part = await anext(parts, None)
            if part is None:
                return None
            size = READ_COPIES * part.nbytes
            await budget.reserve(tenant, size, wait_s=_SCAN_WAIT_S)
            return size, asyncio.ensure_future(self.service.offload(part.read))

        try:
            pending = await start()
            while pending is not None:
                hold, task = pending
                pending = None
                sending = hold
                table = await task
                if table is None:
                    return
                pending = await start()
                if not table.schema.equals(result.schema):
                    table = table.cast(result.schema)
                metrics.record_read(table.num_rows)
                await self.gate.record_read(tenant, table.num_rows, table.nbytes)
                rows = max(1, table.num_rows * batch_bytes // max(1, table.nbytes))
                yield table.to_reader(max_chunksize=rows)
                # The transport has sent this part: give back its share.
                budget.release(tenant, sending)
                sending = 0
        finally:
            if sending:
                budget.release(tenant, sending)
            if pending is not None:
                pending[1].cancel()
                budget.release(tenant, pending[0])
            await parts.aclose()  # type: ignore[attr-defined]

    async def plan(
        self,
        tenant: str,
        namespace: str,
        name: str,
        *,
        row_filter: str | None,
        as_of: Any,
        files_url: str | None = None,
    ) -> ReadPlan:
        """A read plan. The data files of a local warehouse are given as links through
        this gateway (``<files_url>/v1/files/<token>``, sealed for the tenant and the file
        until ``cold.presign_expiry_s``) rather than as the server's paths, when the
        gateway serves them (a :class:`Tenancy`) and ``files_url`` (its HTTP address as
        the caller reaches it) is known."""
        await self.gate.check_read(tenant)
        plan = await self.service.plan(tenant, namespace, name, row_filter=row_filter, as_of=as_of)
        root = self._warehouse_folder()
        if files_url is None or root is None or not isinstance(self.gate, Tenancy):
            return plan
        tokens = self.gate.file_tokens
        files = []
        for f in plan.files:
            path = Path(f.url.removeprefix("file://"))
            if f.url.startswith(("http://", "https://")) or not path.is_relative_to(root):
                files.append(f)
                continue
            inside = str(path.relative_to(root))
            token, expires = tokens.issue(tenant, inside)
            when = dt.datetime.fromtimestamp(expires, dt.UTC)
            link = f"{files_url.rstrip('/')}/v1/files/{token}"
            files.append(replace(f, url=link, expires_at=when, warehouse_path=inside))
        return replace(plan, files=files)

    def _warehouse_folder(self) -> Path | None:
        """The local warehouse's folder, or None for object storage."""
        warehouse = self.service.settings.cold_warehouse
        if not warehouse.startswith("file://"):
            return None
        return Path(warehouse.removeprefix("file://")).resolve()

    def warehouse_file(self, token: str) -> tuple[str, Path] | None:
        """(tenant, file) of a link made by :meth:`plan`; None when the link is not one
        of ours, was altered, has expired, or names no file of the warehouse."""
        root = self._warehouse_folder()
        if root is None or not isinstance(self.gate, Tenancy):
            return None
        opened = self.gate.file_tokens.open(token)
        if opened is None:
            return None
        tenant, relative = opened
        path = (root / relative).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            return None
        return tenant, path


def pieces(batch: pa.RecordBatch, target_bytes: int | None) -> Sequence[pa.RecordBatch]:
    """``batch`` cut into zero-copy slices of about ``target_bytes`` each."""
    if target_bytes is None or batch.nbytes <= target_bytes or batch.num_rows <= 1:
        return [batch]
    rows = max(1, batch.num_rows * target_bytes // batch.nbytes)
    return [batch.slice(start, rows) for start in range(0, batch.num_rows, rows)]
