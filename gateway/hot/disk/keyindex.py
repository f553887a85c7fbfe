"""The key index of a disk hot tier partition (a primary-key table's): key -> offset of its
latest change, in memory, checkpointed to ``keys.idx`` and rebuilt from the log.

The log is the truth: every keyed batch's record carries its keys (record version 2, see
:mod:`gateway.hot.disk.records`), so the map is a fold of the log's key blocks and any
prefix of the log's records can be replayed on a checkpoint that holds the ones before.

``keys.idx`` (big endian), written whole (temporary file, fsync, rename: a kill -9 at any
point leaves the old checkpoint or the new one)::

    magic     4s   b"TGK\\x01"
    crc32     u32  zlib.crc32 of every byte after this field
    through   i64  the map folds every record below this offset
    entries   u32
    key_len   u32 times entries
    offset    i64 times entries
    keys      the keys, one after the other (their lengths above)

(columns, not rows: an open decodes the two number columns at C speed.)

On open: the checkpoint, then a replay of the records from ``through`` on. No checkpoint,
a bad CRC, or one that holds more than the log does (``through`` past its end: records
lost with a power cut under a lax fsync policy) rebuilds the map from the whole log.
``state.json`` says whether any record below its high watermark carries keys at all
(``keyed``), so that an append-only table's partition never looks for a checkpoint nor
reads its records' headers for keys.

A checkpoint is written when as many keys have changed since the last one as the map
holds (at least :data:`MIN_CHECKPOINT_CHANGES`), so the cost of writing the map is
amortised over the changes and a replay is never longer than the map; and on close. It
covers only durable records: the log's pending fsyncs are done first.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from pathlib import Path

from gateway.hot.disk.records import (
    TMP_SUFFIX,
    fsync_dir,
    pwrite_all,
    read_head,
    read_keyed_record,
)
from gateway.hot.disk.segment import Segment
from gateway.wire.errors import TidegateError

__all__ = ["CHECKPOINT_MAGIC", "KEYS_FILE", "MIN_CHECKPOINT_CHANGES", "KeyIndex"]

log = logging.getLogger(__name__)

KEYS_FILE = "keys.idx"
CHECKPOINT_MAGIC = b"TGK\x01"
#: magic, crc32, through, entries
_HEAD = struct.Struct(">4sIqI")
#: The number columns are big endian on disk.
_SWAP = sys.byteorder == "little"
#: Key changes between two checkpoints at the least (a small map is not rewritten often).
MIN_CHECKPOINT_CHANGES = 65536


class KeyIndex:
    """One partition's map of key -> offset of its latest change (the partition's lock
    guards it)."""

    __slots__ = ("changes", "keyed", "offsets", "through")

    def __init__(self) -> None:
        self.offsets: dict[bytes, int] = {}
        #: Whether any record of the log carries keys (sticky: a key-table stays one).
        self.keyed = False
        #: What the checkpoint on disk folds the log through (None: no checkpoint read or
        #: written by this process).
        self.through: int | None = None
        #: Key changes folded in since that checkpoint.
        self.changes = 0

    def apply(self, keys: Sequence[bytes], base: int) -> None:
        """Fold in a batch at ``base``: record ``i`` changed ``keys[i]``; the last change of
        a key within the batch wins."""
        offsets = self.offsets
        for i, key in enumerate(keys):
            offsets[key] = base + i
        self.changes += len(keys)
        self.keyed = True

    def lookup(self, keys: Sequence[bytes], low: int) -> list[int | None]:
        """Each key's offset, None where the map has none or it lies below ``low``."""
        get = self.offsets.get
        out: list[int | None] = []
        for key in keys:
            offset = get(bytes(key))
            out.append(offset if offset is not None and offset >= low else None)
        return out

    def prune(self, low: int) -> None:
        """Forget the entries below ``low`` (trimmed records)."""
        if self.offsets and min(self.offsets.values()) < low:
            self.offsets = {k: o for k, o in self.offsets.items() if o >= low}

    def due(self) -> bool:
        """Whether enough keys changed since the last checkpoint to write another."""
        return self.changes >= max(MIN_CHECKPOINT_CHANGES, len(self.offsets))

    def stale(self, end: int) -> bool:
        """Whether the checkpoint on disk misses records below ``end``."""
        return self.keyed and self.through != end

    # The checkpoint ---------------------------------------------------------------------
    def write(self, directory: Path, through: int, low: int, *, sync: bool) -> None:
        """Write the map as the checkpoint of every record below ``through`` (each of them
        durable), pruned below ``low``: temporary file, fsync, rename."""
        self.prune(low)
        lengths = array("I", map(len, self.offsets))
        offsets = array("q", self.offsets.values())
        if _SWAP:
            lengths.byteswap()
            offsets.byteswap()
        head = _HEAD.pack(CHECKPOINT_MAGIC, 0, through, len(offsets))[8:]
        body = b"".join((head, lengths.tobytes(), offsets.tobytes(), *self.offsets))
        data = CHECKPOINT_MAGIC + zlib.crc32(body).to_bytes(4, "big") + body
        path = directory / KEYS_FILE
        tmp = path.with_name(KEYS_FILE + TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            pwrite_all(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if sync:
            fsync_dir(directory)
        self.through = through
        self.changes = 0

    @staticmethod
    def read(directory: Path) -> tuple[int, dict[bytes, int]] | None:
        """``(through, map)`` of the checkpoint; None when there is none or it is not
        whole (a bad CRC, a wrong length)."""
        try:
            data = (directory / KEYS_FILE).read_bytes()
        except FileNotFoundError:
            return None
        if len(data) < _HEAD.size:
            return None
        magic, crc, through, entries = _HEAD.unpack_from(data)
        if magic != CHECKPOINT_MAGIC or zlib.crc32(data[8:]) != crc or through < 0:
            return None
        keys_at = _HEAD.size + entries * 12
        if keys_at > len(data):
            return None
        lengths = array("I", data[_HEAD.size : _HEAD.size + entries * 4])
        offsets = array("q", data[_HEAD.size + entries * 4 : keys_at])
        if _SWAP:
            lengths.byteswap()
            offsets.byteswap()
        ends = list(itertools.accumulate(lengths, initial=keys_at))
        if ends[-1] != len(data):
            return None
        found = dict(zip(map(data.__getitem__, map(slice, ends, ends[1:])), offsets, strict=True))
        return (through, found) if len(found) == entries else None

    @staticmethod
    def remove(directory: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / KEYS_FILE)

    # Recovery ---------------------------------------------------------------------------
    def recover(
        self,
        directory: Path,
        segments: Sequence[Segment],
        *,
        unkeyed_below: int | None,
        end: int,
        low: int,
    ) -> None:
        """Rebuild the map on open over the recovered ``segments`` (the log ends at
        ``end``; its low mark is ``low``). ``unkeyed_below``: no record below it carries
        keys (the state file says so), None when unknown."""
        self.offsets, self.through, self.changes = {}, None, 0
        start = segments[0].base if segments else end
        rejected = False
        if unkeyed_below is not None:
            start = max(start, unkeyed_below)
        else:
            checkpoint = self.read(directory)
            if checkpoint is not None and checkpoint[0] <= end:
                self.through, self.offsets = checkpoint
                self.keyed = True
                start = max(start, checkpoint[0])
            elif (directory / KEYS_FILE).exists():
                rejected = True
                log.warning(
                    "hot log %s: %s is unreadable or ahead of the log; rebuilding the key "
                    "index from the log",
                    directory,
                    KEYS_FILE,
                )
        self._replay(segments, start)
        self.prune(low)
        if rejected:
            # Replaced at once: a checkpoint ahead of the log would otherwise be believed
            # once the log has grown past its `through` again. (The log's segments were
            # fsynced by the recovery: the map folds durable records.)
            self.write(directory, end, low, sync=True)

    def _replay(self, segments: Sequence[Segment], start: int) -> None:
        """Fold in the keys of every record from offset ``start`` on."""
        for seg in segments:
            if seg.end <= start:
                continue
            for i, (off, pos) in enumerate(zip(seg.offsets, seg.positions, strict=True)):
                if off < start:
                    continue
                head = read_head(seg.log_fd, pos)
                if head is None:  # verified while recovering; the disk changed under us
                    raise TidegateError(f"hot log {seg.log_path}: unreadable header at {pos}")
                if not head.keyed:
                    continue
                got = read_keyed_record(seg.log_fd, pos, seg.record_end(i))
                if got is None or got[1] is None:
                    raise TidegateError(f"hot log {seg.log_path}: unreadable keys at {pos}")
                self.apply(got[1], off)
