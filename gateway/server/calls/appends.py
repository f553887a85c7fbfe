"""Append calls: the append quota charged before, the request limit, Arrow bodies
measured, decoded and validated (:meth:`AppendCalls.append_arrow`), usage metered after,
and each message of a long-lived append stream served as a request of its own."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from gateway import metrics
from gateway.core import ClientStream
from gateway.server.calls.base import OFFLOAD_BYTES, CallsBase
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.codec import check_request
from gateway.wire.errors import RequestTooLarge, Unauthenticated
from gateway.wire.types import AppendRange

__all__ = ["AppendBody", "AppendCalls", "append_response"]


@dataclass(frozen=True, slots=True)
class AppendBody:
    """A decoded append request: its rows and where they go (and the Arrow IPC stream
    they were decoded from, which the core may store as it came)."""

    #: None: the core decodes them from ``stream`` on the I/O hop that stores them.
    batches: Sequence[pa.RecordBatch] | None
    partition: int | None = None
    producer_id: str | None = None
    sequence: int | None = None
    stream: ClientStream | None = None
    #: The producer's sequences count records (Kafka's idempotent producer), not batches.
    sequence_counts_records: bool = False


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


class AppendCalls(CallsBase):
    """Appends, charged, limited and metered."""

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
                sequence_counts_records=body.sequence_counts_records,
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

        async def decode() -> AppendBody:
            # Decoded and validated in full by the core, in the I/O pool hop that stores
            # the rows (one hop per append, not one more for the decoding).
            return AppendBody(None, partition, producer_id, sequence, ClientStream(body, info))

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
