"""Arrow IPC encoding of batches, for hot-tier payloads and for the wire."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa

from gateway.wire.errors import MalformedPayload, RequestTooLarge

__all__ = [
    "BodyCompression",
    "Compression",
    "StreamInfo",
    "batch_sizes",
    "check_request",
    "decode_batch",
    "decode_stream",
    "decode_valid",
    "encode_batch",
    "encode_stream",
    "flatbuffer_deref",
    "flatbuffer_field",
    "inspect_stream",
    "iter_rows",
    "validate_batches",
]

_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_I64 = struct.Struct("<q")
_BUFFER = struct.Struct("<qq")

Compression = Literal["zstd", "lz4", "none"]
#: What an Arrow IPC stream's record batches declare (``mixed``: not all the same).
BodyCompression = Literal["zstd", "lz4", "none", "mixed"]


def _options(compression: Compression) -> pa.ipc.IpcWriteOptions:
    codec = None if compression == "none" else ("lz4_frame" if compression == "lz4" else "zstd")
    return pa.ipc.IpcWriteOptions(compression=codec)


def encode_stream(
    batches: Iterable[pa.RecordBatch], schema: pa.Schema, compression: Compression = "none"
) -> bytes:
    """An Arrow IPC stream holding ``batches``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=_options(compression)) as writer:
        for b in batches:
            writer.write_batch(b)
    return bytes(sink.getvalue().to_pybytes())


#: Arrow data per record batch of a hot-tier payload: a reader decodes only the chunks
#: that hold the rows it wants, so a small read of a large appended batch stays small
#: (smaller chunks made zstd markedly slower to compress).
PAYLOAD_CHUNK_BYTES = 1024 * 1024


def encode_batch(
    batch: pa.RecordBatch,
    compression: Compression = "zstd",
    chunk_bytes: int = PAYLOAD_CHUNK_BYTES,
) -> bytes:
    """One batch as a self-describing, compressed Arrow IPC stream (a hot-tier payload), in
    record batches of about ``chunk_bytes`` of Arrow data each."""
    rows = batch.num_rows
    if batch.nbytes <= chunk_bytes or rows <= 1:
        return encode_stream([batch], batch.schema, compression)
    per_chunk = max(1, rows * chunk_bytes // batch.nbytes)
    chunks = (batch.slice(start, per_chunk) for start in range(0, rows, per_chunk))
    return encode_stream(chunks, batch.schema, compression)


def iter_rows(
    payload: bytes | pa.Buffer,
    start: int = 0,
    length: int | None = None,
    *,
    threads: bool = True,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Rows ``[start, start + length)`` of a hot-tier payload, as ``(row index, batch)``
    pairs in order, decompressing only the record batches that hold them (their row
    counts are read from the stream's metadata). All of it (``start`` 0, no ``length``):
    every batch, decoded in one go (``threads``: as :func:`decode_stream`)."""
    if start == 0 and length is None:
        at = 0
        for batch in decode_stream(payload, threads=threads)[1]:
            yield at, batch
            at += batch.num_rows
        return
    source = pa.BufferReader(pa.py_buffer(payload) if isinstance(payload, bytes) else payload)
    reader = pa.ipc.MessageReader.open_stream(source)
    schema = pa.ipc.read_schema(reader.read_next_message())
    end = None if length is None else start + length
    at = 0
    while end is None or at < end:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return
        body = message.body if message.body is not None else pa.py_buffer(b"")
        _, rows = batch_sizes(message.metadata.to_pybytes(), body)
        if at + rows > start:
            batch = pa.ipc.read_record_batch(message, schema)
            lo = max(0, start - at)
            hi = rows if end is None else min(rows, end - at)
            yield at + lo, batch.slice(lo, hi - lo)
        at += rows


_NO_THREADS = pa.ipc.IpcReadOptions(use_threads=False)


def decode_stream(
    data: bytes | pa.Buffer, *, threads: bool = True
) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Schema and batches of an Arrow IPC stream. ``threads=False`` decompresses on the
    calling thread (for callers that already run one decoding thread per core: handing
    each small buffer to Arrow's pool costs more than it saves).

    Raises:
        MalformedPayload: the bytes are not a complete Arrow IPC stream.
    """
    try:
        reader = pa.ipc.open_stream(
            pa.py_buffer(data) if isinstance(data, bytes) else data,
            options=None if threads else _NO_THREADS,
        )
        batches = list(reader)
        return reader.schema, batches
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as exc:
        raise MalformedPayload(f"body is not a valid Arrow IPC stream: {exc}") from exc


def decode_batch(payload: bytes) -> pa.RecordBatch:
    """The single batch of a hot-tier payload (an empty stream decodes to zero rows)."""
    schema, batches = decode_stream(payload)
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches, schema).combine_chunks().to_batches()[0]


# --------------------------------------------------------------------------------------
# Bodies from the network: inspected before they are decompressed, validated in full
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What the metadata of an Arrow IPC stream declares, read without decompressing it."""

    #: Bytes of Arrow data once decompressed (the sum of every buffer's declared size).
    decoded_bytes: int
    #: Rows over every record batch.
    rows: int
    #: Bytes the stream takes in the body (the rest would be a second stream).
    stream_bytes: int
    #: Bytes of Arrow data of its largest record batch once decompressed.
    largest_batch_bytes: int = 0
    #: The compression its record batches declare (``none`` when it has none).
    compression: BodyCompression = "none"
    #: The schema message's metadata (flatbuffer) exactly as it came: a stream whose
    #: schema is known is recognised by these bytes without parsing them.
    schema_message: bytes = field(default=b"", repr=False)


def flatbuffer_field(meta: bytes, table: int, slot: int) -> int | None:
    """Position of field ``slot`` of the flatbuffer table at ``table`` (None: absent)."""
    vtable = table - _I32.unpack_from(meta, table)[0]
    vtable_size = _U16.unpack_from(meta, vtable)[0]
    at = 4 + 2 * slot
    if at + 2 > vtable_size:
        return None
    offset = _U16.unpack_from(meta, vtable + at)[0]
    return table + offset if offset else None


def flatbuffer_deref(meta: bytes, pos: int) -> int:
    return pos + int(_U32.unpack_from(meta, pos)[0])


def batch_sizes(meta: bytes, body: pa.Buffer) -> tuple[int, int]:
    """(decoded bytes, rows) of a record batch message, from its flatbuffer metadata
    (Arrow's Message.fbs: Message.header is a RecordBatch whose ``buffers`` locate the body
    buffers; a compressed buffer starts with its uncompressed length, -1 for none)."""
    root = flatbuffer_deref(meta, 0)
    header = flatbuffer_field(meta, root, 2)
    if header is None:
        raise ValueError("a record batch message without a header")
    batch = flatbuffer_deref(meta, header)
    length_at = flatbuffer_field(meta, batch, 0)
    rows = _I64.unpack_from(meta, length_at)[0] if length_at is not None else 0
    buffers_at = flatbuffer_field(meta, batch, 2)
    compressed = flatbuffer_field(meta, batch, 3) is not None
    total = 0
    if buffers_at is not None:
        vec = flatbuffer_deref(meta, buffers_at)
        count = _U32.unpack_from(meta, vec)[0]
        for i in range(count):
            offset, length = _BUFFER.unpack_from(meta, vec + 4 + 16 * i)
            if offset < 0 or length < 0 or offset + length > body.size:
                raise ValueError(f"buffer {i} lies outside the message body")
            if compressed and length >= 8:
                declared = _I64.unpack(body.slice(offset, 8).to_pybytes())[0]
                total += length - 8 if declared == -1 else declared
            else:
                total += length
    if rows < 0 or total < 0:
        raise ValueError("negative lengths")
    return total, rows


#: BodyCompression.codec of Arrow's Message.fbs (absent: LZ4_FRAME, its default).
_CODECS: dict[int, BodyCompression] = {0: "lz4", 1: "zstd"}


def _batch_compression(meta: bytes) -> BodyCompression:
    """The codec a record batch message declares (``none`` without a compression table).
    The message was already read by :func:`batch_sizes`, so its offsets are sound."""
    batch = flatbuffer_deref(meta, flatbuffer_field(meta, flatbuffer_deref(meta, 0), 2) or 0)
    at = flatbuffer_field(meta, batch, 3)
    if at is None:
        return "none"
    codec_at = flatbuffer_field(meta, flatbuffer_deref(meta, at), 0)
    codec = meta[codec_at] if codec_at is not None else 0
    if codec not in _CODECS:
        raise ValueError(f"unknown compression codec {codec}")
    return _CODECS[codec]


def inspect_stream(data: bytes | pa.Buffer) -> StreamInfo:
    """Read an Arrow IPC stream's messages (not their data) and sum what they declare.

    Cheap whatever the compression: nothing is decompressed, so a small body that would
    expand enormously is measured before any memory is spent on it.

    Raises:
        MalformedPayload: not an Arrow IPC stream, or a message of a kind appends never
            carry (dictionaries, tensors).
    """
    source = pa.BufferReader(pa.py_buffer(data) if isinstance(data, bytes) else data)
    decoded = rows = largest = 0
    schema_message = b""
    codecs: set[BodyCompression] = set()
    try:
        reader = pa.ipc.MessageReader.open_stream(source)
        first = True
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            if first and message.type != "schema":
                raise MalformedPayload("the Arrow stream does not start with a schema message")
            if message.type == "schema":
                if first:
                    schema_message = message.metadata.to_pybytes()
                first = False
                continue
            if message.type != "record batch":
                raise MalformedPayload(
                    f"the Arrow stream holds a {message.type} message; appends take plain "
                    "record batches (no dictionary-encoded columns)"
                )
            body = message.body if message.body is not None else pa.py_buffer(b"")
            meta = message.metadata.to_pybytes()
            size, n = batch_sizes(meta, body)
            codecs.add(_batch_compression(meta))
            decoded += size
            largest = max(largest, size)
            rows += n
    except MalformedPayload:
        raise
    except (pa.ArrowException, OSError, ValueError, IndexError, struct.error) as exc:
        raise MalformedPayload(f"body is not a valid Arrow IPC stream: {exc}") from exc
    if first:
        raise MalformedPayload("body is not a valid Arrow IPC stream: it is empty")
    compression: BodyCompression = (
        "none" if not codecs else next(iter(codecs)) if len(codecs) == 1 else "mixed"
    )
    return StreamInfo(decoded, rows, source.tell(), largest, compression, schema_message)


def check_request(data: bytes | pa.Buffer, max_decoded_bytes: int) -> StreamInfo:
    """Refuse a client's body unless it is exactly one Arrow IPC stream of at most
    ``max_decoded_bytes`` once decompressed (read from its metadata: nothing is
    decompressed here).

    Raises:
        RequestTooLarge: more than ``max_decoded_bytes`` once decompressed.
        MalformedPayload: not one Arrow IPC stream.
    """
    info = inspect_stream(data)
    size = len(data) if isinstance(data, bytes) else data.size
    if info.stream_bytes < size:
        raise MalformedPayload(
            f"the body holds {size - info.stream_bytes} bytes after the end of its Arrow "
            "stream; send one stream per request"
        )
    if info.decoded_bytes > max_decoded_bytes:
        raise RequestTooLarge(
            f"the Arrow stream holds {info.decoded_bytes} bytes once decompressed; the "
            f"limit is {max_decoded_bytes}",
            limit=max_decoded_bytes,
            size=info.decoded_bytes,
        )
    return info


def decode_valid(data: bytes | pa.Buffer) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """The batches of a client's stream (after :func:`check_request`), each validated in
    full: offsets inside their buffers, valid UTF-8, struct children of the right length.
    Nothing malformed is ever stored, so nothing malformed is ever read back.

    Raises:
        MalformedPayload: naming the first invalid batch and what is wrong with it.
    """
    schema, batches = decode_stream(data)
    validate_batches(batches)
    return schema, batches


def validate_batches(batches: Sequence[pa.RecordBatch], first: int = 0) -> None:
    """Check record batches a client sent in full: offsets inside their buffers, valid
    UTF-8, struct children of the right length (``first``: the number of the first one,
    for the message).

    Raises:
        MalformedPayload: naming the first invalid batch and what is wrong with it.
    """
    for i, batch in enumerate(batches, first):
        try:
            batch.validate(full=True)
        except pa.ArrowException as exc:
            raise MalformedPayload(f"record batch {i} of the body is invalid: {exc}") from exc
