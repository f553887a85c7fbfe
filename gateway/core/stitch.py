"""The stitch of a stream read across the tiers, as pure functions of what the read sees.

A read of partition ``p`` from ``offset`` sees a :class:`PartitionView`: ``T(p)`` of the
snapshot it reads (offsets below it are in the cold tier), the earliest offset retention
recorded, and the hot tier's low and high marks. :func:`check_offset` says whether the offset
may be read; :func:`stitch_cold` takes the cold part (offsets ``[offset, T(p))`` up to the
limits) from the batches the caller's cold reader yields, and says where the hot part starts.
Neither does I/O: the caller (``ReadOps._read``) reads the tiers, so the rules of the
boundary (no gap, no duplicate, offsets lost with a hot tier's state passed over, a byte cap
that stops the read exactly) are tested as properties of these functions alone
(``tests/core/test_stitch.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from gateway.core.views import fit_bytes
from gateway.wire.errors import OffsetOutOfRange
from gateway.wire.schema import OFFSET_COLUMN

__all__ = ["ColdPart", "PartitionView", "check_offset", "out_of_range", "stitch_cold"]


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What one read sees of one partition."""

    partition: int
    #: ``T(p)`` of the snapshot read: offsets below it are in the cold tier.
    tiered: int
    #: The earliest offset retention recorded (0 when the table never had a retention).
    recorded: int
    #: The hot tier's lowest offset still held, and its high watermark.
    low: int
    high: int

    @property
    def earliest(self) -> int:
        """The lowest offset a read may start at."""
        return max(self.recorded, 0 if self.tiered > 0 else self.low)

    @property
    def latest(self) -> int:
        """The high watermark of the partition across the tiers."""
        return max(self.high, self.tiered)


def check_offset(offset: object, view: PartitionView) -> int:
    """``offset`` as the start of a read.

    Raises:
        OffsetOutOfRange: not an integer, below the earliest offset or above the high
            watermark; the message names the partition and the offsets that may be read.
    """
    earliest, high = view.earliest, view.latest
    if isinstance(offset, bool) or not isinstance(offset, int) or not earliest <= offset <= high:
        raise OffsetOutOfRange(
            out_of_range(offset, view.partition, earliest, high),
            offset=offset if isinstance(offset, int) else -1,
            earliest=earliest,
            latest=high,
        )
    return offset


def out_of_range(offset: object, partition: int, earliest: int, high: int) -> str:
    """Why ``offset`` cannot be read, with what can (one sentence)."""
    span = (
        f"partition {partition} holds offsets {earliest} to {high - 1}"
        if high > earliest
        else f"partition {partition} holds no records yet"
    )
    where = f"{span}; reading at its high watermark {high} returns nothing until more arrive"
    if isinstance(offset, bool) or not isinstance(offset, int):
        return f"offset {offset!r} is not an integer offset: {where}"
    if offset < earliest:
        return f"offset {offset} is no longer kept (retention): {where}"
    return f"offset {offset} is past the end: {where}"


@dataclass(slots=True)
class ColdPart:
    """The cold part of a read and where the hot part starts."""

    batches: list[pa.RecordBatch] = field(default_factory=list)
    #: The offset after the last record taken (where the hot part starts).
    next_offset: int = 0
    #: Records and bytes still allowed for the hot part.
    remaining: int = 0
    nbytes: int = 0
    #: The byte cap was reached: the read ends here.
    full: bool = False

    def hot_from(self, view: PartitionView) -> int | None:
        """The offset the hot part is read from, or None when the read ends here: a limit
        was reached, nothing is left, or the cold part ended below ``T(p)`` (its records
        limit passed over offsets lost with a hot tier's state; the next read goes on
        from ``next_offset`` in the cold tier, never from the hot tier's copy, which may
        be trimmed)."""
        if (
            self.full
            or self.remaining <= 0
            or self.next_offset < view.tiered
            or self.next_offset >= view.high
        ):
            return None
        return self.next_offset


def stitch_cold(
    view: PartitionView,
    offset: int,
    max_records: int,
    max_bytes: int,
    read_cold: Callable[[int, int], Iterable[pa.RecordBatch]] | None,
    lost_through: Callable[[int, int], bool],
) -> ColdPart:
    """Take the cold part of a read from ``offset`` (checked by :func:`check_offset`).

    Args:
        read_cold: ``(start, stop) ->`` the cold tier's batches of offsets ``[start, stop)``
            in offset order, each with its ``_offset`` column (None: no cold tier).
        lost_through: ``(start, end) ->`` whether every offset in ``[start, end)`` that the
            cold tier lacks was recorded as lost with a hot tier's state.

    Raises:
        RuntimeError: the cold tier has a gap that is not recorded as lost (a broken
            snapshot).
    """
    part = ColdPart(next_offset=offset, remaining=max_records)
    if read_cold is not None and offset < view.tiered:
        stop = min(view.tiered, offset + max_records)
        for batch in _contiguous(read_cold(offset, stop)):
            first = batch.column(OFFSET_COLUMN)[0].as_py()
            if first > part.next_offset and lost_through(part.next_offset, first):
                part.next_offset = first  # offsets lost with a hot tier's state
            if first != part.next_offset:
                raise RuntimeError(
                    f"cold tier gap in partition {view.partition}: expected offset "
                    f"{part.next_offset}, found {first}"
                )
            piece = fit_bytes(batch, max_bytes - part.nbytes, not part.batches)
            if piece.num_rows:
                part.batches.append(piece)
                part.remaining -= piece.num_rows
                part.nbytes += piece.nbytes
                part.next_offset += piece.num_rows
            if piece.num_rows < batch.num_rows or part.nbytes >= max_bytes:
                part.full = True
                break
        if not part.full and lost_through(part.next_offset, stop):
            part.next_offset = stop
        if part.next_offset < stop and not part.full:
            raise RuntimeError(
                f"cold tier is missing offsets {part.next_offset}..{stop - 1} of "
                f"partition {view.partition}"
            )
    if view.tiered <= part.next_offset < view.low and not part.full:
        # The hot tier was re-seeded above T(p) after it lost its state, and the lost
        # offsets are not recorded in the cold tier yet: pass over them.
        part.next_offset = view.low
    return part


def _contiguous(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` cut where their offsets jump: a data file written across a range lost
    with a hot tier's state (a compaction of the files on either side, before it kept
    them apart) holds offsets that are not consecutive, and the stitch counts a batch's
    offsets from its first."""
    for batch in batches:
        n = batch.num_rows
        column = batch.column(OFFSET_COLUMN)
        if n < 2 or column[n - 1].as_py() - column[0].as_py() == n - 1:
            yield batch
            continue
        offsets = column.to_numpy(zero_copy_only=False)
        start = 0
        for cut in [*(np.flatnonzero(np.diff(offsets) != 1) + 1).tolist(), n]:
            yield batch.slice(start, cut - start)
            start = cut
