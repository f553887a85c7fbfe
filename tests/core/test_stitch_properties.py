"""The stitch across the tiers as properties of the pure functions of gateway.core.stitch:
over generated partitions (a tiered watermark, cold files cut anywhere, offsets lost with a
hot tier's state, recorded or not yet, a hot tier trimmed or re-seeded) and generated
limits, a read takes every readable offset from where it starts exactly once, in order,
within its limits, and hands the hot tier exactly the offset the cold part ended at."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.stitch import PartitionView, check_offset, stitch_cold
from gateway.wire.errors import OffsetOutOfRange
from gateway.wire.schema import OFFSET_COLUMN


@dataclass(frozen=True)
class Partition:
    """A model partition: offsets ``[0, high)``; the cold tier holds ``[0, tiered)`` less
    ``lost`` (recorded there as lost), the hot tier ``[low, high)``; offsets in
    ``[tiered, low)`` were lost with the hot tier's state and are not recorded yet."""

    high: int
    tiered: int
    low: int
    lost: tuple[tuple[int, int], ...]
    cuts: frozenset[int]  # where the cold tier's batches start
    #: Batches run across lost ranges (a file compacted across one before compaction kept
    #: them apart): offsets within a batch are then not consecutive.
    spans: bool = False

    def is_lost(self, offset: int) -> bool:
        return any(lo <= offset < hi for lo, hi in self.lost) or self.tiered <= offset < self.low

    def view(self) -> PartitionView:
        return PartitionView(0, self.tiered, 0, self.low, self.high)

    def lost_through(self, start: int, end: int) -> bool:
        return all(any(lo <= o < hi for lo, hi in self.lost) for o in range(start, end))

    def read_cold(self, start: int, stop: int) -> Iterator[pa.RecordBatch]:
        """The cold batches of ``[start, stop)``, cut at ``cuts`` and (unless ``spans``)
        around lost ranges."""
        run: list[int] = []
        for o in range(start, stop):
            if (self.is_lost(o) and not self.spans) or (o in self.cuts and run):
                if run:
                    yield _batch(run)
                run = []
            if not self.is_lost(o):
                run.append(o)
        if run:
            yield _batch(run)


def _batch(offsets: list[int]) -> pa.RecordBatch:
    return pa.record_batch(
        {OFFSET_COLUMN: pa.array(offsets, pa.int64()), "v": [o * 7 for o in offsets]}
    )


@st.composite
def partitions(draw: st.DrawFn) -> Partition:
    high = draw(st.integers(0, 60))
    tiered = draw(st.integers(0, high))
    # The hot tier keeps records below T(p) for a while (trimmed later), or was re-seeded
    # above it after it lost its state.
    low = draw(st.integers(0, high))
    starts = sorted(draw(st.sets(st.integers(0, max(0, tiered - 1)), max_size=4)))
    lost: list[tuple[int, int]] = []
    for s in starts:
        if tiered and (not lost or s > lost[-1][1]):
            lost.append((s, min(tiered, s + draw(st.integers(1, 5)))))
    cuts = frozenset(draw(st.sets(st.integers(0, max(0, tiered)), max_size=10)))
    return Partition(high, tiered, low, tuple(lost), cuts, draw(st.booleans()))


@settings(max_examples=400, deadline=None)
@given(p=partitions(), data=st.data())
def test_a_read_takes_every_readable_offset_once_in_order(
    p: Partition, data: st.DataObject
) -> None:
    view = p.view()
    offset = data.draw(st.integers(view.earliest, view.latest), label="offset")
    max_records = data.draw(st.integers(1, 80), label="max_records")
    max_bytes = data.draw(st.integers(1, 2_000), label="max_bytes")
    assert check_offset(offset, view) == offset
    part = stitch_cold(view, offset, max_records, max_bytes, p.read_cold, p.lost_through)

    taken = [o for b in part.batches for o in b.column(OFFSET_COLUMN).to_pylist()]
    values = [v for b in part.batches for v in b.column("v").to_pylist()]
    assert values == [o * 7 for o in taken]
    # Within the limits: the records, and the bytes but for a first batch of one row.
    assert len(taken) + part.remaining == max_records and len(taken) <= max_records
    assert sum(b.nbytes for b in part.batches) == part.nbytes
    assert part.nbytes <= max_bytes or (len(part.batches) == 1 and len(taken) == 1)
    # Every readable offset from ``offset`` up to where the cold part ended, once, in order.
    assert taken == [o for o in range(offset, part.next_offset) if not p.is_lost(o)]
    assert part.next_offset >= offset
    hot_from = part.hot_from(view)
    if hot_from is None:
        readable_after = [o for o in range(part.next_offset, p.high) if not p.is_lost(o)]
        # The read ends here: a limit was reached, nothing is left anywhere, or the cold
        # part ended below T(p) after passing over lost offsets (the next read goes on).
        assert (
            part.full
            or part.remaining == 0
            or not readable_after
            or (offset < part.next_offset < p.tiered)
        )
    else:
        # The hot part starts exactly where the cold one ended, on an offset the hot tier
        # holds: no gap and no duplicate across the boundary.
        assert hot_from == part.next_offset
        assert max(p.tiered, p.low) <= hot_from < p.high
        assert not part.full and part.remaining > 0


@settings(max_examples=200, deadline=None)
@given(p=partitions(), offset=st.integers(-5, 70) | st.booleans() | st.just("3"))
def test_only_offsets_between_earliest_and_the_high_watermark_are_read(
    p: Partition, offset: object
) -> None:
    view = p.view()
    valid = (
        isinstance(offset, int)
        and not isinstance(offset, bool)
        and view.earliest <= offset <= view.latest
    )
    if valid:
        assert check_offset(offset, view) == offset
    else:
        with pytest.raises(OffsetOutOfRange) as err:
            check_offset(offset, view)
        assert "partition 0" in str(err.value)
        assert err.value.details["earliest"] == view.earliest
        assert err.value.details["latest"] == view.latest


def test_a_cold_gap_not_recorded_as_lost_is_an_error_not_a_silent_skip() -> None:
    p = Partition(high=10, tiered=10, low=10, lost=(), cuts=frozenset())

    def with_gap(start: int, stop: int) -> Iterator[pa.RecordBatch]:
        yield _batch([o for o in range(start, stop) if o != 4])

    with pytest.raises(RuntimeError, match="cold tier gap in partition 0: expected offset 0"):
        stitch_cold(p.view(), 0, 100, 1 << 20, lambda a, b: iter([_batch([1, 2])]), p.lost_through)
    with pytest.raises(RuntimeError, match=r"missing offsets 9\.\.9"):
        stitch_cold(
            p.view(), 0, 100, 1 << 20, lambda a, b: iter([_batch(list(range(9)))]), p.lost_through
        )
    part = stitch_cold(p.view(), 0, 4, 1 << 20, with_gap, p.lost_through)
    assert part.next_offset == 4  # the limit stopped it before the gap: nothing to say yet
