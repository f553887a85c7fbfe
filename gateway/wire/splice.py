"""Hot payloads sent as they are stored, the system columns spliced in.

A hot payload is an Arrow IPC stream of the user columns (:mod:`gateway.wire.stored`); a
reader that cannot add the system columns itself needs them in the stream. Rather than
decode every record batch, add the columns and encode it again, :func:`splice_piece`
rewrites each stored record batch *message*: its metadata (a small flatbuffer) gains
three field nodes and their buffers, and its body keeps the stored bytes as they are
(compressed or not) with the new columns' values after them, written uncompressed (a
compressed buffer whose length prefix is -1 holds raw bytes, Arrow's format says). Only
the record batches at a piece's edges, whose rows are partly read, are decoded, sliced
and encoded again. Python does work per message, never per record.

The result is a run of encapsulated IPC messages that follow the schema message of the
table's stored schema (:func:`stream_of`): any Arrow reader reads them as the batches
:func:`gateway.wire.stored.piece_rows` would have built.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gateway.wire.codec import batch_sizes, flatbuffer_deref, flatbuffer_field
from gateway.wire.schema import with_system_columns
from gateway.wire.stored import HotPiece

__all__ = ["SplicedMessage", "read_messages", "schema_message_of", "splice_piece", "stream_of"]

_I16 = struct.Struct("<h")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_PAIR = struct.Struct("<qq")
#: The end-of-stream marker of the IPC stream format.
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
#: Bytes per value of the system columns: _partition (int32), _offset, _timestamp (int64).
_WIDTHS = (4, 8, 8)
#: Arrow's MetadataVersion V5, and MessageHeader.RecordBatch.
_V5, _RECORD_BATCH = 4, 3


@dataclass(frozen=True, slots=True)
class SplicedMessage:
    """One encapsulated IPC record batch message with the system columns."""

    data: bytes
    #: Offset of its first row, and its number of rows.
    first_offset: int
    rows: int
    #: Arrow bytes of its columns once decoded, at most (what the buffers declare).
    nbytes: int

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.rows


@functools.lru_cache(maxsize=1024)
def schema_message_of(schema: pa.Schema) -> bytes:
    """``schema``'s encapsulated IPC schema message, the head of a stream."""
    return bytes(schema.serialize().to_pybytes())


def stream_of(schema: pa.Schema, messages: list[SplicedMessage]) -> bytes:
    """An IPC stream of ``messages`` under ``schema`` (the table's stored schema): its
    schema message, the messages, the end-of-stream marker."""
    return b"".join([schema_message_of(schema), *(m.data for m in messages), _EOS])


_NO_THREADS = pa.ipc.IpcReadOptions(use_threads=False)


def read_messages(schema: pa.Schema, messages: list[SplicedMessage]) -> pa.RecordBatchReader:
    """A reader of ``messages``'s batches, decoded by Arrow's C++ as it is drained."""
    return pa.ipc.open_stream(pa.py_buffer(stream_of(schema, messages)), options=_NO_THREADS)


def splice_piece(piece: HotPiece, schema: pa.Schema, partition: int) -> list[SplicedMessage] | None:
    """The rows of ``piece`` as messages with the system columns, or None when the
    payload cannot be spliced as it is (its schema is not ``schema``, the table's log
    schema, or it holds messages other than plain record batches): the caller decodes it.
    """
    source = pa.BufferReader(pa.py_buffer(piece.payload))
    try:
        reader = pa.ipc.MessageReader.open_stream(source)
        first = reader.read_next_message()
        if first.type != "schema" or not pa.ipc.read_schema(first).equals(schema):
            return None
        out: list[SplicedMessage] = []
        at, start, end = 0, piece.skip, piece.skip + piece.count
        while at < end:
            try:
                message = reader.read_next_message()
            except StopIteration:
                return None  # fewer rows than the batch says: let the decoder tell
            if message.type != "record batch":
                return None
            body = message.body if message.body is not None else pa.py_buffer(b"")
            meta = message.metadata.to_pybytes()
            declared, rows = batch_sizes(meta, body)
            lo, hi = max(start, at), min(end, at + rows)
            if lo < hi:
                offset = piece.base_offset + lo
                size = declared + sum(_WIDTHS) * (hi - lo)
                spliced = None
                if lo == at and hi == at + rows:
                    spliced = _splice(meta, body, partition, offset, piece.timestamp_us)
                if spliced is None:  # an edge, or a message this cannot rewrite
                    batch = pa.ipc.read_record_batch(message, schema).slice(lo - at, hi - lo)
                    rows_out = with_system_columns(batch, partition, offset, piece.timestamp_us)
                    spliced = rows_out.serialize().to_pybytes()
                out.append(SplicedMessage(spliced, offset, hi - lo, size))
            at += rows
        return out
    except (pa.ArrowException, ValueError, IndexError, struct.error):
        return None


def _splice(
    meta: bytes, body: pa.Buffer, partition: int, first_offset: int, timestamp_us: int
) -> bytes | None:
    """The encapsulated message of a stored record batch message (``meta``, ``body``)
    with the system columns appended; None for a message it does not rewrite (custom
    metadata, variadic buffers, an unknown layout)."""
    root = flatbuffer_deref(meta, 0)
    if flatbuffer_field(meta, root, 4) is not None:
        return None  # custom metadata: not carried over here
    header_at = flatbuffer_field(meta, root, 2)
    if header_at is None:
        return None
    batch = flatbuffer_deref(meta, header_at)
    if flatbuffer_field(meta, batch, 4) is not None:
        return None  # variadic buffer counts (string views)
    length_at = flatbuffer_field(meta, batch, 0)
    length = _I64.unpack_from(meta, length_at)[0] if length_at is not None else 0
    nodes = _structs(meta, flatbuffer_field(meta, batch, 1))
    buffers = _structs(meta, flatbuffer_field(meta, batch, 2))
    compression = None
    compression_at = flatbuffer_field(meta, batch, 3)
    if compression_at is not None:
        table = flatbuffer_deref(meta, compression_at)
        codec_at, method_at = flatbuffer_field(meta, table, 0), flatbuffer_field(meta, table, 1)
        compression = (
            meta[codec_at] if codec_at is not None else 0,
            meta[method_at] if method_at is not None else 0,
        )
    values = (
        np.full(length, partition, dtype="<i4").tobytes(),
        np.arange(first_offset, first_offset + length, dtype="<i8").tobytes(),
        np.full(length, timestamp_us, dtype="<i8").tobytes(),
    )
    parts = [body.to_pybytes()]
    end = _pad(parts, body.size)
    for data in values:
        nodes.append((length, 0))
        buffers.append((end, 0))  # no validity bitmap: no nulls
        if compression is not None:
            data = _I64.pack(-1) + data  # stored uncompressed
        buffers.append((end, len(data)))
        parts.append(data)
        end = _pad(parts, end + len(data))
    metadata = _message(length, nodes, buffers, compression, end)
    prefix = b"\xff\xff\xff\xff" + _I32.pack(len(metadata))
    return b"".join([prefix, metadata, *parts])


def _pad(parts: list[bytes], end: int) -> int:
    """Pad the body in ``parts`` (``end`` bytes long) to a multiple of 8."""
    extra = -end % 8
    if extra:
        parts.append(b"\x00" * extra)
    return end + extra


def _structs(meta: bytes, at: int | None) -> list[tuple[int, int]]:
    """A flatbuffer vector of 16-byte structs of two int64 (FieldNode, Buffer)."""
    if at is None:
        return []
    vec = flatbuffer_deref(meta, at)
    count = _U32.unpack_from(meta, vec)[0]
    return [_PAIR.unpack_from(meta, vec + 4 + 16 * i) for i in range(count)]


class _Builder:
    """Writes a flatbuffer front to back: a table's vtable just before it, what its
    offsets point to after it (flatbuffer offsets point forward), every scalar aligned to
    its size from the start of the buffer, as verifiers check."""

    def __init__(self) -> None:
        self.buf = bytearray(4)  # the root offset, set by root()
        self.patches: list[tuple[int, str]] = []
        self.marks: dict[str, int] = {}

    def align(self, n: int, then: int = 0) -> None:
        """Pad so that the position ``then`` bytes on is a multiple of ``n``."""
        self.buf += b"\x00" * (-(len(self.buf) + then) % n)

    def table(self, name: str, fields: list[tuple[int, bytes | str]], size: int) -> None:
        """A table ``name`` of ``size`` bytes after its soffset: ``fields`` are (slot,
        value) in layout order, a value either raw bytes or the name of a later object
        its offset points to; each starts where the ones before it end."""
        slots = max(slot for slot, _ in fields) + 1
        positions: dict[int, int] = {}
        at = 4
        for slot, value in fields:
            width = 4 if isinstance(value, str) else len(value)
            at += -at % width
            positions[slot] = at
            at += width
        table_size = max(size, at)
        vtable = [4 + 2 * slots, table_size] + [positions.get(s, 0) for s in range(slots)]
        vbytes = b"".join(_I16.pack(v) for v in vtable)
        self.align(8, len(vbytes))
        vt_at = len(self.buf)
        self.buf += vbytes
        table_at = len(self.buf)
        self.marks[name] = table_at
        self.buf += _I32.pack(table_at - vt_at) + b"\x00" * (table_size - 4)
        for slot, value in fields:
            pos = table_at + positions[slot]
            if isinstance(value, str):
                self.patches.append((pos, value))
            else:
                self.buf[pos : pos + len(value)] = value

    def vector(self, name: str, items: list[tuple[int, int]]) -> None:
        """A vector of 16-byte structs, its elements aligned to 8."""
        self.align(8, 4)
        self.marks[name] = len(self.buf)
        self.buf += _U32.pack(len(items))
        for a, b in items:
            self.buf += _PAIR.pack(a, b)

    def finish(self) -> bytes:
        self.buf[0:4] = _U32.pack(self.marks["root"])
        for pos, name in self.patches:
            self.buf[pos : pos + 4] = _U32.pack(self.marks[name] - pos)
        self.align(8)
        return bytes(self.buf)


def _message(
    length: int,
    nodes: list[tuple[int, int]],
    buffers: list[tuple[int, int]],
    compression: tuple[int, int] | None,
    body_length: int,
) -> bytes:
    """A Message flatbuffer (Arrow's Message.fbs) of a RecordBatch header."""
    fb = _Builder()
    fb.table(
        "root",
        [
            (3, _I64.pack(body_length)),
            (2, "header"),
            (0, _I16.pack(_V5)),
            (1, bytes([_RECORD_BATCH])),
        ],
        24,
    )
    batch_fields: list[tuple[int, bytes | str]] = [
        (0, _I64.pack(length)),
        (1, "nodes"),
        (2, "buffers"),
    ]
    if compression is not None:
        batch_fields.append((3, "compression"))
    fb.table("header", batch_fields, 24)
    if compression is not None:
        fb.table("compression", [(0, bytes([compression[0]])), (1, bytes([compression[1]]))], 8)
    fb.vector("nodes", nodes)
    fb.vector("buffers", buffers)
    return fb.finish()
