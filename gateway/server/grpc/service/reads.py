"""The servicer's read methods: stream reads and follows, offsets by time, and a read's
answer as ReadResponse messages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pyarrow as pa

from gateway.core import ReadResult
from gateway.server.calls import OFFLOAD_RECORDS, pieces
from gateway.server.grpc.calls import current_call
from gateway.server.grpc.service.base import ServicerBase, partition_offsets
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.codec import check_request, decode_valid, encode_stream
from gateway.wire.splice import SplicedMessage, stream_of

__all__ = ["ReadMethods"]

#: Bytes of Arrow data per Read response message.
_READ_CHUNK_BYTES = 1024 * 1024


def _read_messages(result: ReadResult) -> tuple[list[pb.ReadResponse], int]:
    """One ReadResponse per ~1 MiB of batches (the last carries the result's next
    offset), then per ~1 MiB of spliced hot messages (each an Arrow stream of them), then
    per ~1 MiB of hot batches as stored (each with the schema), and the
    bytes they carry; an empty result is one message without records, which still tells
    where the log ends."""
    if not result.batches and not result.pieces and not result.messages:
        empty = pb.ReadResponse(
            next_offset=result.next_offset,
            high_watermark=result.high_watermark,
            tiered_watermark=result.tiered_watermark,
        )
        return [empty], 0
    out: list[pb.ReadResponse] = []
    pending: list[pa.RecordBatch] = []
    size = nbytes = 0
    # A record batch larger than a message is cut, so no message outgrows a client's
    # receive limit (grpc's default is 4 MiB) whatever was appended.
    cut = [piece for b in result.batches for piece in pieces(b, _READ_CHUNK_BYTES)]
    for i, b in enumerate(cut):
        pending.append(b)
        size += b.nbytes
        if size >= _READ_CHUNK_BYTES or i == len(cut) - 1:
            next_offset = int(pending[-1].column("_offset")[-1].as_py()) + 1
            payload = encode_stream(pending, result.schema)
            nbytes += len(payload)
            out.append(
                pb.ReadResponse(
                    arrow_ipc=payload,
                    next_offset=next_offset,
                    high_watermark=result.high_watermark,
                    tiered_watermark=result.tiered_watermark,
                )
            )
            pending, size = [], 0
    group_of: list[SplicedMessage] = []
    for i, m in enumerate(result.messages):
        # Hot records spliced into their stored bytes: sent as they are.
        group_of.append(m)
        size += len(m.data)
        if size >= _READ_CHUNK_BYTES or i == len(result.messages) - 1:
            payload = stream_of(result.schema, group_of)
            nbytes += len(payload)
            out.append(
                pb.ReadResponse(
                    arrow_ipc=payload,
                    next_offset=m.next_offset,
                    high_watermark=result.high_watermark,
                    tiered_watermark=result.tiered_watermark,
                )
            )
            group_of, size = [], 0
    if result.pieces:
        schema_only = encode_stream([], result.schema)
        group: list[pb.HotBatch] = []
        for i, p in enumerate(result.pieces):
            group.append(
                pb.HotBatch(
                    arrow_ipc=p.payload,
                    base_offset=p.base_offset,
                    timestamp_us=p.timestamp_us,
                    skip=p.skip,
                    count=p.count,
                )
            )
            size += len(p.payload)
            if size >= _READ_CHUNK_BYTES or i == len(result.pieces) - 1:
                nbytes += size + len(schema_only)
                out.append(
                    pb.ReadResponse(
                        arrow_ipc=schema_only,
                        next_offset=p.next_offset,
                        high_watermark=result.high_watermark,
                        tiered_watermark=result.tiered_watermark,
                        hot_batches=group,
                    )
                )
                group, size = [], 0
    return out, nbytes


class ReadMethods(ServicerBase):
    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.ReadResponse]:
        caller = current_call()
        ns, name = request.table.namespace, request.table.name
        max_bytes = request.max_bytes or None
        if request.follow:
            async for msgs in self.calls.follow(
                caller.tenant,
                ns,
                name,
                request.partition,
                request.offset,
                _read_messages,
                max_records=request.max_records or None,
                max_bytes=max_bytes,
                authorization=caller.authorization,
                raw_hot=request.raw_hot,
                as_ipc=not request.raw_hot,
            ):
                for msg in msgs:
                    yield msg
            return
        wanted = request.max_records or self.settings.server.default_read_records
        offset, seen = request.offset, 0
        while True:
            msgs = await self.calls.read(
                caller.tenant, ns, name, request.partition, offset, wanted - seen, max_bytes,
                _read_messages, raw_hot=request.raw_hot, as_ipc=not request.raw_hot,
            )  # fmt: skip
            last = msgs[-1]
            got = last.next_offset - offset  # offsets are dense
            if got == 0:
                if seen == 0:
                    yield last  # an empty read still tells where the log ends
                return
            for msg in msgs:
                yield msg
            seen += got
            offset = last.next_offset
            if seen >= wanted or offset >= last.high_watermark:
                return

    async def Lookup(self, request: pb.LookupRequest, context: Any) -> pb.LookupResponse:
        check_request(request.arrow_ipc, self.settings.server.max_request_bytes)
        schema, batches = decode_valid(request.arrow_ipc)
        rows = await self.calls.get(
            current_call().tenant,
            request.table.namespace,
            request.table.name,
            pa.Table.from_batches(batches, schema),
        )
        data = await self.calls.offload(
            rows.num_rows >= OFFLOAD_RECORDS, encode_stream, rows.to_batches(), rows.schema
        )
        return pb.LookupResponse(arrow_ipc=data)

    # Offsets and consumer groups ---------------------------------------------------------
    async def OffsetsForTimes(
        self, request: pb.OffsetsForTimesRequest, context: Any
    ) -> pb.OffsetsForTimesResponse:
        found = await self.calls.offsets_for_times(
            current_call().tenant,
            request.table.namespace,
            request.table.name,
            request.timestamp_us,
            list(request.partitions),
        )
        return pb.OffsetsForTimesResponse(offsets=partition_offsets(found))
