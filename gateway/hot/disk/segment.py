"""One segment of a partition's log: its log file, its offset index, and their recovery."""

from __future__ import annotations

import logging
import os
from array import array
from pathlib import Path

from gateway.hot.disk.records import (
    HEADER_SIZE,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    close_quietly,
    pwrite_all,
    read_record,
    segment_name,
)

__all__ = ["Segment"]

log = logging.getLogger(__name__)


class Segment:
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
            INDEX_ENTRY.pack(o, p, n)
            for o, p, n in zip(self.offsets, self.positions, self.payload_lens, strict=True)
        )

    def record_end(self, i: int) -> int:
        """File position just past batch ``i``."""
        return self.positions[i + 1] if i + 1 < len(self.offsets) else self.size

    def close(self) -> None:
        """Release both files; safe to call twice (a closed fd number may be reused)."""
        if self.log_fd >= 0:
            close_quietly(self.log_fd)
            self.log_fd = -1
        close_quietly(self.index_fd)
        self.index_fd = None

    def seal(self) -> None:
        """Stop being the active segment: its index is complete and stays in memory."""
        close_quietly(self.index_fd)
        self.index_fd = None

    @classmethod
    def create(cls, directory: Path, base: int) -> Segment:
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
    def recover(cls, directory: Path, base: int) -> Segment:
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
            raw_index: bytes | None = self.index_path.read_bytes()
        except FileNotFoundError:
            raw_index = None  # a kill between creating the log file and its index
        # 1. The longest prefix of index entries that is plausible on its face.
        known = raw_index or b""
        usable = len(known) - len(known) % INDEX_ENTRY_SIZE
        for off, pos, payload_len in INDEX_ENTRY.iter_unpack(known[:usable]):
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
            got = read_record(self.log_fd, self.positions[i], file_size)
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
            got = read_record(self.log_fd, position, file_size)
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
                pwrite_all(index_fd, index, 0)
                os.ftruncate(index_fd, len(index))
            finally:
                os.close(index_fd)
