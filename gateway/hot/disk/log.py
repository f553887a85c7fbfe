"""The disk hot tier's :class:`~gateway.hot.HotLog`: partitions by path, fsync policy."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

from gateway import metrics
from gateway.config import DiskHotConfig, Settings
from gateway.hot.base import (
    AppendResult,
    HotLog,
    LogOffsets,
    PartitionId,
    ProducerSequence,
    StoredBatch,
    high_moved,
)
from gateway.hot.disk.partition import (
    Partition,
    check_component,
    out_of_range,
    write_new_state,
)
from gateway.hot.disk.records import (
    I64_MAX,
    KEYED_HEADER_SIZE,
    MAX_SEGMENT_BYTES,
    U16_MAX,
    U32_MAX,
    FsyncPolicy,
)
from gateway.hot.keyindex import batch_keys
from gateway.wire.errors import (
    HotStateLost,
    InvalidIdempotentAppend,
    TidegateError,
    Unavailable,
)

__all__ = [
    "DEFAULT_MAX_OPEN_FILES",
    "LOCK_FILE",
    "MIN_OPEN_FILES",
    "DiskHotLog",
    "HotTierBusy",
    "folder_holder",
    "take_folder_lock",
]

#: Files the disk hot tier keeps open by default (``hot.max_open_files``).
DEFAULT_MAX_OPEN_FILES = 256
#: The smallest bound accepted: a few partitions' worth of files.
MIN_OPEN_FILES = 8

#: The lock file of a disk hot tier's folder: one process owns the log.
LOCK_FILE = ".lock"


class HotTierBusy(Unavailable):
    """The disk hot tier's folder is owned by another process."""

    reason = "HOT_TIER_BUSY"


def take_folder_lock(root: Path) -> int:
    """Take the exclusive lock of a disk hot tier's folder and write who holds it.

    The lock is the kernel's (``flock``): it goes with the process, so a crashed owner
    leaves no stale lock behind. Returns the lock file's descriptor (closing it releases
    the lock).

    Raises:
        HotTierBusy: another process holds it (named from the lock file).
    """
    path = root / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise HotTierBusy(
            f"the disk hot tier at {root} is in use by {holder}; one process owns it. Stop "
            "that process first, or give this one another data folder (--data-dir or "
            "TIDEGATE_DATA_DIR); to share a hot tier between processes use the Redis hot "
            "tier (TIDEGATE_HOT__TYPE=redis)",
            path=str(root),
        ) from None
    except BaseException:
        os.close(fd)
        raise
    me = f"pid {os.getpid()} on {socket.gethostname()} ({' '.join(sys.argv)[:200]})"
    os.ftruncate(fd, 0)
    os.pwrite(fd, me.encode(), 0)
    return fd


def folder_holder(root: Path) -> str | None:
    """Who holds the lock of a disk hot tier's folder (as its lock file says), or None when
    no process does; a check before starting that takes nothing (a lock it got is
    released at once)."""
    path = root / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None  # no lock file: the folder was never opened, or does not exist
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
    finally:
        os.close(fd)  # closing releases a lock this check took
    return None


log = logging.getLogger(__name__)


class DiskHotLog(HotLog):
    """A :class:`HotLog` in local segment files: the embedded, single-node default.

    One process owns a folder at a time; partitions are opened (and recovered) on first use,
    and closed again when the files open pass ``max_open_files``, least recently used
    first: what an idle partition costs is its folder, not descriptors.
    """

    name = "disk"

    def __init__(
        self,
        path: Path | str,
        *,
        fsync: FsyncPolicy = "batch",
        fsync_interval_ms: int = 200,
        segment_bytes: int = 64 * 1024 * 1024,
        lock: bool = True,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
    ) -> None:
        if fsync not in ("batch", "interval", "never"):
            raise ValueError(f"unknown fsync policy {fsync!r}")
        if segment_bytes < 1 or fsync_interval_ms < 1:
            raise ValueError("segment_bytes and fsync_interval_ms must be positive")
        if max_open_files < MIN_OPEN_FILES:
            raise ValueError(f"max_open_files must be at least {MIN_OPEN_FILES}")
        #: Files the log keeps open at most (beyond the partitions in use this instant):
        #: the least recently used partitions are closed past it and reopened on demand.
        self.max_open_files = max_open_files
        self.root = Path(path)
        self.fsync_policy: FsyncPolicy = fsync
        self.fsync_interval_ms = fsync_interval_ms
        self.segment_bytes = segment_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        #: The folder's exclusive lock: one process owns the log (None without ``lock``).
        self._lock_fd = take_folder_lock(self.root) if lock else None
        #: The partitions in use or open, least recently used first.
        self._parts: OrderedDict[PartitionId, Partition] = OrderedDict()
        self._parts_lock = threading.Lock()
        #: Files the loaded partitions hold open (each partition's count is refreshed
        #: after every operation on it, see :meth:`_account`).
        self._open_files = 0
        self._count_lock = threading.Lock()
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
            lock=cfg.lock,
            max_open_files=cfg.max_open_files,
        )

    # Plumbing ---------------------------------------------------------------------------
    def partition_dir(self, part: PartitionId) -> Path:
        """The folder that holds ``part``'s segments."""
        if part.partition < 0:
            raise ValueError(f"partition must be >= 0, not {part.partition}")
        tenant, table = check_component(part.tenant), check_component(part.table_id)
        return self.root / tenant / table / str(part.partition)

    def _resolve(self, part: PartitionId, *, create: bool) -> Partition | None:
        directory = self.partition_dir(part)
        with self._parts_lock:
            if self._closed:
                raise Unavailable("the disk hot log is closed", backend="disk")
            p = self._parts.get(part)
            if p is None and (create or directory.is_dir()):
                p = self._parts[part] = Partition(directory, self.fsync_policy, self.segment_bytes)
            elif p is not None:
                self._parts.move_to_end(part)
            return p

    @contextlib.contextmanager
    def _locked(
        self, part: PartitionId, *, create: bool, sync: bool = False
    ) -> Iterator[Partition | None]:
        """The loaded partition with its lock held (and its sync lock first when ``sync``);
        None when it does not exist and ``create`` is false."""
        while True:
            p = self._resolve(part, create=create)
            if p is None:
                yield None
                return
            try:
                with contextlib.ExitStack() as stack:
                    if sync:
                        stack.enter_context(p.sync_lock)
                    stack.enter_context(p.lock)
                    if p.retired:
                        continue  # dropped, closed or evicted meanwhile
                    try:
                        if not p.loaded:
                            p.load()
                        yield p
                    except OSError as exc:
                        raise Unavailable(
                            f"hot log I/O error in {p.directory}: {exc}", backend="disk"
                        ) from exc
                    finally:
                        self._account(p)
            finally:
                if self._open_files > self.max_open_files:
                    self._evict(keep=part)
            return

    def _account(self, p: Partition) -> None:
        """Refresh the count of files ``p`` holds open (its lock held)."""
        now = p.open_files()
        if now != p.counted_files:
            with self._count_lock:
                self._open_files += now - p.counted_files
                metrics.HOT_DISK_OPEN_FILES.set(self._open_files)
            p.counted_files = now

    @property
    def open_files(self) -> int:
        """Files the log's partitions hold open now (the folder's lock file aside)."""
        return self._open_files

    def _evict(self, keep: PartitionId) -> None:
        """Close the least recently used partitions until the files held open are within
        ``max_open_files``. Called with no partition lock held; a partition in use (its
        lock taken) is passed over, and so is ``keep``, the one just used. An evicted
        partition is durable and its state written before its files close
        (:meth:`Partition.evict`), so loading it again recovers nothing and loses nothing.
        """
        while self._open_files > self.max_open_files:
            victim: tuple[PartitionId, Partition] | None = None
            with self._parts_lock:
                for key, p in self._parts.items():  # least recently used first
                    if key == keep or not p.loaded:
                        continue
                    if not p.sync_lock.acquire(blocking=False):
                        continue
                    if not p.lock.acquire(blocking=False):
                        p.sync_lock.release()
                        continue
                    victim = (key, p)
                    break
            if victim is None:
                return  # every other partition is in use this instant
            key, p = victim
            try:
                if not p.retired:
                    p.evict()
                    metrics.HOT_DISK_EVICTIONS.inc()
                with self._count_lock:
                    self._open_files -= p.counted_files
                p.counted_files = 0
                with self._parts_lock:
                    if self._parts.get(key) is p:
                        del self._parts[key]
            finally:
                p.lock.release()
                p.sync_lock.release()

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
        *,
        floor: int | None = None,
        keys: Sequence[bytes] | None = None,
        expect_high: int | None = None,
    ) -> AppendResult:
        if count == 0 and producer is not None:
            return self._append_empty(part, producer, floor, expect_high)
        if not 1 <= count <= U32_MAX:
            raise ValueError(f"a batch holds between 1 and {U32_MAX} records, not {count}")
        keyed = batch_keys(keys, count)
        size = len(payload) + (sum(4 + len(k) for k in keyed) if keyed is not None else 0)
        if size > MAX_SEGMENT_BYTES - KEYED_HEADER_SIZE - U16_MAX:
            raise ValueError(f"a batch and its keys cannot exceed 4 GiB, got {size} bytes")
        if producer is not None:
            if not 0 <= producer.sequence <= I64_MAX:
                raise InvalidIdempotentAppend(
                    f"producer sequence must be in [0, {I64_MAX}], not {producer.sequence}",
                    producer_id=producer.producer_id,
                    sequence=producer.sequence,
                )
            if len(producer.producer_id.encode()) > U16_MAX:
                raise InvalidIdempotentAppend(
                    f"producer id longer than {U16_MAX} bytes",
                    producer_id=producer.producer_id[:64],
                    sequence=producer.sequence,
                )
        with self._locked(part, create=floor is None) as p:
            if p is None:
                raise HotStateLost(
                    f"the disk hot tier has no folder for partition {part.path} (never "
                    "opened, or removed)",
                    backend="disk",
                )
            if floor is not None and p.end < floor:
                raise HotStateLost(
                    f"the disk hot tier's partition {part.path} ends at {p.end}, below "
                    f"{floor}: it lost writes",
                    backend="disk",
                )
            p.check_usable()
            result = p.producers.check(part.path, producer, count) if producer is not None else None
            if result is None:
                if expect_high is not None and p.end != expect_high:
                    raise high_moved(part, expect_high, p.end)
                result = p.append(bytes(payload), count, timestamp_us, producer, keyed)
            needs_sync = p.policy == "batch" and p.durable < result.base_offset + result.count
        if needs_sync:
            p.sync_to(result.base_offset + result.count)
        if keyed is not None and p.keys.due():
            self._checkpoint_keys(part)
        return result

    def _append_empty(
        self,
        part: PartitionId,
        producer: ProducerSequence,
        floor: int | None,
        expect_high: int | None,
    ) -> AppendResult:
        """An empty idempotent append: the producer's sequence advances, no record is
        written. Its window entry ``(sequence, high, 0)`` is made durable in
        ``state.json`` (after the records below it), since no record carries it."""
        with self._locked(part, create=floor is None) as p:
            if p is None or (floor is not None and p.end < floor):
                raise HotStateLost(
                    f"the disk hot tier holds no state for partition {part.path} at or "
                    f"above {floor}",
                    backend="disk",
                )
            p.check_usable()
            result = p.producers.check(part.path, producer, 0)
            if result is not None:
                return result
            if expect_high is not None and p.end != expect_high:
                raise high_moved(part, expect_high, p.end)
            end = p.end
            p.producers.remember(producer, end, 0)
        if p.policy == "batch" and p.durable < end:
            p.sync_to(end)
        with self._locked(part, create=False) as p:
            if p is not None:
                p.write_state()
        return AppendResult(base_offset=end, count=0)

    def _checkpoint_keys(self, part: PartitionId) -> None:
        """Write the partition's key index checkpoint if it is (still) due. Called after
        an append was stored: a failure is logged, never raised (the append stands, and
        the log still holds every key the checkpoint would have)."""
        try:
            with self._locked(part, create=False, sync=True) as p:
                if p is not None and p.keys.due():
                    p.checkpoint_keys()
        except (TidegateError, OSError) as exc:
            log.warning("hot log %s: key index checkpoint failed (%s)", part.path, exc)

    def latest_offsets(self, part: PartitionId, keys: Sequence[bytes]) -> list[int | None]:
        with self._locked(part, create=False) as p:
            if p is None:
                return [None] * len(keys)
            out = p.keys.lookup(keys, p.low)
            top = max((o for o in out if o is not None), default=-1)
            pending = top >= p.high
        if pending:
            # A batch written but not yet durable (fsync="batch"): readers see it once
            # its fsync is done, which this waits for (or does: group commit).
            p.sync_to(top + 1)
        return out

    def key_count(self, part: PartitionId) -> int:
        with self._locked(part, create=False) as p:
            return 0 if p is None else len(p.keys.offsets)

    def open_partition(self, part: PartitionId, floor: int) -> int:
        directory = self.partition_dir(part)
        if not directory.is_dir():
            # Made whole under another name, then renamed: a concurrent append sees either
            # no folder (and waits for this) or one that starts at ``floor``.
            directory.parent.mkdir(parents=True, exist_ok=True)
            fresh = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
            write_new_state(fresh, floor, sync=self.fsync_policy != "never")
            try:
                fresh.rename(directory)
            except OSError:
                shutil.rmtree(fresh, ignore_errors=True)  # another process or thread won
                if not directory.is_dir():
                    raise
        with self._locked(part, create=False) as p:
            assert p is not None
            p.check_usable()
            if p.end < floor:
                log.warning(
                    "hot log %s ends at %d, below %d: it lost writes (a power cut under "
                    "fsync=%s?); starting it over at %d",
                    p.directory,
                    p.end,
                    floor,
                    p.policy,
                    floor,
                )
                p.start_over(floor)
            return p.end

    def open_partitions(self, parts: Sequence[PartitionId]) -> None:
        # An empty folder is a partition at offset 0; nothing is opened (no file handle
        # for a table that may stay idle).
        for part in parts:
            self.partition_dir(part).mkdir(parents=True, exist_ok=True)

    def read(
        self, part: PartitionId, from_offset: int, max_records: int, max_bytes: int
    ) -> list[StoredBatch]:
        with self._locked(part, create=False) as p:
            if p is None:
                if from_offset == 0:
                    return []
                raise out_of_range(self.partition_dir(part), from_offset, 0, 0)
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
                    p = self._parts[part] = Partition(
                        directory, self.fsync_policy, self.segment_bytes
                    )
            with p.sync_lock, p.lock:
                if p.retired:
                    continue
                for seg in p.segments:
                    seg.close()
                p.retired = True
                with self._count_lock:
                    self._open_files -= p.counted_files
                p.counted_files = 0
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
            shutil.rmtree(self.root / check_component(tenant))

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
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None
        if errors:
            raise Unavailable(f"closing the disk hot log failed: {errors[0]}", backend="disk")
