"""Flight reads: ``DoGet`` of a scan or of stream reads, sent by Arrow's C++ transport."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from gateway import metrics
from gateway.core import ReadResult
from gateway.server.calls import pieces
from gateway.server.flight.bridge import END, LoopBridge
from gateway.server.flight.middleware import Caller
from gateway.server.flight.tickets import ReadCommand, ScanCommand, parse_command
from gateway.wire.errors import InvalidRequest
from gateway.wire.splice import read_messages

__all__ = ["FlightReads"]

log = logging.getLogger("tidegate.server")

#: Arrow data per scan chunk pulled from the loop (and per batch sent, at most).
_SCAN_CHUNK_BYTES = 4 * 1024 * 1024
#: Arrow data per batch of a stream read.
_READ_CHUNK_BYTES = 1024 * 1024


class FlightReads(LoopBridge):
    """``DoGet``: scans and stream reads."""

    def do_get(self, caller: Caller, raw: bytes) -> fl.FlightDataStream:
        command = parse_command(raw)
        kind = "scan" if isinstance(command, ScanCommand) else "read"
        items = (
            self._scan(caller.tenant, command)
            if isinstance(command, ScanCommand)
            else self._read(caller.tenant, command)
        )
        # The schema (or the call's error) and the first chunk in one trip to the loop.
        schema, first = self.on_loop(_head(items))
        return fl.GeneratorStream(schema, self._drain(kind, items, first))

    def _drain(self, kind: str, items: AsyncIterator[Any], chunk: Any) -> Iterator[Any]:
        """The chunks of ``items`` for Flight's GeneratorStream: a C++ reader is drained
        by Arrow's C++ (Python runs again only for the next chunk); a chunk marked
        :class:`_Last` ends the call without another trip to the loop."""
        closed = False
        try:
            while chunk is not END:
                last = isinstance(chunk, _Last)
                if last:
                    chunk = chunk.items
                if isinstance(chunk, _Answer):  # built here, on Flight's thread
                    chunk = _read_chunk(chunk.result, chunk.meta)
                readers = sum(1 for c in chunk if isinstance(c, pa.RecordBatchReader))
                metrics.record_flight_sent(kind, readers, len(chunk) - readers)
                yield from chunk
                if last:
                    # The generator has nothing left: let it close on the loop, unawaited.
                    closed = True
                    if not self.loop.is_closed():
                        asyncio.run_coroutine_threadsafe(_quietly_close(items), self.loop)
                    return
                chunk = self._pull(items)
        finally:
            if not closed:
                self._close(items)

    async def _scan(self, tenant: str, cmd: ScanCommand) -> AsyncIterator[Any]:
        """The scan's schema, then its chunks: C++ readers over whole parts of it
        (:meth:`DataCalls.scan_parts`), or lists of batches for a scan with a limit."""
        async with self.gate.admit(tenant):
            result = await self.calls.scan(
                tenant,
                cmd.namespace,
                cmd.name,
                columns=cmd.columns,
                row_filter=cmd.filter,
                as_of=cmd.as_of,
                limit=cmd.limit,
            )
            yield result.schema
            if result.parts is not None:
                await result.batches.aclose()  # type: ignore[attr-defined]
                async for reader in self.calls.scan_parts(tenant, result, _SCAN_CHUNK_BYTES):
                    yield [reader]
                return
            async for batches in self.calls.scan_chunks(
                tenant, result, _as_is, _SCAN_CHUNK_BYTES, in_place=True
            ):
                yield batches

    async def _read(self, tenant: str, cmd: ReadCommand) -> AsyncIterator[Any]:
        """The table's schema, then stream reads from ``cmd.offset`` until
        ``max_records`` (default ``server.default_read_records``) or the high watermark:
        each read's batches but its last as a C++ reader, its last batch with
        ``next_offset``, ``high_watermark`` and ``tiered_watermark`` as JSON metadata."""
        wanted = cmd.max_records or self.settings.server.default_read_records
        if wanted < 0:
            raise InvalidRequest("max_records must not be negative")
        async with self.gate.admit(tenant):
            offset, seen, first = cmd.offset, 0, True
            while True:
                result: ReadResult = await self.calls.read(
                    tenant,
                    cmd.namespace,
                    cmd.name,
                    cmd.partition,
                    offset,
                    wanted - seen,
                    cmd.max_bytes,
                    _result_size,
                    as_ipc=True,
                    in_place=True,
                )
                if first:
                    yield result.schema
                    first = False
                got = result.next_offset - offset
                meta = pa.py_buffer(
                    json.dumps(
                        {
                            "next_offset": result.next_offset,
                            "high_watermark": result.high_watermark,
                            "tiered_watermark": result.tiered_watermark,
                        }
                    ).encode()
                )
                chunk = _Answer(result, meta)
                seen += got
                offset = result.next_offset
                if got == 0 or seen >= wanted or offset >= result.high_watermark:
                    yield _Last(chunk)
                    return
                yield chunk


def _read_chunk(result: ReadResult, meta: pa.Buffer) -> list[Any]:
    """A read's answer for Flight: C++ readers of its batches and of its spliced hot
    messages (decoded by Arrow's C++ as Flight drains them), then its last batch with
    ``meta``."""
    cut = [p for b in result.batches for p in pieces(b, _READ_CHUNK_BYTES)]
    spliced = result.messages
    if not spliced:
        cut = cut or [pa.RecordBatch.from_pylist([], schema=result.schema)]
        last, cut = cut[-1], cut[:-1]
    else:
        last = pa.ipc.read_record_batch(pa.py_buffer(spliced[-1].data), result.schema)
    chunk: list[Any] = []
    if cut:
        chunk.append(pa.Table.from_batches(cut, result.schema).to_reader())
    if len(spliced) > 1:
        chunk.append(read_messages(result.schema, spliced[:-1]))
    chunk.append((last, meta))
    return chunk


@dataclass(frozen=True, slots=True)
class _Last:
    """The last chunk of a call."""

    items: Any


@dataclass(frozen=True, slots=True)
class _Answer:
    """A stream read's answer, made into Flight's items (:func:`_read_chunk`: the last
    message decoded, readers made) by the Flight thread that sends it, not on the event
    loop that every call shares."""

    result: ReadResult
    meta: pa.Buffer


async def _head(items: AsyncIterator[Any]) -> tuple[pa.Schema, Any]:
    schema = await anext(items)
    return schema, await anext(items, END)


async def _quietly_close(items: Any) -> None:
    try:
        await items.aclose()
    except Exception:  # closing after the client went away
        log.debug("closing a Flight stream failed", exc_info=True)


def _as_is(batches: list[pa.RecordBatch]) -> tuple[list[pa.RecordBatch], int]:
    return batches, sum(b.nbytes for b in batches)


def _result_size(result: ReadResult) -> tuple[ReadResult, int]:
    return result, result.nbytes
