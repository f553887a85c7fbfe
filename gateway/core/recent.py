"""The change batches of primary-key tables this process appended or read lately, by
partition and base offset: a write's resolution and a lookup find a key's last change
here before they read it from the hot tier (docs/decisions/primary-keys.md, "What the
write path costs").

A stored batch never changes while its partition's hot state lives: offsets are never
assigned twice, and a batch trimmed from the hot tier (below the state table's ``A(p)``)
still holds what it held; the hot index no longer answers its offsets, so they are only
asked for again when a resolution read them just before the trim. A partition this
process re-seeds after a hot-state loss is forgotten (:meth:`RecentBatches.forget`); one
that another process re-seeded is forgotten here when a key lookup answers a new
incarnation of the partition's hot state (:meth:`RecentBatches.observe`): from then on its
offsets may hold other records. Bounded by the Arrow bytes it holds, least recently used
first out.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict

import pyarrow as pa

from gateway.hot import PartitionId

__all__ = ["RECENT_BYTES", "RecentBatches"]

#: Arrow bytes of change batches a process keeps.
RECENT_BYTES = 64 * 1024 * 1024


class RecentBatches:
    """``(partition, base offset) -> (rows, timestamp_us)``: a stored batch's records in
    the log schema it was written under (no system columns). Thread-safe."""

    def __init__(self, max_bytes: int = RECENT_BYTES) -> None:
        self._max = max_bytes
        self._bytes = 0
        self._lock = threading.Lock()
        self._lru: OrderedDict[tuple[PartitionId, int], tuple[pa.RecordBatch, int]] = OrderedDict()
        #: Partition -> the base offsets held, sorted.
        self._bases: dict[PartitionId, list[int]] = {}
        #: Partition -> the incarnation of its hot state the batches held are from.
        self._incarnations: dict[PartitionId, str] = {}

    def observe(self, part: PartitionId, incarnation: str | None) -> None:
        """A key lookup answered the partition's hot state as ``incarnation``: the
        batches held from another one are dropped (None: a tier that has none)."""
        if incarnation is None:
            return
        with self._lock:
            if self._incarnations.get(part) != incarnation:
                self._drop_part(part)
                self._incarnations[part] = incarnation

    def add(
        self,
        part: PartitionId,
        base: int,
        rows: pa.RecordBatch,
        timestamp_us: int,
        incarnation: str | None = None,
    ) -> None:
        """Hold a batch read or written in the partition's hot state ``incarnation`` (as
        a lookup just before answered it); not if another has been seen since."""
        size = rows.nbytes
        if size > self._max // 4 or rows.num_rows == 0:
            return
        key = (part, base)
        with self._lock:
            if incarnation is not None and self._incarnations.get(part) != incarnation:
                return
            if key in self._lru:
                self._lru.move_to_end(key)
                return
            self._lru[key] = (rows, timestamp_us)
            bisect.insort(self._bases.setdefault(part, []), base)
            self._bytes += size
            while self._bytes > self._max:
                (old_part, old_base), (old, _) = self._lru.popitem(last=False)
                self._bytes -= old.nbytes
                self._drop_base(old_part, old_base)

    def find(self, part: PartitionId, offset: int) -> tuple[int, pa.RecordBatch, int] | None:
        """``(base, rows, timestamp_us)`` of the held batch holding ``offset``."""
        with self._lock:
            bases = self._bases.get(part)
            if not bases:
                return None
            i = bisect.bisect_right(bases, offset) - 1
            if i < 0:
                return None
            base = bases[i]
            rows, ts = self._lru[(part, base)]
            if offset >= base + rows.num_rows:
                return None
            self._lru.move_to_end((part, base))
            return base, rows, ts

    def forget(self, part: PartitionId) -> None:
        """Drop every batch of ``part`` (its hot state was lost and re-seeded)."""
        with self._lock:
            self._drop_part(part)
            self._incarnations.pop(part, None)

    def _drop_part(self, part: PartitionId) -> None:
        for base in self._bases.pop(part, []):
            rows, _ = self._lru.pop((part, base))
            self._bytes -= rows.nbytes

    def _drop_base(self, part: PartitionId, base: int) -> None:
        bases = self._bases[part]
        del bases[bisect.bisect_left(bases, base)]
        if not bases:
            del self._bases[part]
