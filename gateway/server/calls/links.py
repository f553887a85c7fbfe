"""What a read plan's file link served, in rows: the row groups of a Parquet file whose
column chunks the byte ranges sent overlap, each counted once per link.

A link (``/v1/files/<token>``) is read by range requests: the footer, then the column
chunks a reader keeps, coalesced by its reader (pyarrow's pre-buffering, parquet-mr), in
one request or several per row group, and by a stream read a few row groups at a time
over many requests. A row group's rows are the rows served once any of its column chunks
is; the link's token remembers which were counted (:class:`LinkRows`, for as long as the
link lives or until the memory below is full), so a reader that fetches a row group's
columns in two requests, or reads the same rows twice through one plan, is metered them
once, and a footer read or a probe none. docs/decisions/client.md has why serving counts.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

__all__ = ["FileSpans", "LinkRows", "served_ranges"]

#: Files whose row-group spans are kept (a data file never changes once written).
_FILES_KEPT = 512
#: Links whose counted row groups are kept; past it, the oldest are forgotten (a row
#: group read again through a forgotten link is counted again).
_LINKS_KEPT = 16_384


@dataclass(frozen=True)
class FileSpans:
    """A Parquet file's column chunks as byte spans, sorted by start, each with its row
    group, and each row group's rows."""

    starts: tuple[int, ...]
    spans: tuple[tuple[int, int, int], ...]  # (start, end, row group)
    rows: tuple[int, ...]

    @classmethod
    def of(cls, path: Path) -> FileSpans:
        meta = pq.read_metadata(path)
        spans = []
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            for c in range(group.num_columns):
                col = group.column(c)
                start = col.data_page_offset
                if col.has_dictionary_page and col.dictionary_page_offset is not None:
                    start = min(start, col.dictionary_page_offset)
                spans.append((start, start + col.total_compressed_size, rg))
        spans.sort()
        rows = tuple(meta.row_group(rg).num_rows for rg in range(meta.num_row_groups))
        return cls(tuple(s[0] for s in spans), tuple(spans), rows)

    def groups(self, ranges: list[tuple[int, int]]) -> set[int]:
        """The row groups with a column chunk that overlaps one of ``ranges`` (``[start,
        end)`` each)."""
        out: set[int] = set()
        for lo, hi in ranges:
            # Chunks starting before ``hi``; walk back while they may still reach ``lo``
            # (chunks do not overlap, so the walk stops at the first that ends by ``lo``).
            i = bisect.bisect_left(self.starts, hi) - 1
            while i >= 0 and self.spans[i][1] > lo:
                out.add(self.spans[i][2])
                i -= 1
        return out


class LinkRows:
    """Counts the rows a link serves: each row group of its file once per link."""

    def __init__(self) -> None:
        self._files: OrderedDict[tuple[str, int, int], FileSpans] = OrderedDict()
        self._links: OrderedDict[bytes, tuple[float, set[int]]] = OrderedDict()
        self._lock = threading.Lock()

    def spans(self, path: Path) -> FileSpans:
        """The file's spans (read from its footer once; a blocking call)."""
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            found = self._files.get(key)
            if found is not None:
                self._files.move_to_end(key)
                return found
        spans = FileSpans.of(path)
        with self._lock:
            self._files[key] = spans
            while len(self._files) > _FILES_KEPT:
                self._files.popitem(last=False)
        return spans

    def count(
        self, token: str, expires: float, spans: FileSpans, ranges: list[tuple[int, int]]
    ) -> int:
        """The rows of the row groups ``ranges`` overlap that ``token`` had not served
        yet; ``expires``: when the link stops working (Unix time)."""
        groups = spans.groups(ranges)
        if not groups:
            return 0
        key = hashlib.blake2b(token.encode(), digest_size=16).digest()
        now = time.time()
        with self._lock:
            ends, seen = self._links.pop(key, (expires, set()))
            if ends <= now:  # the link has expired: what it served is forgotten
                seen = set()
            fresh = groups - seen
            seen |= fresh
            self._links[key] = (expires, seen)
            while self._links:
                oldest, (ends, _) = next(iter(self._links.items()))
                if len(self._links) <= _LINKS_KEPT and ends > now:
                    break
                del self._links[oldest]
        return sum(spans.rows[rg] for rg in fresh)


def served_ranges(status: int, range_header: str | None, size: int) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` of a file of ``size`` bytes that an answer of
    ``status`` to a ``Range`` header sent (200: the whole file)."""
    if status == 200 or not range_header:
        return [(0, size)]
    unit, _, specs = range_header.partition("=")
    if unit.strip().lower() != "bytes":
        return [(0, size)]
    out = []
    for spec in specs.split(","):
        first, dash, last = (s.strip() for s in spec.partition("-"))
        if not dash:
            continue
        if not first:  # a suffix: the last N bytes
            if last.isdigit() and int(last) > 0:
                out.append((max(0, size - int(last)), size))
        elif first.isdigit() and int(first) < size:
            end = size if not last.isdigit() else min(size, int(last) + 1)
            if end > int(first):
                out.append((int(first), end))
    return out
