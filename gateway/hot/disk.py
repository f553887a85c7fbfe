"""The local-disk hot tier: per-partition segment files with an offset index.

Layout, per partition (``<path>`` is :attr:`PartitionId.path`)::

    <hot_path>/<path>/
        00000000000000000000.log     segment: batch records, append only
        00000000000000000000.index   its offset index
        00000000000000004096.log     the next segment, named by its first offset
        00000000000000004096.index
        state.json                   low mark, high watermark, producer state snapshot

Record format (big endian), one per appended batch::

    magic         4s   b"TGB\\x01"
    crc32         u32  zlib.crc32 of every byte after this field (rest of header,
                       producer id and payload)
    payload_len   u32
    base_offset   i64
    count         u32
    timestamp_us  i64
    flags         u8   bit 0: the batch carries a producer identity
    sequence      i64  producer sequence (-1 without a producer)
    producer_len  u16  length of the UTF-8 producer id that follows
    producer_id   producer_len bytes
    payload       payload_len bytes

Index format: fixed 16-byte entries ``(base_offset i64, position u32, payload_len u32)``, one
per batch, in offset order. Positions are 32-bit, so a segment never grows past 4 GiB. The
index is a cache of the log: it is written after the record and never fsynced; recovery
checks it against the log and rebuilds whatever it misses.

``state.json`` is written atomically (temporary file, fsync, rename) when a partition is
opened, when a segment rolls, on every trim (before any segment is deleted) and on close.
It holds the logical low mark, the high watermark at the time of writing and the producer
windows of every batch below that watermark. Recovery replays the headers of later batches
on top of it, so producer state survives both a restart and the trimming of the segments
that held it.

Trimming is logical per batch (the low mark moves to the first batch that ends above the
trim offset, exactly as the contract says) and physical per segment (files whose every batch
lies below the low mark are deleted). When everything is trimmed, the active segment is
rolled first, so an empty segment named by the high watermark keeps it on disk.

Concurrency and durability: each partition has its own lock, taken for appends (write and
index update only), reads, trims and recovery, and a second *sync* lock that serialises
fsyncs. Under ``fsync="batch"`` an append writes under the lock, then fsyncs outside it
(group commit: one fsync covers every batch written before it started) and returns once
its batch is durable; readers see only durable batches, so nothing that could vanish in a
power cut is ever served. ``"interval"`` fsyncs from one background thread every
``fsync_interval_ms``; ``"never"`` leaves it to the OS. A failed fsync poisons the partition
(later appends raise :class:`Unavailable`) because the kernel may have dropped the dirty
pages: the next process start recovers from what is really on disk.

Recovery (on the first use of a partition): for every segment, load the index, keep the
longest prefix of plausible entries, verify the last one against the log (header, CRC,
base offset), scan the log onward from there and truncate the log and the index at the
first torn or CRC-bad record. Segments after a gap are removed (an offset range must stay
dense). A batch whose write did not complete therefore disappears whole.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import os
import shutil
import struct
import threading
import zlib
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gateway.config import DiskHotConfig, Settings
from gateway.hot.base import (
    AppendResult,
    HotLog,
    LogOffsets,
    PartitionId,
    ProducerSequence,
    StoredBatch,
)
from gateway.wire.errors import (
    InvalidIdempotentAppend,
    OffsetOutOfRange,
    OutOfOrderSequence,
    TidegateError,
    Unavailable,
)

__all__ = ["DiskHotLog", "FsyncPolicy"]

log = logging.getLogger(__name__)

FsyncPolicy = Literal["batch", "interval", "never"]

MAGIC = b"TGB\x01"
#: magic, crc32, payload_len, base_offset, count, timestamp_us, flags, sequence, producer_len
_HEADER = struct.Struct(">4sIIqIqBqH")
HEADER_SIZE = _HEADER.size
#: The CRC covers everything after the magic and the CRC field itself.
_CRC_START = 8
_FLAG_PRODUCER = 0x01
#: base_offset, position, payload_len
_INDEX_ENTRY = struct.Struct(">qII")
INDEX_ENTRY_SIZE = _INDEX_ENTRY.size

_U16_MAX = 2**16 - 1
_U32_MAX = 2**32 - 1
_I64_MAX = 2**63 - 1
#: Positions in the index are u32: no segment may grow past this.
_MAX_SEGMENT_BYTES = _U32_MAX

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
STATE_FILE = "state.json"
_STATE_VERSION = 1
_TMP_SUFFIX = ".tmp"

#: Batches remembered per (producer, partition) for de-duplication.
PRODUCER_WINDOW = 16


def segment_name(base_offset: int) -> str:
    """The file stem of the segment whose first batch starts at ``base_offset``."""
    return f"{base_offset:020d}"


# Low-level file helpers -------------------------------------------------------------------
def _pread_exact(fd: int, size: int, pos: int) -> bytes | None:
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


def _pwrite_all(fd: int, data: bytes, pos: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, pos)
        view = view[written:]
        pos += written


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _close_quietly(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


# Records ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Head:
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
        return _CRC_START + len(self.crc_prefix) + self.payload_len


def _encode_record(
    base_offset: int,
    count: int,
    timestamp_us: int,
    producer: ProducerSequence | None,
    payload: bytes,
) -> bytes:
    pid = producer.producer_id.encode() if producer is not None else b""
    flags = _FLAG_PRODUCER if producer is not None else 0
    sequence = producer.sequence if producer is not None else -1
    head = _HEADER.pack(
        MAGIC, 0, len(payload), base_offset, count, timestamp_us, flags, sequence, len(pid)
    )
    crc = zlib.crc32(payload, zlib.crc32(pid, zlib.crc32(head[_CRC_START:])))
    return b"".join((MAGIC, crc.to_bytes(4, "big"), head[_CRC_START:], pid, payload))


def _read_head(fd: int, pos: int) -> _Head | None:
    """The header at ``pos``; None when it is cut short or not a record header."""
    raw = _pread_exact(fd, HEADER_SIZE, pos)
    if raw is None:
        return None
    magic, crc, payload_len, base, count, ts, flags, seq, pid_len = _HEADER.unpack(raw)
    if magic != MAGIC:
        return None
    pid_raw = _pread_exact(fd, pid_len, pos + HEADER_SIZE)
    if pid_raw is None:
        return None
    producer: ProducerSequence | None = None
    if flags & _FLAG_PRODUCER:
        try:
            producer = ProducerSequence(pid_raw.decode(), seq)
        except UnicodeDecodeError:
            return None
    return _Head(crc, payload_len, base, count, ts, producer, raw[_CRC_START:] + pid_raw)


def _read_record(fd: int, pos: int, limit: int) -> tuple[_Head, bytes] | None:
    """The whole record at ``pos`` if it ends by ``limit`` and its CRC matches."""
    head = _read_head(fd, pos)
    if head is None or pos + head.size > limit:
        return None
    payload = _pread_exact(fd, head.payload_len, pos + head.size - head.payload_len)
    if payload is None or zlib.crc32(payload, zlib.crc32(head.crc_prefix)) != head.crc:
        return None
    return head, payload


# Segments ---------------------------------------------------------------------------------
class _Segment:
    """One segment: its files, the in-memory copy of its index and its end offset."""

    __slots__ = (
        "base",
        "end",
        "index_fd",
        "log_fd",
        "log_path",
        "offsets",
        "payload_lens",
        "positions",
        "size",
    )

    def __init__(self, directory: Path, base: int, log_fd: int, index_fd: int | None) -> None:
        self.base = base
        self.log_path = directory / f"{segment_name(base)}{LOG_SUFFIX}"
        self.log_fd = log_fd
        #: Open only while the segment is the active one.
        self.index_fd = index_fd
        self.size = 0
        #: Next offset after the segment's last batch (``base`` when empty).
        self.end = base
        self.offsets: array[int] = array("q")
        self.positions: array[int] = array("q")
        self.payload_lens: array[int] = array("q")

    @property
    def index_path(self) -> Path:
        return self.log_path.with_suffix(INDEX_SUFFIX)

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, base_offset: int, position: int, payload_len: int) -> None:
        self.offsets.append(base_offset)
        self.positions.append(position)
        self.payload_lens.append(payload_len)

    def truncate_entries(self, n: int) -> None:
        del self.offsets[n:]
        del self.positions[n:]
        del self.payload_lens[n:]

    def index_bytes(self) -> bytes:
        return b"".join(
            _INDEX_ENTRY.pack(o, p, n)
            for o, p, n in zip(self.offsets, self.positions, self.payload_lens, strict=True)
        )

    def record_end(self, i: int) -> int:
        """File position just past batch ``i``."""
        return self.positions[i + 1] if i + 1 < len(self.offsets) else self.size

    def close(self) -> None:
        """Release both files; safe to call twice (a closed fd number may be reused)."""
        if self.log_fd >= 0:
            _close_quietly(self.log_fd)
            self.log_fd = -1
        _close_quietly(self.index_fd)
        self.index_fd = None

    def seal(self) -> None:
        """Stop being the active segment: its index is complete and stays in memory."""
        _close_quietly(self.index_fd)
        self.index_fd = None

    @classmethod
    def create(cls, directory: Path, base: int) -> _Segment:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
        path = directory / f"{segment_name(base)}{LOG_SUFFIX}"
        log_fd = os.open(path, flags, 0o644)
        try:
            index_fd = os.open(path.with_suffix(INDEX_SUFFIX), flags, 0o644)
        except BaseException:
            os.close(log_fd)
            raise
        return cls(directory, base, log_fd, index_fd)

    @classmethod
    def recover(cls, directory: Path, base: int) -> _Segment:
        """Open an existing segment, check its index against the log and cut a bad tail."""
        path = directory / f"{segment_name(base)}{LOG_SUFFIX}"
        seg = cls(directory, base, os.open(path, os.O_RDWR), None)
        try:
            seg._recover()
        except BaseException:
            seg.close()
            raise
        return seg

    def _recover(self) -> None:
        file_size = os.fstat(self.log_fd).st_size
        try:
            raw_index = self.index_path.read_bytes()
        except FileNotFoundError:
            raw_index = b""
        # 1. The longest prefix of index entries that is plausible on its face.
        usable = len(raw_index) - len(raw_index) % INDEX_ENTRY_SIZE
        for off, pos, payload_len in _INDEX_ENTRY.iter_unpack(raw_index[:usable]):
            if len(self.offsets) == 0:
                plausible = off == self.base and pos == 0
            else:
                plausible = off > self.offsets[-1] and pos > self.positions[-1]
            if not plausible or pos + HEADER_SIZE + payload_len > file_size:
                break
            self.add(off, pos, payload_len)
        # 2. Trust it only up to an entry that matches a whole, CRC-clean record.
        while len(self.offsets) > 0:
            i = len(self.offsets) - 1
            got = _read_record(self.log_fd, self.positions[i], file_size)
            if (
                got is not None
                and got[0].base_offset == self.offsets[i]
                and got[0].payload_len == self.payload_lens[i]
            ):
                break
            self.truncate_entries(i)
        # 3. Scan the log from the last trusted entry (re-reading it to learn its count).
        position, expected = 0, self.base
        if len(self.offsets) > 0:
            position, expected = self.positions[-1], self.offsets[-1]
            self.truncate_entries(len(self.offsets) - 1)
        while position < file_size:
            got = _read_record(self.log_fd, position, file_size)
            if got is None or got[0].base_offset != expected or got[0].count < 1:
                break
            head = got[0]
            self.add(head.base_offset, position, head.payload_len)
            position += head.size
            expected += head.count
        self.size = position
        self.end = expected
        if position < file_size:
            log.warning(
                "hot log segment %s: cutting %d bytes of torn or corrupt tail at position %d",
                self.log_path,
                file_size - position,
                position,
            )
            os.ftruncate(self.log_fd, position)
        # 4. Make the index file say exactly what memory says.
        index = self.index_bytes()
        if index != raw_index:
            index_fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                _pwrite_all(index_fd, index, 0)
                os.ftruncate(index_fd, len(index))
            finally:
                os.close(index_fd)


# Producer state ---------------------------------------------------------------------------
#: (sequence, base_offset, count), oldest first.
_Window = deque[tuple[int, int, int]]


def _new_window() -> _Window:
    return deque(maxlen=PRODUCER_WINDOW)


@dataclass(frozen=True, slots=True)
class _State:
    """The content of ``state.json``: producer windows cover every batch below ``high``."""

    low: int
    high: int
    producers: dict[str, list[tuple[int, int, int]]]

    def to_json(self) -> bytes:
        doc = {
            "version": _STATE_VERSION,
            "low": self.low,
            "high": self.high,
            "producers": {pid: [list(e) for e in w] for pid, w in self.producers.items()},
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> _State:
        """Parse and validate; raises ValueError on anything unexpected."""
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("version") != _STATE_VERSION:
            raise ValueError("unsupported state version")
        low, high, producers = doc.get("low"), doc.get("high"), doc.get("producers")
        if not isinstance(low, int) or not isinstance(high, int) or not 0 <= low <= high:
            raise ValueError("low and high must be integers with 0 <= low <= high")
        if not isinstance(producers, dict):
            raise ValueError("producers must be an object")
        windows: dict[str, list[tuple[int, int, int]]] = {}
        for pid, entries in producers.items():
            if not isinstance(entries, list):
                raise ValueError(f"bad window for producer {pid!r}")
            window: list[tuple[int, int, int]] = []
            for entry in entries:
                if not (
                    isinstance(entry, list)
                    and len(entry) == 3
                    and all(isinstance(v, int) for v in entry)
                ):
                    raise ValueError(f"bad window entry {entry!r} for producer {pid!r}")
                window.append((entry[0], entry[1], entry[2]))
            windows[pid] = window
        return cls(low, high, windows)


# Partitions -------------------------------------------------------------------------------
class _Partition:
    """The open log of one partition. Every method expects ``lock`` to be held."""

    def __init__(self, directory: Path, owner: DiskHotLog) -> None:
        self.directory = directory
        self.policy: FsyncPolicy = owner.fsync_policy
        self.segment_limit = min(owner.segment_bytes, _MAX_SEGMENT_BYTES)
        #: Guards everything below; held for appends' writes, reads, trims, recovery.
        self.lock = threading.Lock()
        #: Serialises fsyncs; taken *before* ``lock`` by whoever also needs it.
        self.sync_lock = threading.Lock()
        self.loaded = False
        #: Set when the partition was dropped or the log closed: re-resolve it.
        self.retired = False
        self.failed: BaseException | None = None
        self.segments: list[_Segment] = []
        self.bases: list[int] = []
        self.low = 0
        #: Next offset to assign (everything below is written, not necessarily durable).
        self.end = 0
        #: Everything below is fsynced.
        self.durable = 0
        self.payload_bytes = 0
        self.unsynced: set[_Segment] = set()
        self.producers: dict[str, _Window] = {}

    # Views ----------------------------------------------------------------------------
    @property
    def high(self) -> int:
        """The high watermark readers see: only durable batches under ``fsync="batch"``."""
        return self.durable if self.policy == "batch" else self.end

    @property
    def active(self) -> _Segment:
        return self.segments[-1]

    def locate(self, offset: int) -> tuple[int, int]:
        """(segment index, batch index) of the batch holding ``offset`` (low <= it < end)."""
        si = bisect.bisect_right(self.bases, offset) - 1
        seg = self.segments[si]
        return si, bisect.bisect_right(seg.offsets, offset) - 1

    def check_usable(self) -> None:
        if self.failed is not None:
            raise Unavailable(
                f"hot log partition {self.directory} failed to fsync ({self.failed}); "
                "it serves again after a restart",
                backend="disk",
            )

    # Recovery -------------------------------------------------------------------------
    def load(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        state = self._read_state()
        bases: list[int] = []
        for entry in os.scandir(self.directory):
            name = entry.name
            if name.endswith(_TMP_SUFFIX):
                os.unlink(entry.path)
            elif name.endswith(LOG_SUFFIX) and _is_segment_stem(name[: -len(LOG_SUFFIX)]):
                bases.append(int(name[: -len(LOG_SUFFIX)]))
        bases.sort()
        known = {segment_name(b) for b in bases}
        for entry in os.scandir(self.directory):
            if entry.name.endswith(INDEX_SUFFIX) and entry.name[: -len(INDEX_SUFFIX)] not in known:
                os.unlink(entry.path)
        try:
            self._load_segments(bases, state)
        except BaseException:
            for seg in self.segments:
                seg.close()
            self.segments.clear()
            raise
        self.loaded = True

    def _load_segments(self, bases: list[int], state: _State | None) -> None:
        state_low = state.low if state else 0
        state_high = state.high if state else 0
        for i, base in enumerate(bases):
            if self.segments and base != self.segments[-1].end:
                # A gap (a torn tail before a later segment): what follows cannot be served.
                log.warning("hot log %s: removing segments from %d on (gap)", self.directory, base)
                for later in bases[i:]:
                    self._unlink_segment_files(later)
                break
            self.segments.append(_Segment.recover(self.directory, base))
        if not self.segments:
            self.segments.append(_Segment.create(self.directory, max(state_low, state_high)))
            self._fsync_dir()
        else:
            last = self.segments[-1]
            last.index_fd = os.open(last.index_path, os.O_RDWR)
        self.bases = [s.base for s in self.segments]
        self.end = self.active.end
        if self.policy != "never":
            for seg in self.segments:
                os.fsync(seg.log_fd)
        self.durable = self.end

        # The low mark: the state's, but never before the first batch or past the end, and
        # always on a batch boundary.
        low = min(max(state_low, self.segments[0].base), self.end)
        if low < self.end:
            si, bi = self.locate(low)
            low = self.segments[si].offsets[bi]
        self.low = low

        # Producer windows: the snapshot, minus batches lost since, plus batches after it.
        replay_from = state_high if state else self.segments[0].base
        if state:
            for pid, entries in state.producers.items():
                window = _new_window()
                window.extend(e for e in entries if e[1] < self.end)
                if window:
                    self.producers[pid] = window
        for seg in self.segments:
            if seg.end <= replay_from:
                continue
            for off, pos in zip(seg.offsets, seg.positions, strict=True):
                if off < replay_from:
                    continue
                head = _read_head(seg.log_fd, pos)
                if head is None:  # verified while recovering; the disk changed under us
                    raise TidegateError(f"hot log {seg.log_path}: unreadable header at {pos}")
                if head.producer is not None:
                    self._remember(head.producer, head.base_offset, head.count)

        self.payload_bytes = sum(
            n
            for seg in self.segments
            for off, n in zip(seg.offsets, seg.payload_lens, strict=True)
            if off >= self.low
        )
        self._delete_segments_below_low()
        if state is None or state_low != self.low or state_high > self.end:
            self.write_state()

    def _read_state(self) -> _State | None:
        try:
            raw = (self.directory / STATE_FILE).read_bytes()
        except FileNotFoundError:
            return None
        try:
            return _State.from_json(raw)
        except ValueError as exc:
            # Only a power cut under fsync="never" can leave this; the record headers still
            # hold the producer state of every batch not yet trimmed.
            log.warning("hot log %s: ignoring unreadable %s (%s)", self.directory, STATE_FILE, exc)
            return None

    def write_state(self) -> None:
        """Atomically persist the low mark, high watermark and producer windows."""
        state = _State(self.low, self.end, {p: list(w) for p, w in self.producers.items()})
        path = self.directory / STATE_FILE
        tmp = path.with_name(STATE_FILE + _TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _pwrite_all(fd, state.to_json(), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        if self.policy != "never":
            _fsync_dir(self.directory)

    def _unlink_segment_files(self, base: int) -> None:
        stem = self.directory / segment_name(base)
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stem.with_suffix(suffix))

    def _delete_segments_below_low(self) -> None:
        """Delete sealed segments whose every batch lies below the low mark."""
        while len(self.segments) > 1 and self.segments[1].base <= self.low:
            seg = self.segments.pop(0)
            self.bases.pop(0)
            self.unsynced.discard(seg)
            seg.close()
            self._unlink_segment_files(seg.base)

    # Idempotence ----------------------------------------------------------------------
    def check_producer(self, producer: ProducerSequence, count: int) -> AppendResult | None:
        """The original result for a retry, None for a new batch; raises on a bad one."""
        window = self.producers.get(producer.producer_id)
        if not window:
            return None
        pid, seq = producer.producer_id, producer.sequence
        last = window[-1][0]
        if seq == last + 1:
            return None
        if seq > last + 1:
            raise OutOfOrderSequence(
                f"producer {pid!r} sent sequence {seq} to {self.directory.name!r}, "
                f"expected {last + 1}: resend the missing batches first",
                producer_id=pid,
                sequence=seq,
                expected_sequence=last + 1,
            )
        for s, base, stored_count in window:
            if s == seq:
                if stored_count != count:
                    raise InvalidIdempotentAppend(
                        f"producer {pid!r} resent sequence {seq} with {count} records, "
                        f"but the stored batch holds {stored_count}",
                        producer_id=pid,
                        sequence=seq,
                    )
                return AppendResult(base_offset=base, count=stored_count, duplicate=True)
        raise InvalidIdempotentAppend(
            f"producer {pid!r} sent sequence {seq}, older than its de-duplication window "
            f"[{window[0][0]}, {last}]",
            producer_id=pid,
            sequence=seq,
        )

    def _remember(self, producer: ProducerSequence, base: int, count: int) -> None:
        window = self.producers.get(producer.producer_id)
        if window is None:
            window = self.producers[producer.producer_id] = _new_window()
        window.append((producer.sequence, base, count))

    # Writes ---------------------------------------------------------------------------
    def append(
        self,
        payload: bytes,
        count: int,
        timestamp_us: int,
        producer: ProducerSequence | None,
    ) -> AppendResult:
        base = self.end
        record = _encode_record(base, count, timestamp_us, producer, payload)
        if self.active.size > 0 and self.active.size + len(record) > self.segment_limit:
            self._roll()
            self.write_state()
        seg = self.active
        position, n = seg.size, len(seg)
        assert seg.index_fd is not None
        try:
            _pwrite_all(seg.log_fd, record, position)
            entry = _INDEX_ENTRY.pack(base, position, len(payload))
            _pwrite_all(seg.index_fd, entry, n * INDEX_ENTRY_SIZE)
        except OSError as exc:
            # Leave no partial record behind for the next append to be written after.
            for fd, size in ((seg.log_fd, position), (seg.index_fd, n * INDEX_ENTRY_SIZE)):
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
            raise Unavailable(f"cannot write to {seg.log_path}: {exc}", backend="disk") from exc
        seg.add(base, position, len(payload))
        seg.size += len(record)
        seg.end = self.end = base + count
        self.payload_bytes += len(payload)
        self.unsynced.add(seg)
        if producer is not None:
            self._remember(producer, base, count)
        return AppendResult(base_offset=base, count=count)

    def _roll(self) -> None:
        """Start a new, empty active segment at the end of the log."""
        seg = _Segment.create(self.directory, self.end)
        self._fsync_dir()
        self.active.seal()
        self.segments.append(seg)
        self.bases.append(seg.base)

    def trim(self, below_offset: int) -> int:
        high = self.high
        if below_offset <= self.low or self.low == high:
            return self.low
        if below_offset >= high:
            new_low = high
        else:
            si, bi = self.locate(below_offset)
            new_low = self.segments[si].offsets[bi]
        if new_low <= self.low:
            return self.low
        freed = 0
        for seg in self.segments:
            if seg.base >= new_low:
                break
            for off, n in zip(seg.offsets, seg.payload_lens, strict=True):
                if self.low <= off < new_low:
                    freed += n
        self.low = new_low
        self.payload_bytes -= freed
        if new_low == self.end and len(self.active) > 0:
            self._roll()  # so the high watermark outlives the last batch's segment
        self.write_state()  # before deleting anything the producer windows may refer to
        self._delete_segments_below_low()
        return self.low

    def read(self, from_offset: int, max_records: int, max_bytes: int) -> list[StoredBatch]:
        high = self.high
        if from_offset < self.low or from_offset > high:
            raise _out_of_range(self.directory, from_offset, self.low, high)
        out: list[StoredBatch] = []
        if from_offset == high:
            return out
        si, bi = self.locate(from_offset)
        seg = self.segments[si]
        records = size = 0
        while True:
            position = seg.positions[bi]
            got = _read_record(seg.log_fd, position, seg.record_end(bi))
            if got is None or got[0].base_offset != seg.offsets[bi]:
                raise TidegateError(
                    f"hot log segment {seg.log_path} is corrupt at position {position}"
                )
            head, payload = got
            batch = StoredBatch(head.base_offset, head.count, head.timestamp_us, payload)
            out.append(batch)
            records += batch.next_offset - max(from_offset, batch.base_offset)
            size += len(payload)
            if batch.next_offset >= high or records >= max_records or size >= max_bytes:
                return out
            bi += 1
            if bi == len(seg):
                si, bi = si + 1, 0
                seg = self.segments[si]

    # Durability -----------------------------------------------------------------------
    def sync_to(self, target: int) -> None:
        """Return once every batch below ``target`` is fsynced (group commit).

        Called without ``lock``; takes ``sync_lock`` then ``lock`` briefly, and fsyncs
        holding only ``sync_lock`` so appends to the partition go on meanwhile.
        """
        with self.sync_lock:
            with self.lock:
                if self.retired or self.durable >= target:
                    return
                self.check_usable()
                end = self.end
                pending = sorted(self.unsynced, key=lambda s: s.base)
                self.unsynced.clear()
            try:
                for seg in pending:
                    os.fsync(seg.log_fd)
            except OSError as exc:
                with self.lock:
                    self.failed = exc
                raise Unavailable(
                    f"fsync of hot log {self.directory} failed: {exc}", backend="disk"
                ) from exc
            with self.lock:
                self.durable = max(self.durable, end)

    def close(self) -> None:
        """Flush, snapshot the state for a fast restart and release the files."""
        try:
            if self.loaded and not self.retired and self.failed is None:
                if self.policy != "never":
                    for seg in self.unsynced:
                        os.fsync(seg.log_fd)
                self.unsynced.clear()
                self.durable = self.end
                self.write_state()
        finally:
            for seg in self.segments:
                seg.close()
            self.retired = True


def _is_segment_stem(stem: str) -> bool:
    return len(stem) == 20 and stem.isascii() and stem.isdigit()


def _out_of_range(directory: Path, offset: int, low: int, high: int) -> OffsetOutOfRange:
    return OffsetOutOfRange(
        f"offset {offset} is outside [{low}, {high}] for hot log partition {directory}",
        offset=offset,
        earliest=low,
        latest=high,
    )


def _check_component(value: str) -> str:
    if not value or value in (".", "..") or any(c in value for c in "/\\\x00"):
        raise ValueError(f"{value!r} cannot name a hot log folder")
    return value


class DiskHotLog(HotLog):
    """A :class:`HotLog` in local segment files: the embedded, single-node default.

    One process owns a folder at a time; partitions are opened (and recovered) on first use.
    """

    name = "disk"

    def __init__(
        self,
        path: Path | str,
        *,
        fsync: FsyncPolicy = "batch",
        fsync_interval_ms: int = 200,
        segment_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        if fsync not in ("batch", "interval", "never"):
            raise ValueError(f"unknown fsync policy {fsync!r}")
        if segment_bytes < 1 or fsync_interval_ms < 1:
            raise ValueError("segment_bytes and fsync_interval_ms must be positive")
        self.root = Path(path)
        self.fsync_policy: FsyncPolicy = fsync
        self.fsync_interval_ms = fsync_interval_ms
        self.segment_bytes = segment_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self._parts: dict[PartitionId, _Partition] = {}
        self._parts_lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if fsync == "interval":
            self._flusher = threading.Thread(
                target=self._flush_loop, name="tidegate-hot-disk-flusher", daemon=True
            )
            self._flusher.start()

    @classmethod
    def from_settings(cls, settings: Settings) -> DiskHotLog:
        cfg = settings.hot
        if not isinstance(cfg, DiskHotConfig):
            raise TypeError(f"the disk hot tier needs a disk hot section, not {cfg.type!r}")
        return cls(
            settings.hot_path,
            fsync=cfg.fsync,
            fsync_interval_ms=cfg.fsync_interval_ms,
            segment_bytes=cfg.segment_bytes,
        )

    # Plumbing ---------------------------------------------------------------------------
    def partition_dir(self, part: PartitionId) -> Path:
        """The folder that holds ``part``'s segments."""
        if part.partition < 0:
            raise ValueError(f"partition must be >= 0, not {part.partition}")
        tenant, table = _check_component(part.tenant), _check_component(part.table_id)
        return self.root / tenant / table / str(part.partition)

    def _resolve(self, part: PartitionId, *, create: bool) -> _Partition | None:
        directory = self.partition_dir(part)
        with self._parts_lock:
            if self._closed:
                raise Unavailable("the disk hot log is closed", backend="disk")
            p = self._parts.get(part)
            if p is None and (create or directory.is_dir()):
                p = self._parts[part] = _Partition(directory, self)
            return p

    @contextlib.contextmanager
    def _locked(
        self, part: PartitionId, *, create: bool, sync: bool = False
    ) -> Iterator[_Partition | None]:
        """The loaded partition with its lock held (and its sync lock first when ``sync``);
        None when it does not exist and ``create`` is false."""
        while True:
            p = self._resolve(part, create=create)
            if p is None:
                yield None
                return
            with contextlib.ExitStack() as stack:
                if sync:
                    stack.enter_context(p.sync_lock)
                stack.enter_context(p.lock)
                if p.retired:
                    continue  # dropped or closed meanwhile
                try:
                    if not p.loaded:
                        p.load()
                    yield p
                except OSError as exc:
                    raise Unavailable(
                        f"hot log I/O error in {p.directory}: {exc}", backend="disk"
                    ) from exc
                return

    def _flush_loop(self) -> None:
        interval = self.fsync_interval_ms / 1000
        while not self._stop.wait(interval):
            with self._parts_lock:
                parts = list(self._parts.values())
            for p in parts:
                try:
                    p.sync_to(p.end)
                except TidegateError:
                    log.exception("hot log flusher: fsync of %s failed", p.directory)

    # HotLog -----------------------------------------------------------------------------
    def append(
        self,
        part: PartitionId,
        payload: bytes,
        count: int,
        timestamp_us: int,
        producer: ProducerSequence | None = None,
    ) -> AppendResult:
        if not 1 <= count <= _U32_MAX:
            raise ValueError(f"a batch holds between 1 and {_U32_MAX} records, not {count}")
        if len(payload) > _MAX_SEGMENT_BYTES - HEADER_SIZE - _U16_MAX:
            raise ValueError(f"a batch payload cannot exceed 4 GiB, got {len(payload)} bytes")
        if producer is not None:
            if not 0 <= producer.sequence <= _I64_MAX:
                raise InvalidIdempotentAppend(
                    f"producer sequence must be in [0, {_I64_MAX}], not {producer.sequence}",
                    producer_id=producer.producer_id,
                    sequence=producer.sequence,
                )
            if len(producer.producer_id.encode()) > _U16_MAX:
                raise InvalidIdempotentAppend(
                    f"producer id longer than {_U16_MAX} bytes",
                    producer_id=producer.producer_id[:64],
                    sequence=producer.sequence,
                )
        with self._locked(part, create=True) as p:
            assert p is not None
            p.check_usable()
            result = p.check_producer(producer, count) if producer is not None else None
            if result is None:
                result = p.append(bytes(payload), count, timestamp_us, producer)
            needs_sync = p.policy == "batch" and p.durable < result.base_offset + result.count
        if needs_sync:
            p.sync_to(result.base_offset + result.count)
        return result

    def read(
        self, part: PartitionId, from_offset: int, max_records: int, max_bytes: int
    ) -> list[StoredBatch]:
        with self._locked(part, create=False) as p:
            if p is None:
                if from_offset == 0:
                    return []
                raise _out_of_range(self.partition_dir(part), from_offset, 0, 0)
            return p.read(from_offset, max_records, max_bytes)

    def offsets(self, part: PartitionId) -> LogOffsets:
        with self._locked(part, create=False) as p:
            if p is None:
                return LogOffsets(low=0, high=0, size_bytes=0)
            return LogOffsets(low=p.low, high=p.high, size_bytes=p.payload_bytes)

    def trim(self, part: PartitionId, below_offset: int) -> int:
        with self._locked(part, create=False, sync=True) as p:
            if p is None:
                return 0
            return p.trim(below_offset)

    def drop(self, part: PartitionId) -> None:
        directory = self.partition_dir(part)
        while True:
            with self._parts_lock:
                if self._closed:
                    raise Unavailable("the disk hot log is closed", backend="disk")
                p = self._parts.get(part)
                if p is None:
                    # Registered (not loaded) so that a concurrent first use waits for us.
                    p = self._parts[part] = _Partition(directory, self)
            with p.sync_lock, p.lock:
                if p.retired:
                    continue
                for seg in p.segments:
                    seg.close()
                p.retired = True
                with self._parts_lock:
                    if self._parts.get(part) is p:
                        del self._parts[part]
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(directory)
                return

    def drop_tenant(self, tenant: str) -> None:
        with self._parts_lock:
            live = [p for p in self._parts if p.tenant == tenant]
        for part in live:
            self.drop(part)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.root / _check_component(tenant))

    def close(self) -> None:
        with self._parts_lock:
            self._closed = True
            parts = list(self._parts.values())
            self._parts.clear()
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        errors: list[BaseException] = []
        for p in parts:
            with p.sync_lock, p.lock:
                try:
                    p.close()
                except OSError as exc:
                    errors.append(exc)
        if errors:
            raise Unavailable(f"closing the disk hot log failed: {errors[0]}", backend="disk")
