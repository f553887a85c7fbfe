"""Read calls: stream reads and follows under the tenant's read quota and share of the
read budget, metered by what they answer, and offsets looked up by time."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

import pyarrow as pa

from gateway import metrics
from gateway.core import ReadResult
from gateway.core.budget import READ_COPIES, ReadBudget
from gateway.server.calls.base import OFFLOAD_RECORDS, CallsBase, T

__all__ = ["ReadCalls"]

#: What a unary read reserves before it knows its answer's size.
_READ_START = 64 * 1024
#: Longest a follow stream waits for room in the read budget before it is refused.
_FOLLOW_WAIT_S = 60.0


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


class ReadCalls(CallsBase):
    """Reads and follows, held under the read budget and metered."""

    async def _answer(
        self,
        tenant: str,
        result: ReadResult,
        encode: Callable[[ReadResult], tuple[T, int]],
        in_place: bool = False,
    ) -> T:
        # Only decoded records cost an encoding: hot batches as stored go out as they are
        # (a message per ~1 MiB of payloads), cheaper than a trip to the I/O pool.
        decoded = sum(b.num_rows for b in result.batches)
        big = not in_place and decoded >= OFFLOAD_RECORDS
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
        as_ipc: bool = False,
        in_place: bool = False,
    ) -> T:
        """One stream read, encoded by ``encode`` (which answers the wire form and its size
        in bytes) and metered by that size; with ``raw_hot`` its hot records come as stored,
        with ``as_ipc`` as IPC messages spliced into the stored bytes where the read allows
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
                tenant,
                namespace,
                name,
                partition,
                offset,
                max_records,
                max_bytes,
                raw_hot=raw_hot,
                as_ipc=as_ipc,
            )
        async with budget.hold(tenant, READ_COPIES * result.nbytes, force=True):
            return await self._answer(tenant, result, encode, in_place)

    async def get(self, tenant: str, namespace: str, name: str, keys: pa.Table) -> pa.Table:
        """Point lookups of a primary-key table (:meth:`StreamTables.get
        <gateway.core.StreamTables.get>`), under the tenant's read quota and metered as a
        read of the rows found."""
        await self.gate.check_read(tenant)
        rows = await self.service.get(tenant, namespace, name, keys)
        metrics.record_read(rows.num_rows)
        await self.gate.record_read(tenant, rows.num_rows, rows.nbytes)
        return rows

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
        as_ipc: bool = False,
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
            as_ipc=as_ipc,
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
