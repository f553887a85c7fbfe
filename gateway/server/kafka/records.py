"""Kafka record batches in and out, through aiokafka's record codecs (magic 2, CRC-32C,
gzip/snappy/lz4/zstd with cramjam), and a typed table's rows as Kafka records.

A record's value is one JSON object of the table's columns, decoded through the same
conversion as the HTTP edge's JSON appends (:func:`gateway.wire.jsonrows.rows_to_batch`),
so a value any edge takes is taken here and refused with the same sentence. Read back,
a row is its JSON object again (:func:`gateway.wire.jsonrows.batch_to_rows`), its key
the JSON of the table's key columns, its timestamp the row's ``_timestamp``.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import cramjam
import orjson
import pyarrow as pa
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from gateway.wire.errors import MalformedPayload, RequestTooLarge, SchemaMismatch, TidegateError
from gateway.wire.jsonrows import batch_to_rows, rows_to_batch
from gateway.wire.schema import OFFSET_COLUMN, SYSTEM_COLUMNS, TIMESTAMP_COLUMN

__all__ = [
    "RAW_FIELDS",
    "ProducedBatch",
    "decode_produce",
    "encode_fetch",
    "is_raw",
    "raw_rows",
    "rows_from_values",
]

#: The schema of a table created over Kafka (CreateTopics): each record as it came, its
#: key, value and headers as bytes and the producer's own timestamp.
RAW_FIELDS = {
    "key": "binary",
    "value": "binary",
    "headers": "list<struct<key: string, value: binary>>",
    "timestamp": "timestamp[us, tz=UTC]",
}
_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_RAW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", _HEADER_TYPE),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


def is_raw(schema: pa.Schema) -> bool:
    """Whether a table holds records as they came (:data:`RAW_FIELDS`)."""
    return schema.names == _RAW_SCHEMA.names and all(
        f.type.equals(r.type) for f, r in zip(schema, _RAW_SCHEMA, strict=True)
    )


#: Longest message of a refused record in a Produce answer.
_MESSAGE_CHARS = 400


@dataclass(slots=True)
class ProducedBatch:
    """What one partition's ``records`` of a Produce request hold."""

    values: list[bytes | None] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    headers: list[list[tuple[str, bytes | None]]] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    transactional: bool = False
    #: Record batches in the partition's record set.
    batches: int = 0


#: Bytes of a record batch's header (magic 2) before its records.
_BATCH_HEADER = 61
#: What a record batch may expand to, checked before aiokafka decompresses it.
_CODECS = {1: cramjam.gzip, 3: cramjam.lz4, 4: cramjam.zstd}


def _inflated_at_most(codec: int, payload: memoryview, limit: int) -> int:
    """The decompressed size of a batch's records, found without holding more than
    ``limit`` bytes of them (a small batch of very compressible bytes is refused before
    it is expanded).

    Raises:
        RequestTooLarge: it expands past ``limit``.
        MalformedPayload: not data of its codec.
    """
    if codec == 2:  # snappy: each block says its length before its data
        blocks: list[memoryview] = [payload]
        if bytes(payload[:8]) == b"\x82SNAPPY\x00":  # xerial's framing (the Java client's)
            blocks, at = [], 16
            while at + 4 <= len(payload):
                (size,) = struct.unpack_from(">i", payload, at)
                blocks.append(payload[at + 4 : at + 4 + max(0, size)])
                at += 4 + max(0, size)
        try:
            total = sum(int(cramjam.snappy.decompress_raw_len(b)) for b in blocks)
        except cramjam.DecompressionError as exc:
            raise MalformedPayload(f"a snappy record batch cannot be read: {exc}") from None
    else:
        # Decompressed into a bounded mapping: pages are taken only as they are written.
        with mmap.mmap(-1, limit + 1) as room:
            try:
                total = int(_CODECS[codec].decompress_into(payload, room))
            except cramjam.DecompressionError as exc:
                if "whole buffer" not in str(exc):
                    raise MalformedPayload(f"a record batch cannot be read: {exc}") from None
                total = limit + 1
    if total > limit:
        raise RequestTooLarge(
            f"a record batch expands to more than {limit} bytes; the limit is {limit}",
            limit=limit,
        )
    return total


def decode_produce(data: bytes | None, limit: int) -> ProducedBatch:
    """The records of one partition of a Produce request, each batch's CRC checked and
    decompressed by aiokafka once it is known to expand to at most ``limit`` bytes (all
    the batches together).

    Raises:
        MalformedPayload: not whole record batches of magic 2 with a valid CRC, or a
            compression the gateway cannot read.
        RequestTooLarge: the batches expand past ``limit``.
    """
    out = ProducedBatch()
    if not data:
        raise MalformedPayload("the partition's record set is empty")
    view = memoryview(data)
    records = MemoryRecords(bytes(data))
    first, at = True, 0
    while True:
        try:
            batch = records.next_batch()
        except Exception as exc:
            raise MalformedPayload(f"the record set cannot be read: {exc}") from None
        if batch is None:
            break
        if not isinstance(batch, DefaultRecordBatch):
            raise MalformedPayload(
                "a record batch of magic 0 or 1 (before Kafka 0.11) is not accepted; "
                "use a client that sends magic 2"
            )
        if not batch.validate_crc():
            raise MalformedPayload("a record batch fails its CRC-32C check")
        (length,) = struct.unpack_from(">i", view, at + 8)
        end = at + 12 + length
        codec = batch.compression_type
        if codec in (1, 2, 3, 4):
            limit -= _inflated_at_most(codec, view[at + _BATCH_HEADER : end], limit)
        elif codec != 0:
            raise MalformedPayload(f"record batch compression {codec} is not one Kafka knows")
        elif end - at > limit:
            raise RequestTooLarge(
                f"the record batches carry more than {limit} bytes; the limit is {limit}",
                limit=limit,
            )
        else:
            limit -= end - at
        at = end
        out.batches += 1
        if first:
            out.producer_id = batch.producer_id
            out.producer_epoch = batch.producer_epoch
            out.base_sequence = batch.base_sequence
            out.transactional = batch.is_transactional
            first = False
        try:
            for record in batch:
                out.values.append(record.value)
                out.keys.append(record.key)
                out.headers.append(record.headers)
                out.timestamps.append(record.timestamp)
        except Exception as exc:  # a codec's or a record's own error
            raise MalformedPayload(f"a record batch cannot be read: {exc}") from None
    if first:
        raise MalformedPayload("the partition's record set holds no whole record batch")
    return out


def _loads(value: bytes) -> Any:
    """A record's JSON value, parsed by orjson (some 10x faster than the standard library,
    whose per-record cost was half a busy listener's time); what orjson refuses (NaN, a
    lone surrogate, UTF-16 text) or would read otherwise (an integer past 64 bits, which it
    makes a float) is parsed by the standard library, so a value is taken or refused
    exactly as the HTTP edge's JSON is."""
    if _LONG_DIGITS.search(value) is None:
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            pass
    return json.loads(value)


#: A run of digits that may be an integer orjson reads as a float (past 64 bits): such a
#: value is read by the standard library, which keeps every integer whole.
_LONG_DIGITS = re.compile(rb"\d{19}")


def _refusal(err: TidegateError) -> str:
    return err.message[:_MESSAGE_CHARS]


def rows_from_values(
    values: Sequence[bytes | None], schema: pa.Schema, omittable: Collection[str]
) -> tuple[pa.RecordBatch | None, list[tuple[int, str]]]:
    """Record values (JSON objects) as one batch of the table's ``schema``, or None and
    the refused records: (index in the batch, one sentence) for each."""
    rows: list[object] = []
    refused: list[tuple[int, str]] = []
    for i, value in enumerate(values):
        if value is None:
            refused.append((i, f"record {i} has no value; send a JSON object of the columns"))
            continue
        try:
            row = _loads(value)
        except (UnicodeDecodeError, ValueError, RecursionError):
            refused.append((i, f"record {i}'s value is not JSON; send a JSON object"))
            continue
        if not isinstance(row, dict):
            refused.append((i, f"record {i}'s value is not a JSON object of the columns"))
            continue
        rows.append(row)
    if not refused:
        try:
            return rows_to_batch(rows, schema, unit="record", omittable=omittable), []
        except (SchemaMismatch, MalformedPayload):
            pass  # found record by record below
    for i, row in enumerate(rows):
        if any(at == i for at, _ in refused):
            continue
        try:
            rows_to_batch([row], schema, first=i, unit="record", omittable=omittable)
        except (SchemaMismatch, MalformedPayload) as err:
            refused.append((i, _refusal(err)))
    refused.sort()
    return None, refused or [(0, "the records do not match the table's columns")]


def raw_rows(produced: ProducedBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Records as they came, as one batch of a raw table (:data:`RAW_FIELDS`)."""
    headers = [[{"key": k, "value": v} for k, v in h] for h in produced.headers]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(produced.keys, pa.binary()),
            pa.array(produced.values, pa.binary()),
            pa.array(headers, _HEADER_TYPE),
            pa.array([t * 1000 for t in produced.timestamps], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
        ],
        schema=schema,
    )


def _raw_records(b: pa.RecordBatch) -> Iterator[tuple[bytes | None, bytes | None, list[Any], int]]:
    stamps = b.column("timestamp").cast(pa.int64()).to_pylist()
    keys, values = b.column("key").to_pylist(), b.column("value").to_pylist()
    headers = b.column("headers").to_pylist()
    for key, value, hs, stamp in zip(keys, values, headers, stamps, strict=True):
        yield key, value, [(h["key"], h["value"]) for h in hs or []], stamp // 1000


def _json_records(
    b: pa.RecordBatch, key_columns: Sequence[str]
) -> Iterator[tuple[bytes | None, bytes | None, list[Any], int]]:
    stamps = b.column(TIMESTAMP_COLUMN).cast(pa.int64()).to_pylist()
    user = b.select([n for n in b.schema.names if n not in SYSTEM_COLUMNS])
    # orjson writes the JSON the standard library's compact dumps would (UTF-8 text where
    # that escapes non-ASCII), in a tenth of its time: the rows are JSON-ready already.
    for stamp, row in zip(stamps, batch_to_rows([user]), strict=True):
        key = orjson.dumps({k: row[k] for k in key_columns}) if key_columns else None
        yield key, orjson.dumps(row), [], stamp // 1000


def encode_fetch(
    batches: Sequence[pa.RecordBatch], key_columns: Sequence[str], raw: bool = False
) -> tuple[bytes, int]:
    """Rows read from a table as one Kafka record batch (uncompressed), and its record
    count: value = the row's columns as a JSON object, key = the key columns' JSON
    (None without key columns), timestamp = ``_timestamp``; a raw table's records as they
    came, with their own timestamps. Offsets are ``_offset``."""
    rows = 0
    builder: DefaultRecordBatchBuilder | None = None
    base = 0
    for b in batches:
        if b.num_rows == 0:
            continue
        offsets = b.column(OFFSET_COLUMN).to_pylist()
        records = _raw_records(b) if raw else _json_records(b, key_columns)
        if builder is None:
            builder = DefaultRecordBatchBuilder(
                magic=2,
                compression_type=0,
                is_transactional=0,
                producer_id=-1,
                producer_epoch=-1,
                base_sequence=-1,
                batch_size=1 << 62,
            )
            base = offsets[0]
        for offset, (key, value, headers, stamp) in zip(offsets, records, strict=True):
            builder.append(offset - base, stamp, key, value, headers)
            rows += 1
    if builder is None:
        return b"", 0
    data = builder.build()
    struct.pack_into(">q", data, 0, base)  # the batch's base offset (outside its CRC)
    return bytes(data), rows
