"""The open log of one partition: its segments, appends, reads, trims and recovery."""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
import time
from pathlib import Path

from gateway import metrics
from gateway.hot.base import (
    AppendResult,
    ProducerSequence,
    StoredBatch,
)
from gateway.hot.disk.keyindex import KeyIndex
from gateway.hot.disk.producers import ProducerWindows, State, new_window
from gateway.hot.disk.records import (
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    MAX_SEGMENT_BYTES,
    STATE_FILE,
    TMP_SUFFIX,
    FsyncPolicy,
    encode_record,
    fsync_dir,
    pwrite_all,
    read_head,
    read_record,
    segment_name,
)
from gateway.hot.disk.segment import Segment
from gateway.wire.errors import (
    OffsetOutOfRange,
    TidegateError,
    Unavailable,
)

__all__ = [
    "Partition",
    "check_component",
    "is_segment_stem",
    "out_of_range",
    "write_new_state",
]

log = logging.getLogger(__name__)


class Partition:
    """The open log of one partition. Every method expects ``lock`` to be held."""

    def __init__(self, directory: Path, policy: FsyncPolicy, segment_bytes: int) -> None:
        """``policy``: the log's fsync policy; ``segment_bytes``: where a segment rolls."""
        self.directory = directory
        self.policy = policy
        self.segment_limit = min(segment_bytes, MAX_SEGMENT_BYTES)
        #: Guards everything below; held for appends' writes, reads, trims, recovery.
        self.lock = threading.Lock()
        #: Serialises fsyncs; taken *before* ``lock`` by whoever also needs it.
        self.sync_lock = threading.Lock()
        self.loaded = False
        #: Set when the partition was dropped, evicted or the log closed: re-resolve it.
        self.retired = False
        #: Files the owner counted this partition as holding (``DiskHotLog._account``).
        self.counted_files = 0
        self.failed: BaseException | None = None
        self.segments: list[Segment] = []
        self.bases: list[int] = []
        self.low = 0
        #: Next offset to assign (everything below is written, not necessarily durable).
        self.end = 0
        #: Everything below is fsynced.
        self.durable = 0
        #: Batches appended since the partition was loaded, and how many of them are fsynced.
        self.written = 0
        self.synced = 0
        self.payload_bytes = 0
        self.unsynced: set[Segment] = set()
        self.producers = ProducerWindows()
        #: A primary-key table's key index (empty, and never checkpointed, for others).
        self.keys = KeyIndex()
        #: (low, end) as the state file on disk says: a close with nothing changed since
        #: writes no state (an idle partition evicted after a look costs no fsync).
        self.saved: tuple[int, int] | None = None

    # Views ----------------------------------------------------------------------------
    @property
    def high(self) -> int:
        """The high watermark readers see: only durable batches under ``fsync="batch"``."""
        return self.durable if self.policy == "batch" else self.end

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    def locate(self, offset: int) -> tuple[int, int]:
        """(segment index, batch index) of the batch holding ``offset`` (low <= it < end)."""
        si = bisect.bisect_right(self.bases, offset) - 1
        seg = self.segments[si]
        return si, bisect.bisect_right(seg.offsets, offset) - 1

    def open_files(self) -> int:
        """Descriptors held: every segment's log, and the active segment's index."""
        if not self.segments:
            return 0
        return len(self.segments) + (1 if self.active.index_fd is not None else 0)

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
            if name.endswith(TMP_SUFFIX):
                os.unlink(entry.path)
            elif name.endswith(LOG_SUFFIX) and is_segment_stem(name[: -len(LOG_SUFFIX)]):
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

    def _load_segments(self, bases: list[int], state: State | None) -> None:
        state_low = state.low if state else 0
        state_high = state.high if state else 0
        for i, base in enumerate(bases):
            if self.segments and base != self.segments[-1].end:
                # A gap (a torn tail before a later segment): what follows cannot be served.
                log.warning("hot log %s: removing segments from %d on (gap)", self.directory, base)
                for later in bases[i:]:
                    self._unlink_segment_files(later)
                break
            self.segments.append(Segment.recover(self.directory, base))
        if not self.segments:
            self.segments.append(Segment.create(self.directory, max(state_low, state_high)))
            self._sync_dir()
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
                window = new_window()
                # An empty idempotent append (count 0) at the end stays.
                window.extend(e for e in entries if e[1] < self.end or e == (e[0], self.end, 0))
                if window:
                    self.producers[pid] = window
        for seg in self.segments:
            if seg.end <= replay_from:
                continue
            for off, pos in zip(seg.offsets, seg.positions, strict=True):
                if off < replay_from:
                    continue
                head = read_head(seg.log_fd, pos)
                if head is None:  # verified while recovering; the disk changed under us
                    raise TidegateError(f"hot log {seg.log_path}: unreadable header at {pos}")
                if head.producer is not None:
                    self.producers.remember(head.producer, head.base_offset, head.count)

        self.payload_bytes = sum(
            n
            for seg in self.segments
            for off, n in zip(seg.offsets, seg.payload_lens, strict=True)
            if off >= self.low
        )
        self._delete_segments_below_low()
        self.keys.recover(
            self.directory,
            self.segments,
            unkeyed_below=state.high if state is not None and state.keyed is False else None,
            end=self.end,
            low=self.low,
        )
        if (
            state is None
            or state_low != self.low
            or state_high > self.end
            or state.keyed is None
            or (self.keys.keyed and not state.keyed)
        ):
            self.write_state()
        else:
            self.saved = (state_low, state_high)

    def _read_state(self) -> State | None:
        try:
            raw = (self.directory / STATE_FILE).read_bytes()
        except FileNotFoundError:
            return None
        try:
            return State.from_json(raw)
        except ValueError as exc:
            # Only a power cut under fsync="never" can leave this; the record headers still
            # hold the producer state of every batch not yet trimmed.
            log.warning("hot log %s: ignoring unreadable %s (%s)", self.directory, STATE_FILE, exc)
            return None

    def write_state(self) -> None:
        """Atomically persist the low mark, high watermark and producer windows."""
        producers = {p: list(w) for p, w in self.producers.items()}
        state = State(self.low, self.end, producers, keyed=self.keys.keyed)
        path = self.directory / STATE_FILE
        tmp = path.with_name(STATE_FILE + TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            pwrite_all(fd, state.to_json(), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._sync_dir()
        self.saved = (state.low, state.high)

    def start_over(self, floor: int) -> None:
        """Empty the partition and open it again at ``floor`` (above its end: writes were
        lost, and offsets below ``floor`` must never be assigned again)."""
        for seg in self.segments:
            seg.close()
            self._unlink_segment_files(seg.base)
        self.segments.clear()
        self.bases.clear()
        self.unsynced.clear()
        self.producers = ProducerWindows()
        KeyIndex.remove(self.directory)
        self.keys = KeyIndex()
        self.low = self.end = self.durable = floor
        self.payload_bytes = 0
        self.write_state()
        self.loaded = False
        self.load()

    def _sync_dir(self) -> None:
        if self.policy != "never":
            fsync_dir(self.directory)

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

    # Writes ---------------------------------------------------------------------------
    def append(
        self,
        payload: bytes,
        count: int,
        timestamp_us: int,
        producer: ProducerSequence | None,
        keys: list[bytes] | None = None,
    ) -> AppendResult:
        base = self.end
        record = encode_record(base, count, timestamp_us, producer, payload, keys)
        if self.active.size > 0 and self.active.size + len(record) > self.segment_limit:
            self._roll()
            self.write_state()
        seg = self.active
        position, n = seg.size, len(seg)
        assert seg.index_fd is not None
        try:
            pwrite_all(seg.log_fd, record, position)
            entry = INDEX_ENTRY.pack(base, position, len(payload))
            pwrite_all(seg.index_fd, entry, n * INDEX_ENTRY_SIZE)
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
        self.written += 1
        if producer is not None:
            self.producers.remember(producer, base, count)
        if keys is not None:
            self.keys.apply(keys, base)
        return AppendResult(base_offset=base, count=count)

    def _roll(self) -> None:
        """Start a new, empty active segment at the end of the log."""
        seg = Segment.create(self.directory, self.end)
        self._sync_dir()
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
        self.keys.prune(new_low)
        if new_low == self.end and len(self.active) > 0:
            self._roll()  # so the high watermark outlives the last batch's segment
        self.write_state()  # before deleting anything the producer windows may refer to
        self._delete_segments_below_low()
        return self.low

    def read(self, from_offset: int, max_records: int, max_bytes: int) -> list[StoredBatch]:
        high = self.high
        if from_offset < self.low or from_offset > high:
            raise out_of_range(self.directory, from_offset, self.low, high)
        out: list[StoredBatch] = []
        if from_offset == high:
            return out
        si, bi = self.locate(from_offset)
        seg = self.segments[si]
        records = size = 0
        while True:
            position = seg.positions[bi]
            got = read_record(seg.log_fd, position, seg.record_end(bi))
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
        holding only ``sync_lock`` so appends to the partition go on meanwhile. Appenders
        that arrive during an fsync wait on ``sync_lock`` (their batches already written);
        the first to get it (the leader) fsyncs once for all of them, and the others find
        their batches durable and return without an fsync of their own.
        """
        with self.sync_lock:
            with self.lock:
                if self.durable >= target:
                    return
                if self.retired:
                    # Dropped, or evicted or closed after an fsync that failed: the batch
                    # may not be durable, so it is not acknowledged.
                    raise Unavailable(
                        f"hot log partition {self.directory} was closed before its writes "
                        "were made durable",
                        backend="disk",
                    )
                self.check_usable()
                end, written = self.end, self.written
                pending = sorted(self.unsynced, key=lambda s: s.base)
                self.unsynced.clear()
            started = time.perf_counter()
            try:
                for seg in pending:
                    os.fsync(seg.log_fd)
            except OSError as exc:
                with self.lock:
                    self.failed = exc
                raise Unavailable(
                    f"fsync of hot log {self.directory} failed: {exc}", backend="disk"
                ) from exc
            metrics.HOT_DISK_FSYNC_SECONDS.observe(time.perf_counter() - started)
            with self.lock:
                metrics.HOT_DISK_FSYNC_BATCHES.inc(written - self.synced)
                self.durable = max(self.durable, end)
                self.synced = max(self.synced, written)

    def checkpoint_keys(self) -> None:
        """Write the key index's checkpoint (``sync_lock`` and ``lock`` held): the log's
        pending fsyncs first, so that it folds only durable records."""
        self.check_usable()
        if self.policy != "never":
            try:
                for seg in sorted(self.unsynced, key=lambda s: s.base):
                    os.fsync(seg.log_fd)
            except OSError as exc:
                self.failed = exc  # as in sync_to: the kernel may have dropped the pages
                raise
        self.unsynced.clear()
        self.durable = self.end
        self.keys.write(self.directory, self.end, self.low, sync=self.policy != "never")

    def evict(self) -> None:
        """Release the files of a partition the log closes to stay within its bound
        (``sync_lock`` and ``lock`` held): as :meth:`close`, so every batch written is
        durable and the state snapshot says exactly where the log ends, and the next use
        loads it again without a recovery scan. An fsync that fails leaves the partition
        failed (appenders waiting for it are refused, never acknowledged)."""
        try:
            self.close()
        except OSError as exc:
            self.failed = exc
            log.warning("hot log %s: closing it failed (%s)", self.directory, exc)

    def close(self) -> None:
        """Flush, snapshot the state for a fast restart and release the files."""
        try:
            if self.loaded and not self.retired and self.failed is None:
                if self.policy != "never":
                    for seg in self.unsynced:
                        os.fsync(seg.log_fd)
                self.unsynced.clear()
                self.durable = self.end
                if self.saved != (self.low, self.end):
                    self.write_state()
                if self.keys.stale(self.end):
                    self.keys.write(self.directory, self.end, self.low, sync=self.policy != "never")
        finally:
            for seg in self.segments:
                seg.close()
            self.retired = True


def write_new_state(directory: Path, start: int, *, sync: bool) -> None:
    """Write the state of a new, empty partition that starts at offset ``start`` into
    ``directory``: its first segment is created there when it is loaded."""
    path = directory / STATE_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        pwrite_all(fd, State(start, start, {}, keyed=False).to_json(), 0)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    if sync:
        fsync_dir(directory)


def is_segment_stem(stem: str) -> bool:
    return len(stem) == 20 and stem.isascii() and stem.isdigit()


def out_of_range(directory: Path, offset: int, low: int, high: int) -> OffsetOutOfRange:
    return OffsetOutOfRange(
        f"offset {offset} is outside [{low}, {high}] for hot log partition {directory}",
        offset=offset,
        earliest=low,
        latest=high,
    )


def check_component(value: str) -> str:
    if not value or value in (".", "..") or any(c in value for c in "/\\\x00"):
        raise ValueError(f"{value!r} cannot name a hot log folder")
    return value
