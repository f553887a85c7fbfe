"""The on-disk format of the disk hot tier: batch records, index entries, file names and
the low-level file helpers (see :mod:`gateway.hot.disk` for the layout)."""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gateway.hot.base import (
    ProducerSequence,
)

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "INDEX_ENTRY",
    "INDEX_ENTRY_SIZE",
    "INDEX_SUFFIX",
    "KEYED_HEADER_SIZE",
    "LOG_SUFFIX",
    "MAGIC",
    "MAGIC_KEYED",
    "STATE_FILE",
    "FsyncPolicy",
    "Head",
    "close_quietly",
    "decode_keys",
    "encode_keys",
    "encode_record",
    "fsync_dir",
    "pread_exact",
    "pwrite_all",
    "read_head",
    "read_keyed_record",
    "read_record",
    "segment_name",
]

FsyncPolicy = Literal["batch", "interval", "never"]

MAGIC = b"TGB\x01"
#: The magic of a record that carries its batch's keys (version 2 of the record format).
MAGIC_KEYED = b"TGB\x02"
#: magic, crc32, payload_len, base_offset, count, timestamp_us, flags, sequence, producer_len
HEADER = struct.Struct(">4sIIqIqBqH")
HEADER_SIZE = HEADER.size
#: Version 2 appends keys_len (u32: bytes of the key block between producer id and payload).
KEYS_LEN = struct.Struct(">I")
KEYED_HEADER_SIZE = HEADER_SIZE + KEYS_LEN.size
#: The CRC covers everything after the magic and the CRC field itself.
CRC_START = 8
FLAG_PRODUCER = 0x01
#: Set exactly on version 2 records: a key block (one ``u32 length, bytes`` per record).
FLAG_KEYS = 0x02
#: base_offset, position, payload_len
INDEX_ENTRY = struct.Struct(">qII")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size

U16_MAX = 2**16 - 1
U32_MAX = 2**32 - 1
I64_MAX = 2**63 - 1
#: Positions in the index are u32: no segment may grow past this.
MAX_SEGMENT_BYTES = U32_MAX

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
STATE_FILE = "state.json"
STATE_VERSION = 1
TMP_SUFFIX = ".tmp"

#: Batches remembered per (producer, partition) for de-duplication.
PRODUCER_WINDOW = 16


def segment_name(base_offset: int) -> str:
    """The file stem of the segment whose first batch starts at ``base_offset``."""
    return f"{base_offset:020d}"


# Low-level file helpers -------------------------------------------------------------------
def pread_exact(fd: int, size: int, pos: int) -> bytes | None:
    """``size`` bytes at ``pos``, or None when the file ends first."""
    if size == 0:
        return b""
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, min(size, 1 << 30), pos)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
        pos += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def pwrite_all(fd: int, data: bytes, pos: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, pos)
        view = view[written:]
        pos += written


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def close_quietly(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


# Records ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Head:
    """A parsed record header (its CRC not yet checked against the payload)."""

    crc: int
    payload_len: int
    base_offset: int
    count: int
    timestamp_us: int
    producer: ProducerSequence | None
    #: Header and producer id bytes after the CRC field: the start of the CRC input.
    crc_prefix: bytes
    #: Bytes of the key block (0 for a version 1 record, which carries no keys).
    keys_len: int = 0

    @property
    def size(self) -> int:
        """Bytes the whole record takes in the segment."""
        return CRC_START + len(self.crc_prefix) + self.keys_len + self.payload_len

    @property
    def keyed(self) -> bool:
        return self.keys_len > 0


def encode_keys(keys: list[bytes]) -> bytes:
    """A batch's key block: ``u32 length, bytes`` per record, in record order."""
    return b"".join(KEYS_LEN.pack(len(k)) + k for k in keys)


def decode_keys(block: bytes, count: int) -> list[bytes] | None:
    """The ``count`` keys of a key block; None when it does not hold exactly that."""
    keys: list[bytes] = []
    pos, size = 0, len(block)
    while pos < size:
        if pos + KEYS_LEN.size > size:
            return None
        (n,) = KEYS_LEN.unpack_from(block, pos)
        pos += KEYS_LEN.size
        if pos + n > size:
            return None
        keys.append(block[pos : pos + n])
        pos += n
    return keys if len(keys) == count else None


def encode_record(
    base_offset: int,
    count: int,
    timestamp_us: int,
    producer: ProducerSequence | None,
    payload: bytes,
    keys: list[bytes] | None = None,
) -> bytes:
    """A record: version 1 without ``keys``, version 2 (:data:`MAGIC_KEYED`, a key block
    before the payload) with them."""
    pid = producer.producer_id.encode() if producer is not None else b""
    flags = FLAG_PRODUCER if producer is not None else 0
    sequence = producer.sequence if producer is not None else -1
    magic, block = MAGIC, b""
    if keys is not None:
        magic, block, flags = MAGIC_KEYED, encode_keys(keys), flags | FLAG_KEYS
    head = HEADER.pack(
        magic, 0, len(payload), base_offset, count, timestamp_us, flags, sequence, len(pid)
    )
    if keys is not None:
        head += KEYS_LEN.pack(len(block))
    crc = zlib.crc32(pid, zlib.crc32(head[CRC_START:]))
    crc = zlib.crc32(payload, zlib.crc32(block, crc))
    return b"".join((magic, crc.to_bytes(4, "big"), head[CRC_START:], pid, block, payload))


def read_head(fd: int, pos: int) -> Head | None:
    """The header at ``pos`` (either version); None when it is cut short or not a record
    header."""
    raw = pread_exact(fd, HEADER_SIZE, pos)
    if raw is None:
        return None
    magic, crc, payload_len, base, count, ts, flags, seq, pid_len = HEADER.unpack(raw)
    keys_len, at = 0, pos + HEADER_SIZE
    if magic == MAGIC_KEYED:
        extra = pread_exact(fd, KEYS_LEN.size, at)
        if extra is None or not flags & FLAG_KEYS:
            return None
        (keys_len,) = KEYS_LEN.unpack(extra)
        raw += extra
        at += KEYS_LEN.size
    elif magic != MAGIC or flags & FLAG_KEYS:
        return None
    pid_raw = pread_exact(fd, pid_len, at)
    if pid_raw is None:
        return None
    producer: ProducerSequence | None = None
    if flags & FLAG_PRODUCER:
        try:
            producer = ProducerSequence(pid_raw.decode(), seq)
        except UnicodeDecodeError:
            return None
    return Head(crc, payload_len, base, count, ts, producer, raw[CRC_START:] + pid_raw, keys_len)


def _read_body(fd: int, pos: int, limit: int) -> tuple[Head, bytes] | None:
    """The header and body (key block and payload) of the record at ``pos`` if it ends by
    ``limit`` and its CRC matches."""
    head = read_head(fd, pos)
    if head is None or pos + head.size > limit:
        return None
    size = head.keys_len + head.payload_len
    body = pread_exact(fd, size, pos + head.size - size)
    if body is None or zlib.crc32(body, zlib.crc32(head.crc_prefix)) != head.crc:
        return None
    return head, body


def read_record(fd: int, pos: int, limit: int) -> tuple[Head, bytes] | None:
    """The whole record at ``pos`` (header and payload) if it ends by ``limit`` and its
    CRC matches."""
    got = _read_body(fd, pos, limit)
    if got is None:
        return None
    head, body = got
    return (head, body[head.keys_len :]) if head.keys_len else got


def read_keyed_record(fd: int, pos: int, limit: int) -> tuple[Head, list[bytes] | None] | None:
    """The header and the keys (None for a record without) of the record at ``pos`` if it
    ends by ``limit`` and its CRC matches; None otherwise, or when its key block does not
    hold one key per record."""
    got = _read_body(fd, pos, limit)
    if got is None:
        return None
    head, body = got
    if not head.keyed:
        return head, None
    keys = decode_keys(body[: head.keys_len], head.count)
    return None if keys is None else (head, keys)
