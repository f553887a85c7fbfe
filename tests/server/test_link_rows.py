"""The rows a file link served: row groups whose column chunks the ranges sent overlap,
each counted once per link (gateway/server/calls/links.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gateway.server.calls.links import FileSpans, LinkRows, served_ranges


@pytest.fixture
def parquet(tmp_path: Path) -> Path:
    """Three row groups of 100, 100 and 50 rows, two columns each."""
    path = tmp_path / "f.parquet"
    t = pa.table({"v": list(range(250)), "s": [f"x{i}" * 20 for i in range(250)]})
    pq.write_table(t, path, row_group_size=100, compression="none")
    return path


def _chunks(path: Path) -> list[tuple[int, int, int]]:
    return list(FileSpans.of(path).spans)


def test_row_groups_are_those_whose_chunks_the_ranges_overlap(parquet: Path) -> None:
    spans = FileSpans.of(parquet)
    assert spans.rows == (100, 100, 50)
    (a0, a1, g0), (b0, b1, g1) = spans.spans[0], spans.spans[2]
    assert (g0, g1) == (0, 1)
    size = parquet.stat().st_size
    assert spans.groups([(0, size)]) == {0, 1, 2}
    assert spans.groups([(0, 4)]) == set()  # the magic bytes: no chunk
    assert spans.groups([(size - 8, size)]) == set()  # the footer's tail
    assert spans.groups([(a0, a0 + 1)]) == {0}
    assert spans.groups([(a1 - 1, b0 + 1)]) == {0, 1}
    assert spans.groups([(b1, b1 + 1)]) == {1}  # the second column of row group 1
    assert spans.groups([(a0, a1), (spans.spans[-1][0], spans.spans[-1][0] + 1)]) == {0, 2}


def test_a_link_counts_each_row_group_once(parquet: Path) -> None:
    rows = LinkRows()
    spans = rows.spans(parquet)
    assert rows.spans(parquet) is spans  # read once
    later = time.time() + 60
    chunks = _chunks(parquet)
    first_col, second_col = chunks[0], chunks[1]
    assert rows.count("link-a", later, spans, [(first_col[0], first_col[1])]) == 100
    # The other column of the same row group, in another request: counted already.
    assert rows.count("link-a", later, spans, [(second_col[0], second_col[1])]) == 0
    size = parquet.stat().st_size
    assert rows.count("link-a", later, spans, [(0, size)]) == 150
    assert rows.count("link-a", later, spans, [(0, size)]) == 0
    # Another link (another plan) to the same file counts its own.
    assert rows.count("link-b", later, spans, [(0, size)]) == 250
    # A link whose memory has expired counts again.
    assert rows.count("link-c", time.time() - 1, spans, [(0, size)]) == 250
    assert rows.count("link-d", later, spans, [(0, 1)]) == 0  # probe
    assert rows.count("link-c", later, spans, [(0, size)]) == 250


def test_served_ranges_follow_the_range_header() -> None:
    assert served_ranges(200, "bytes=0-9", 100) == [(0, 100)]
    assert served_ranges(206, None, 100) == [(0, 100)]
    assert served_ranges(206, "bytes=0-9", 100) == [(0, 10)]
    assert served_ranges(206, "bytes=90-", 100) == [(90, 100)]
    assert served_ranges(206, "bytes=-8", 100) == [(92, 100)]
    assert served_ranges(206, "bytes=95-200", 100) == [(95, 100)]
    assert served_ranges(206, "bytes=0-1, 50-59", 100) == [(0, 2), (50, 60)]
    assert served_ranges(206, "bytes=100-", 100) == []
