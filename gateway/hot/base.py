"""The hot log tier: one abstract interface, several backends.

A hot log stores, per table partition, an ordered sequence of *batches*. Each batch is one
appended request for that partition: an opaque payload (compressed Arrow IPC produced by
:mod:`gateway.wire.codec`), the number of records it holds, and the append timestamp.
Offsets are assigned by the backend, atomically with the write: a batch of ``count``
records gets the contiguous range ``[base_offset, base_offset + count)`` and the high
watermark moves to ``base_offset + count``. Offsets are dense and start at 0.

The hot log never interprets payloads; the unification layer above it decodes them and adds
the system columns. Implementations are synchronous and thread-safe: the async server calls
them from a thread pool, and Spark tasks call them directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.wire.errors import HighWatermarkMoved, UnknownProducer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.config import Settings
    from gateway.hot.placement import Chain, PlacementStore


#: How many sequences a producer counting records has (Kafka's are 32-bit and wrap to 0).
RECORD_SEQUENCES = 1 << 31


@dataclass(frozen=True, slots=True)
class PartitionId:
    """Where one partition's log lives. ``table_id`` is unique for the table's lifetime
    (a dropped and re-created table gets a new one), so logs never collide."""

    tenant: str
    table_id: str
    partition: int

    @property
    def path(self) -> str:
        """A stable, filesystem- and key-safe name: ``<tenant>/<table_id>/<partition>``."""
        return f"{self.tenant}/{self.table_id}/{self.partition}"


@dataclass(frozen=True, slots=True)
class ProducerSequence:
    """Idempotent-producer identity of one batch for one partition.

    For a given ``(producer_id, partition)`` sequences must grow by exactly one per batch
    from 0, or, with ``counts_records`` (Kafka's idempotent producer), by the previous
    batch's record count, wrapping from ``2**31 - 1`` to 0 as Kafka's 32-bit sequences do.
    A producer the partition holds no state of may only start at sequence 0: any other is
    refused with :class:`UnknownProducer` (its earlier batches were never seen, or their
    state was lost with the hot tier's, so a retry could not be recognised).
    """

    producer_id: str
    sequence: int
    #: The sequence counts records, not batches (a batch's ``sequence`` is its first
    #: record's). Nothing is stored of it: a producer id always comes with the same.
    counts_records: bool = False
    #: A primary-key table's batch, resolved into changes at write: a retry may resolve
    #: to another number of changes (or none), so a retried sequence is answered as the
    #: duplicate it is whatever its count (sequences still grow by one per batch).
    resolved: bool = False

    def expected(self, last: int, last_count: int) -> int:
        """The sequence that follows a batch of ``last_count`` records at ``last``."""
        if self.counts_records:
            return (last + last_count) % RECORD_SEQUENCES
        return last + 1

    def unknown(self, where: str) -> UnknownProducer:
        """The refusal of this batch by partition ``where``, which holds no state of its
        producer (and the sequence is above 0)."""
        pid, seq = self.producer_id, self.sequence
        return UnknownProducer(
            f"producer {pid!r} sent sequence {seq} to partition {where}, which holds no state "
            "of this producer (the hot tier may have lost it): nothing was stored, but whether "
            "its earlier batches were is unknown; continue under a new producer id from "
            "sequence 0",
            producer_id=pid,
            sequence=seq,
        )


def high_moved(part: PartitionId, expected: int, high: int) -> HighWatermarkMoved:
    """The refusal of an append that expected the partition's high watermark at
    ``expected`` and found ``high``."""
    return HighWatermarkMoved(
        f"partition {part.path} is at offset {high}, not {expected} as the append expected: "
        "another append landed since its batch was resolved; nothing was stored",
        expected=expected,
        high=high,
    )


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    count: int
    #: True when the batch was a retry of an already stored one; offsets are the original.
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class StoredBatch:
    base_offset: int
    count: int
    timestamp_us: int
    payload: bytes

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count


@dataclass(frozen=True, slots=True)
class LogOffsets:
    #: Earliest offset still stored (the hot low mark ``L(p)``).
    low: int
    #: Next offset to be assigned (the high watermark ``HW(p)``).
    high: int
    #: Payload bytes stored for the partition (approximate for some backends).
    size_bytes: int = 0

    def bytes_from(self, offset: int) -> int:
        """Estimated stored bytes of ``[offset, high)``: ``size_bytes`` pro rata of the
        records held (0 when nothing at or above ``offset`` is held)."""
        held = self.high - self.low
        behind = self.high - max(offset, self.low)
        if held <= 0 or behind <= 0:
            return 0
        return self.size_bytes * behind // held


class HotLog(ABC):
    """A durable, offset-addressed log per table partition."""

    #: Short name used in config (``TIDEGATE_HOT__TYPE``).
    name: str = ""
    #: Whether several gateway processes write this tier at once (each records the high
    #: watermarks it acknowledged only every so often: see ``AppendOps._reseed``).
    shared: bool = False

    @classmethod
    @abstractmethod
    def from_settings(cls, settings: Settings) -> HotLog:
        """Build the backend from the gateway settings (``settings.hot`` is its section)."""

    @abstractmethod
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
        """Store one batch and assign its offsets atomically.

        Returns only once the batch is durable per the backend's policy (fsync per batch,
        Redis ``appendfsync``...). A crash before returning leaves the batch wholly present
        or wholly absent, never torn.

        Args:
            part: the partition to append to.
            payload: opaque bytes (encoded records).
            count: number of records in ``payload``; must be >= 1, or 0 with a
                ``producer``: an *empty idempotent append*, which stores no batch and
                moves no offset but advances the producer's sequence (a key-table write
                that changed nothing), answered as ``(high watermark, 0)``.
            timestamp_us: append time, microseconds since the epoch (UTC).
            producer: idempotence identity; a batch whose ``(producer_id, sequence)`` was
                already stored for this partition is not stored again.
            floor: the lowest high watermark the caller knows the partition has reached;
                the partition must then exist (see :meth:`open_partition`). None: the
                caller knows nothing of it, and a partition without state is created at
                offset 0 (unless this process saw it before).
            keys: a primary-key table's batch: ``keys[i]`` is the key (its routing bytes,
                opaque here) of record ``i``, at offset ``base_offset + i``; ``len(keys)``
                must be ``count``. The key index (:meth:`latest_offsets`) records each
                key's last change in the batch atomically with it: the two never differ.
            expect_high: store the batch only if the partition's high watermark (the
                next offset to assign) is this one, else store nothing and raise
                :class:`HighWatermarkMoved` (the batch was resolved against an older
                state). A duplicate of a stored producer batch is answered as such first,
                whatever ``expect_high`` says.

        Returns:
            The assigned range; for a duplicate, the original range and ``duplicate=True``
            (the key index is not touched).

        Raises:
            OutOfOrderSequence: ``producer.sequence`` skips one or more sequences.
            UnknownProducer: ``producer.sequence`` is above 0 and the partition holds no
                state of the producer (never seen, or lost with the hot tier's state).
            InvalidIdempotentAppend: the sequence is older than the de-duplication window,
                or the retried batch's record count differs from the stored one.
            HotStateLost: ``floor`` is given and the backend holds no state for the
                partition (it was never opened with :meth:`open_partition`, or its state
                was lost), or its high watermark is below ``floor`` or below one this
                process saw: nothing was stored. The caller opens the partition again at
                a safe offset and retries.
            HighWatermarkMoved: ``expect_high`` is given and is not the high watermark:
                nothing was stored.
            Unavailable: the backend cannot be reached.
            ValueError: ``len(keys)`` is not ``count``.
        """

    @abstractmethod
    def latest_offsets(self, part: PartitionId, keys: Sequence[bytes]) -> list[int | None]:
        """The offset of each key's latest change held in the hot tier, in order: None
        where the key index holds none, or where it lies below the low mark (trimmed or
        tiered away: the caller looks in the cold tier). Every offset answered is below
        the high watermark readers see. Batched: one round trip per segment asked (Redis),
        no I/O but waiting for an in-flight batch to be durable (disk).

        Raises:
            Unavailable: the backend cannot be reached.
        """

    def key_offsets(
        self, part: PartitionId, keys: Sequence[bytes]
    ) -> tuple[list[int | None], str | None]:
        """:meth:`latest_offsets`, with the incarnation of the partition's hot state they
        were read in: a token that changes whenever that state starts over at offsets it
        may have assigned before (re-seeded after a loss) or goes on in a new segment.
        A process that keeps batches by offset (:class:`gateway.core.recent.RecentBatches`)
        drops them when it sees another token, so a re-seed by another gateway never makes
        it answer a record the offset no longer holds. None: only the process holding the
        partition re-seeds it (the disk tier; that process forgets what it kept).

        Raises:
            Unavailable: the backend cannot be reached.
        """
        return self.latest_offsets(part, keys), None

    @abstractmethod
    def key_count(self, part: PartitionId) -> int:
        """Entries the partition's key index holds (for the hot-keys quota). Entries
        below the low mark are pruned when the log is trimmed, and never answered by
        :meth:`latest_offsets`; a Redis partition whose chain has several segments counts
        a key once per segment that holds it."""

    def key_counts(self, parts: Sequence[PartitionId]) -> list[int]:
        """:meth:`key_count` of each of ``parts``, in order (a tenant's hot keys for its
        quota); a backend over the network answers them in one round trip per shard."""
        return [self.key_count(part) for part in parts]

    @abstractmethod
    def open_partition(self, part: PartitionId, floor: int) -> int:
        """Make the partition take appends from ``floor`` on at the lowest: a partition
        without state is created with its high watermark at ``floor``; one whose high
        watermark is below ``floor`` (its state was rolled back) starts over, empty, at
        ``floor``; one already at or above ``floor`` is left as it is. Safe to repeat and to
        race with other processes doing the same.

        Returns:
            The partition's high watermark afterwards (``>= floor``).

        Raises:
            Unavailable: the backend cannot be reached.
        """

    def open_partitions(self, parts: Sequence[PartitionId]) -> None:
        """Open new partitions at offset 0 (a new table's): :meth:`open_partition` each;
        a backend may batch them."""
        for part in parts:
            self.open_partition(part, 0)

    @abstractmethod
    def read(
        self, part: PartitionId, from_offset: int, max_records: int, max_bytes: int
    ) -> list[StoredBatch]:
        """Batches holding offsets from ``from_offset`` on, in offset order.

        The first batch returned is the one that contains ``from_offset`` (it may start
        before it: callers slice). Stops adding batches once ``max_records`` records at or
        after ``from_offset`` or ``max_bytes`` payload bytes are reached, but always returns
        at least one batch when ``from_offset`` is below the high watermark.

        Returns an empty list when ``from_offset`` equals the high watermark.

        Raises:
            OffsetOutOfRange: ``from_offset`` is below the low mark or above the high
                watermark (the error carries both).
            Unavailable: the backend cannot be reached.
        """

    @abstractmethod
    def offsets(self, part: PartitionId) -> LogOffsets:
        """The low mark, high watermark and stored size; ``(0, 0)`` for an empty log."""

    def read_at(
        self, part: PartitionId, from_offset: int, max_records: int, max_bytes: int
    ) -> tuple[LogOffsets, list[StoredBatch]]:
        """:meth:`offsets` (``size_bytes`` may be 0: not looked up) and what :meth:`read`
        answers from ``from_offset``, or no batches where :meth:`read` would raise
        OffsetOutOfRange; a backend over the network answers both in one round trip
        (a stream read needs the marks to check its offset and the batches after it)."""
        o = self.offsets(part)
        if not o.low <= from_offset < o.high:
            return o, []
        return o, self.read(part, from_offset, max_records, max_bytes)

    def offsets_many(self, parts: Sequence[PartitionId]) -> list[LogOffsets]:
        """:meth:`offsets` of each of ``parts``, in order; a backend over the network
        answers them in one round trip (a scan pins every partition at once)."""
        return [self.offsets(part) for part in parts]

    @abstractmethod
    def trim(self, part: PartitionId, below_offset: int) -> int:
        """Delete whole batches that end at or below ``below_offset``.

        A batch that straddles ``below_offset`` is kept, so the low mark after a trim is
        ``<= below_offset``. Trimming never moves the high watermark, and idempotence state
        survives it. Returns the new low mark.
        """

    @abstractmethod
    def drop(self, part: PartitionId) -> None:
        """Delete everything stored for the partition, including producer state."""

    @abstractmethod
    def drop_tenant(self, tenant: str) -> None:
        """Delete whatever is left of ``tenant`` after its partitions were dropped (empty
        folders, stray keys)."""

    @abstractmethod
    def close(self) -> None:
        """Release connections and file handles."""

    def offset_for_time(self, part: PartitionId, timestamp_us: int, low: int = 0) -> int:
        """The base offset of the first batch at or above ``low`` stamped at or after
        ``timestamp_us`` (the high watermark when none is): a binary search on batch
        offsets that reads one batch per step, taking append times as non-decreasing
        along the log."""
        o = self.offsets(part)
        # The answer lies in [lo, hi]; both stay on batch boundaries (or the log's ends).
        lo, hi = max(o.low, min(low, o.high)), o.high
        while lo < hi:
            stored = self.read(part, (lo + hi) // 2, 1, 1)
            if not stored:
                break
            sb = stored[0]
            if sb.timestamp_us >= timestamp_us:
                hi = max(lo, sb.base_offset)
            else:
                lo = min(hi, sb.next_offset)
        return lo

    def needs_trim(self, part: PartitionId, below_offset: int) -> bool:
        """Whether :meth:`trim` below ``below_offset`` would free anything."""
        return self.offsets(part).low < below_offset

    def shard_names(self) -> list[str]:
        """The hot tier's shards, where new partitions may be placed. A backend without
        shards is the one shard ``default``."""
        return ["default"]

    def bind_placements(self, store: PlacementStore) -> None:  # noqa: B027 - optional hook
        """Let a sharded backend read and change partition placements (see
        :mod:`gateway.hot.placement`); a backend without shards ignores it."""

    def held_bytes(self, segments: Sequence[tuple[PartitionId, int, str]]) -> list[int]:
        """Payload bytes held by each ``(partition, seq, shard)`` segment. A backend without
        shards has one segment per partition, its whole hot log."""
        return [self.offsets(part).size_bytes for part, _, _ in segments]


class ShardedHotLog(HotLog):
    """A hot log spread over shards, whose partitions move between them (the operator's
    ``tidegate shard`` jobs and the rebalancer; see :mod:`gateway.hot.placement`). Only a
    backend with shards implements it; :func:`sharded` asks for it by name."""

    @abstractmethod
    def move(self, part: PartitionId, target: str) -> Chain:
        """Move the partition's appends to shard ``target``: seal its active segment and
        open a new one there (no copy); returns the new chain.

        Raises:
            InvalidRequest: no such shard.
        """

    @abstractmethod
    def copy_segment(self, part: PartitionId, seq: int, target: str) -> bool:
        """Copy sealed segment ``seq`` to shard ``target`` and put the copy in its place in
        the chain (the forced drain of a failing shard); False when it is there already."""

    @abstractmethod
    def finish_move(self, part: PartitionId) -> Chain:
        """Finish a move that a crash left under way; returns the partition's chain."""


def sharded(hot: HotLog) -> ShardedHotLog:
    """``hot`` as a :class:`ShardedHotLog`.

    Raises:
        InvalidRequest: the backend has no shards (the disk tier is one node).
    """
    if not isinstance(hot, ShardedHotLog):
        from gateway.wire.errors import InvalidRequest

        raise InvalidRequest(f"the {hot.name} hot tier has no shards to move partitions between")
    return hot
