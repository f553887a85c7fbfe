"""Placement of partitions on hot-tier shards: each partition's hot log is a *virtual log*.

As in Delos' virtual consensus, a partition's log is a chain of segments, each stored on
one shard and holding the offsets ``[start, end)``; only the last, active segment (``end``
unknown) takes appends. The chain lives in the metadata store under an epoch that every
change raises (a compare-and-set), so gateways can cache it and reload it when a shard
tells them a segment is sealed.

A move seals the active segment on its shard (from then on the shard refuses appends to
it: the fence), opens the next segment on the target shard at the sealed high watermark,
carrying the producers' de-duplication state, and records the longer chain. Nothing is
copied; sealed segments are dropped once tiering has moved their offsets to Iceberg.

The hot tier sees the metadata store only through :class:`PlacementStore` (the metadata
store implements it): the hot tier and the metadata store sit side by side in the layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Chain", "PlacementStore", "Segment", "SegmentRow"]

#: A segment as the metadata store keeps it: ``(seq, shard, start, end | None)``.
SegmentRow = tuple[int, str, int, int | None]


@dataclass(frozen=True, slots=True)
class Segment:
    """``[start, end)`` of a partition on ``shard``; ``end`` is None while active."""

    seq: int
    shard: str
    start: int
    end: int | None

    @property
    def row(self) -> SegmentRow:
        return (self.seq, self.shard, self.start, self.end)


@dataclass(frozen=True, slots=True)
class Chain:
    """A partition's segments, oldest first, under a placement epoch."""

    epoch: int
    segments: tuple[Segment, ...]
    #: The shard a move under way is taking the partition to.
    move_target: str | None = None

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @classmethod
    def of(cls, epoch: int, rows: Sequence[SegmentRow], move_target: str | None) -> Chain:
        return cls(epoch, tuple(Segment(*r) for r in rows), move_target)

    def index_of(self, offset: int) -> int:
        """Index of the segment holding ``offset``: the last one starting at or before it
        (-1 when ``offset`` is below the first segment's start)."""
        for i in range(len(self.segments) - 1, -1, -1):
            if self.segments[i].start <= offset:
                return i
        return -1


class PlacementStore(Protocol):
    """The metadata store's placement records, as the hot tier uses them."""

    def chain(self, table_id: str, partition: int) -> tuple[int, list[SegmentRow], str | None]:
        """``(epoch, segments, move_target)``. Raises KeyError for an unknown partition."""
        ...

    def chains(self, table_id: str) -> dict[int, tuple[int, list[SegmentRow], str | None]]:
        """Every partition's ``chain`` of a table, by partition, read at once."""
        ...

    def replace_chain(
        self,
        table_id: str,
        partition: int,
        expected_epoch: int,
        segments: Sequence[SegmentRow],
        finish_move: bool,
    ) -> bool:
        """Compare-and-set the chain on the epoch; returns whether it was applied."""
        ...

    def begin_move(self, table_id: str, partition: int, target: str) -> str | None:
        """Record a move's target unless one is under way; returns the one under way."""
        ...
