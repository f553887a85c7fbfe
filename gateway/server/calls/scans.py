"""Scan calls: a scan's pinned view, and its rows in chunks (or whole parts for Arrow's
transport) read under the tenant's share of the read budget and metered as consumed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pyarrow as pa

from gateway import metrics
from gateway.core import ScanResult
from gateway.core.budget import READ_COPIES
from gateway.server.calls.base import CallsBase, T

__all__ = ["ScanCalls", "pieces"]

#: Longest a scan waits for room in the read budget before it is refused.
_SCAN_WAIT_S = 60.0


class ScanCalls(CallsBase):
    """Scans, read under the read budget and metered."""

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


def pieces(batch: pa.RecordBatch, target_bytes: int | None) -> Sequence[pa.RecordBatch]:
    """``batch`` cut into zero-copy slices of about ``target_bytes`` each."""
    if target_bytes is None or batch.nbytes <= target_bytes or batch.num_rows <= 1:
        return [batch]
    rows = max(1, batch.num_rows * target_bytes // batch.nbytes)
    return [batch.slice(start, rows) for start in range(0, batch.num_rows, rows)]
