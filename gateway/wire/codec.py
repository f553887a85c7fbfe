"""Arrow IPC encoding of batches, for hot-tier payloads and for the wire."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import pyarrow as pa

from gateway.wire.errors import MalformedPayload

__all__ = ["decode_batch", "decode_stream", "encode_batch", "encode_stream"]

Compression = Literal["zstd", "lz4", "none"]


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


def encode_batch(batch: pa.RecordBatch, compression: Compression = "zstd") -> bytes:
    """One batch as a self-describing, compressed Arrow IPC stream (a hot-tier payload)."""
    return encode_stream([batch], batch.schema, compression)


def decode_stream(data: bytes | pa.Buffer) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Schema and batches of an Arrow IPC stream.

    Raises:
        MalformedPayload: the bytes are not a complete Arrow IPC stream.
    """
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data) if isinstance(data, bytes) else data)
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
