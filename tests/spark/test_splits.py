"""How a read plan becomes Spark input partitions: files packed as Spark's file sources
pack them, hot ranges cut by record count (pure planning, no Spark session)."""

from __future__ import annotations

import pytest

from gateway.spark._splits import OPEN_COST, FileSlice, FilesSplit, HotSplit, plan_splits

pytestmark = [pytest.mark.spark]

MIB = 1 << 20


def _files(*sizes: int) -> list[FileSlice]:
    return [FileSlice(f"/f{i}", size, i, 0, 9) for i, size in enumerate(sizes)]


def _grouping(splits: list[object]) -> list[list[str]]:
    return [[f.url for f in s.files] for s in splits if isinstance(s, FilesSplit)]


def test_a_few_small_files_are_spread_over_min_partitions() -> None:
    # Four files of half a MiB: without the opening cost they would make one split
    # (one core busy), as the connector did before; Spark's rule makes two.
    files = _files(*[MIB // 2] * 4)
    splits = plan_splits(files, [], split_bytes=128 * MIB, min_partitions=2, hot_split_records=10)
    assert _grouping(splits) == [["/f0", "/f1"], ["/f2", "/f3"]]


def test_large_files_are_split_at_split_bytes_and_tiny_split_bytes_gives_a_file_each() -> None:
    files = _files(100 * MIB, 20 * MIB, 20 * MIB, 1 * MIB)
    splits = plan_splits(files, [], split_bytes=128 * MIB, min_partitions=1, hot_split_records=10)
    # Each file counts its size plus the opening cost; a split closes before it would
    # pass 128 MiB (f0 and f1 fill it to exactly 128 MiB).
    assert 100 * MIB + OPEN_COST + 20 * MIB + OPEN_COST == 128 * MIB
    assert _grouping(splits) == [["/f0", "/f1"], ["/f2", "/f3"]]
    one_each = plan_splits(files, [], split_bytes=1, min_partitions=2, hot_split_records=10)
    assert _grouping(one_each) == [["/f0"], ["/f1"], ["/f2"], ["/f3"]]


def test_min_partitions_shrinks_the_splits_of_a_small_table() -> None:
    files = _files(*[MIB] * 8)
    for wanted in (1, 2, 4, 8):
        splits = plan_splits(
            files, [], split_bytes=128 * MIB, min_partitions=wanted, hot_split_records=10
        )
        assert len(splits) == wanted
        assert sorted(u for g in _grouping(splits) for u in g) == sorted(f.url for f in files)


def test_hot_ranges_are_cut_by_records_after_the_files() -> None:
    splits = plan_splits(
        _files(MIB),
        [HotSplit(0, 5, 30), HotSplit(1, 0, 3)],
        split_bytes=128 * MIB,
        min_partitions=2,
        hot_split_records=10,
    )
    assert splits[1:] == [
        HotSplit(0, 5, 15),
        HotSplit(0, 15, 25),
        HotSplit(0, 25, 30),
        HotSplit(1, 0, 3),
    ]
    assert plan_splits([], [], split_bytes=1, min_partitions=2, hot_split_records=1) == []
