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
    "LOG_SUFFIX",
    "MAGIC",
    "STATE_FILE",
    "FsyncPolicy",
    "Head",
    "close_quietly",
    "encode_record",
    "fsync_dir",
    "pread_exact",
    "pwrite_all",
    "read_head",
    "read_record",
    "segment_name",
]

FsyncPolicy = Literal["batch", "interval", "never"]

MAGIC = b"TGB\x01"
#: magic, crc32, payload_len, base_offset, count, timestamp_us, flags, sequence, producer_len
HEADER = struct.Struct(">4sIIqIqBqH")
HEADER_SIZE = HEADER.size
#: The CRC covers everything after the magic and the CRC field itself.
CRC_START = 8
FLAG_PRODUCER = 0x01
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

    @property
    def size(self) -> int:
        """Bytes the whole record takes in the segment."""
        return CRC_START + len(self.crc_prefix) + self.payload_len


def encode_record(
    base_offset: int,
    count: int,
    timestamp_us: int,
    producer: ProducerSequence | None,
    payload: bytes,
) -> bytes:
    pid = producer.producer_id.encode() if producer is not None else b""
    flags = FLAG_PRODUCER if producer is not None else 0
    sequence = producer.sequence if producer is not None else -1
    head = HEADER.pack(
        MAGIC, 0, len(payload), base_offset, count, timestamp_us, flags, sequence, len(pid)
    )
    crc = zlib.crc32(payload, zlib.crc32(pid, zlib.crc32(head[CRC_START:])))
    return b"".join((MAGIC, crc.to_bytes(4, "big"), head[CRC_START:], pid, payload))


def read_head(fd: int, pos: int) -> Head | None:
    """The header at ``pos``; None when it is cut short or not a record header."""
    raw = pread_exact(fd, HEADER_SIZE, pos)
    if raw is None:
        return None
    magic, crc, payload_len, base, count, ts, flags, seq, pid_len = HEADER.unpack(raw)
    if magic != MAGIC:
        return None
    pid_raw = pread_exact(fd, pid_len, pos + HEADER_SIZE)
    if pid_raw is None:
        return None
    producer: ProducerSequence | None = None
    if flags & FLAG_PRODUCER:
        try:
            producer = ProducerSequence(pid_raw.decode(), seq)
        except UnicodeDecodeError:
            return None
    return Head(crc, payload_len, base, count, ts, producer, raw[CRC_START:] + pid_raw)


def read_record(fd: int, pos: int, limit: int) -> tuple[Head, bytes] | None:
    """The whole record at ``pos`` if it ends by ``limit`` and its CRC matches."""
    head = read_head(fd, pos)
    if head is None or pos + head.size > limit:
        return None
    payload = pread_exact(fd, head.payload_len, pos + head.size - head.payload_len)
    if payload is None or zlib.crc32(payload, zlib.crc32(head.crc_prefix)) != head.crc:
        return None
    return head, payload
