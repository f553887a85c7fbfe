"""Hot-tier batches as they are stored, and the records they hold.

A hot batch is one appended request for one partition: an Arrow IPC stream of user
columns (in the schema it was appended under), the offset of its first row and its append
time. The system columns are derived from those numbers, so a reader can be sent the
stored bytes as they are (:class:`HotPiece`) and build the records itself
(:func:`piece_rows`): the gateway does it for the edges that decode, the SDK for reads
that ask for hot batches as stored (``ReadRequest.raw_hot``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from gateway.wire.codec import iter_rows
from gateway.wire.evolution import read_as
from gateway.wire.schema import with_system_columns

__all__ = ["HotPiece", "piece_rows", "schema_message"]

#: Decompression on the calling thread: reads run on the gateway's I/O pool, one per
#: thread already, and handing each small buffer to Arrow's pool costs more than it saves.
_NO_THREADS = pa.ipc.IpcReadOptions(use_threads=False)


@dataclass(frozen=True, slots=True)
class HotPiece:
    """Rows ``[skip, skip + count)`` of a stored hot batch."""

    #: The stored Arrow IPC stream (user columns).
    payload: bytes
    #: Offset of the payload's first row.
    base_offset: int
    timestamp_us: int
    skip: int
    count: int

    @property
    def first_offset(self) -> int:
        return self.base_offset + self.skip

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.skip + self.count


def piece_rows(
    piece: HotPiece, schema: pa.Schema | None, partition: int
) -> Iterator[pa.RecordBatch]:
    """The records of ``piece`` with the system columns, in the user ``schema`` (a batch
    stored under an older schema reads under the current one; None: as stored). Only the
    record batches of the payload that hold the rows are decompressed.

    Raises:
        StaleSchema: the payload holds columns newer than ``schema``.
    """
    for at, chunk in _rows(piece):
        if schema is not None:
            chunk = read_as(chunk, schema)
        yield with_system_columns(chunk, partition, piece.base_offset + at, piece.timestamp_us)


def _rows(piece: HotPiece) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(row index, batch)`` pairs of the piece's rows, decompressing only the record
    batches that hold them. From the first row, the stream's batches are read in order
    until the piece's rows are in (no metadata parsing of our own is needed)."""
    if piece.skip:
        yield from iter_rows(piece.payload, piece.skip, piece.count)
        return
    at = 0
    for batch in pa.ipc.open_stream(pa.py_buffer(piece.payload), options=_NO_THREADS):
        if at + batch.num_rows >= piece.count:
            yield at, batch.slice(0, piece.count - at)
            return
        yield at, batch
        at += batch.num_rows


def schema_message(payload: bytes) -> bytes:
    """The leading bytes of an Arrow IPC stream that hold its schema message (the
    continuation marker, the metadata length and the metadata): a cheap key for
    recognising a schema seen before. Empty when the bytes do not start that way."""
    if len(payload) < 8 or payload[:4] != b"\xff\xff\xff\xff":
        return b""
    length = int.from_bytes(payload[4:8], "little", signed=True)
    if length <= 0 or 8 + length > len(payload):
        return b""
    return payload[: 8 + length]
