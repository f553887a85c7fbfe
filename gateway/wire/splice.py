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
import itertools
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gateway.wire.codec import flatbuffer_deref, flatbuffer_field
from gateway.wire.schema import with_system_columns
from gateway.wire.stored import HotPiece

__all__ = [
    "MAX_MESSAGE_BYTES",
    "SplicedMessage",
    "read_messages",
    "schema_message_of",
    "splice_piece",
    "stream_of",
]

_I16 = struct.Struct("<h")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_PAIR = struct.Struct("<qq")
#: The end-of-stream marker of the IPC stream format.
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
#: Bytes per value of the system columns: _partition (int32), _offset, _timestamp (int64).
_WIDTHS = (4, 8, 8)
#: Arrow's MetadataVersion V5, and MessageHeader's Schema and RecordBatch.
_V5, _SCHEMA, _RECORD_BATCH = 4, 1, 3
_CONTINUATION = 0xFFFFFFFF
#: A compressed buffer's length prefix saying its bytes are not compressed.
_UNCOMPRESSED = struct.pack("<q", -1)


#: Arrow bytes of a spliced message at most: a stored record batch larger than this with
#: its system columns (an append stored as it came may hold 2 MiB of many tiny rows) is
#: decoded and cut, as before, so no message grows past what an edge sends in one
#: answer (gRPC's default limit is 4 MiB).
MAX_MESSAGE_BYTES = 2 * 1024 * 1024


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
    payload = piece.payload
    try:
        frames = _frames(payload)
        meta, _, _ = next(frames)
        if _header_type(meta) != _SCHEMA or not _schema_is(meta, schema):
            return None
        out: list[SplicedMessage] = []
        at, start, end = 0, piece.skip, piece.skip + piece.count
        while at < end:
            frame = next(frames, None)
            if frame is None:
                return None  # fewer rows than the batch says: let the decoder tell
            meta, body_at, body_end = frame
            if _header_type(meta) != _RECORD_BATCH:
                return None
            batch = _read_batch(meta, payload, body_at, body_end)
            if batch is None:
                return None
            rows = batch.length
            lo, hi = max(start, at), min(end, at + rows)
            if lo < hi:
                offset = piece.base_offset + lo
                size = batch.declared + sum(_WIDTHS) * (hi - lo)
                if size > MAX_MESSAGE_BYTES:
                    return None  # the decoding read cuts it into pieces an edge can send
                if lo == at and hi == at + rows:
                    data = _splice(batch, payload, body_at, body_end, partition, offset, piece)
                else:  # an edge: decoded, sliced and encoded again
                    whole = memoryview(payload)[body_at - 8 - len(meta) : body_end]
                    decoded = pa.ipc.read_record_batch(pa.py_buffer(whole), schema)
                    part = decoded.slice(lo - at, hi - lo)
                    data = (
                        with_system_columns(part, partition, offset, piece.timestamp_us)
                        .serialize()
                        .to_pybytes()
                    )
                out.append(SplicedMessage(data, offset, hi - lo, size))
            at += rows
        return out
    except (pa.ArrowException, ValueError, IndexError, StopIteration, struct.error):
        return None


def _frames(payload: bytes) -> Iterator[tuple[bytes, int, int]]:
    """``(metadata, body start, body end)`` of each encapsulated message of an IPC stream
    (Arrow's framing: the continuation marker, the metadata's length, the metadata, the
    body of the length the metadata says), to its end-of-stream marker."""
    pos, size = 0, len(payload)
    while pos + 8 <= size:
        if _U32.unpack_from(payload, pos)[0] != _CONTINUATION:
            raise ValueError("a message without the continuation marker")
        length = _I32.unpack_from(payload, pos + 4)[0]
        if length == 0:
            return
        meta = payload[pos + 8 : pos + 8 + length]
        at = flatbuffer_field(meta, flatbuffer_deref(meta, 0), 3)
        body_length = _I64.unpack_from(meta, at)[0] if at is not None else 0
        body_at = pos + 8 + length
        if length < 0 or body_length < 0 or body_at + body_length > size:
            raise ValueError("a message past the end of the stream")
        yield meta, body_at, body_at + body_length
        pos = body_at + body_length


def _header_type(meta: bytes) -> int:
    at = flatbuffer_field(meta, flatbuffer_deref(meta, 0), 1)
    return meta[at] if at is not None else 0


@functools.lru_cache(maxsize=4096)
def _schema_is(meta: bytes, schema: pa.Schema) -> bool:
    """Whether the schema message ``meta`` holds ``schema`` (as ``read_as`` compares)."""
    message = b"\xff\xff\xff\xff" + _I32.pack(len(meta)) + meta
    return bool(pa.ipc.read_schema(pa.py_buffer(message)).equals(schema))


@dataclass(frozen=True, slots=True)
class _Batch:
    """What a stored record batch message's metadata says."""

    length: int
    nodes: list[tuple[int, int]]
    buffers: list[tuple[int, int]]
    #: (codec, method) of its BodyCompression, None when uncompressed.
    compression: tuple[int, int] | None
    #: Arrow bytes of its buffers once decompressed.
    declared: int


def _read_batch(meta: bytes, payload: bytes, body_at: int, body_end: int) -> _Batch | None:
    """The record batch message ``meta`` (body at ``[body_at, body_end)`` of ``payload``),
    or None for one this does not rewrite (custom metadata, variadic buffers)."""
    root = flatbuffer_deref(meta, 0)
    header_at = flatbuffer_field(meta, root, 2)
    if header_at is None or flatbuffer_field(meta, root, 4) is not None:
        return None  # no header, or custom metadata (not carried over here)
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
    declared = 0
    for offset, size in buffers:
        if offset < 0 or size < 0 or body_at + offset + size > body_end:
            raise ValueError("a buffer outside the message body")
        if compression is not None and size >= 8:
            prefix = _I64.unpack_from(payload, body_at + offset)[0]
            declared += size - 8 if prefix == -1 else prefix
        else:
            declared += size
    if length < 0 or declared < 0:
        raise ValueError("negative lengths")
    return _Batch(length, nodes, buffers, compression, declared)


def _splice(
    batch: _Batch,
    payload: bytes,
    body_at: int,
    body_end: int,
    partition: int,
    first_offset: int,
    piece: HotPiece,
) -> bytes:
    """The encapsulated message of a stored record batch (its body at ``[body_at,
    body_end)`` of ``payload``) with the system columns appended."""
    length = batch.length
    values = (
        np.full(length, partition, dtype="<i4").tobytes(),
        np.arange(first_offset, first_offset + length, dtype="<i8").tobytes(),
        np.full(length, piece.timestamp_us, dtype="<i8").tobytes(),
    )
    nodes, buffers = list(batch.nodes), list(batch.buffers)
    parts: list[bytes | memoryview] = [memoryview(payload)[body_at:body_end]]
    end = _pad(parts, body_end - body_at)
    for data in values:
        nodes.append((length, 0))
        buffers.append((end, 0))  # no validity bitmap: no nulls
        if batch.compression is not None:
            data = _UNCOMPRESSED + data  # stored uncompressed
        buffers.append((end, len(data)))
        parts.append(data)
        end = _pad(parts, end + len(data))
    metadata = _message(length, nodes, buffers, batch.compression, end)
    prefix = b"\xff\xff\xff\xff" + _I32.pack(len(metadata))
    return b"".join([prefix, metadata, *parts])


def _pad(parts: list[bytes | memoryview], end: int) -> int:
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
        #: (table, slot) -> where that field's value is.
        self.fields: dict[tuple[str, int], int] = {}

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
            self.fields[(name, slot)] = pos
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
    """A Message flatbuffer (Arrow's Message.fbs) of a RecordBatch header: the layout of
    its shape (:func:`_layout`) with the numbers written in."""
    template, at_body, at_length, at_nodes, at_buffers = _layout(
        len(nodes), len(buffers), compression
    )
    buf = bytearray(template)
    _I64.pack_into(buf, at_body, body_length)
    _I64.pack_into(buf, at_length, length)
    struct.pack_into(f"<{2 * len(nodes)}q", buf, at_nodes, *itertools.chain(*nodes))
    struct.pack_into(f"<{2 * len(buffers)}q", buf, at_buffers, *itertools.chain(*buffers))
    return bytes(buf)


@functools.lru_cache(maxsize=1024)
def _layout(
    nodes: int, buffers: int, compression: tuple[int, int] | None
) -> tuple[bytes, int, int, int, int]:
    """The Message flatbuffer of a record batch of ``nodes`` field nodes and ``buffers``
    buffers, its numbers zero, and where its body length, row count, first node and
    first buffer go."""
    fb = _Builder()
    fb.table(
        "root",
        [(3, _I64.pack(0)), (2, "header"), (0, _I16.pack(_V5)), (1, bytes([_RECORD_BATCH]))],
        24,
    )
    batch_fields: list[tuple[int, bytes | str]] = [(0, _I64.pack(0)), (1, "nodes"), (2, "buffers")]
    if compression is not None:
        batch_fields.append((3, "compression"))
    fb.table("header", batch_fields, 24)
    if compression is not None:
        fb.table("compression", [(0, bytes([compression[0]])), (1, bytes([compression[1]]))], 8)
    fb.vector("nodes", [(0, 0)] * nodes)
    fb.vector("buffers", [(0, 0)] * buffers)
    template = fb.finish()
    return (
        template,
        fb.fields[("root", 3)],
        fb.fields[("header", 0)],
        fb.marks["nodes"] + 4,
        fb.marks["buffers"] + 4,
    )
