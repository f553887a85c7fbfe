"""Planning on the driver: the gateway's read plan (one pinned snapshot's data files plus
the hot range per partition) turned into input partitions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import pyarrow as pa

from gateway.client._lake_files import in_warehouse
from gateway.spark._options import Connection, described
from gateway.spark._pushdown import OffsetBounds
from gateway.spark._splits import FileSlice, HotSplit
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import TidegateError
from gateway.wire.filters import Expr, to_text

__all__ = ["PinnedPlan", "fetch_plan"]


@dataclass(frozen=True)
class PinnedPlan:
    """The gateway's plan: data files (by partition and offset) and, per partition, the
    first offset that is not in the pinned snapshot (absent: all of it is)."""

    snapshot_id: int
    files: tuple[FileSlice, ...]
    hot: Mapping[int, tuple[int, int]]
    #: The table's stored schema when the plan was made.
    schema: pa.Schema

    def hot_splits(self, bounds: OffsetBounds) -> list[HotSplit]:
        """The hot ranges the filter's partitions and offsets can keep."""
        out = []
        for p, (start, end) in sorted(self.hot.items()):
            if not bounds.keeps(p):
                continue
            lo, hi = bounds.clamp(start, end)
            if lo < hi:
                out.append(HotSplit(p, lo, hi))
        return out

    def stream_slices(
        self, start: Mapping[int, int], end: Mapping[int, int]
    ) -> tuple[list[FileSlice], list[HotSplit]]:
        """Per partition, ``[start, end)`` split at the pinned tiered watermark: the files
        that hold the cold part (each clamped to the range) and the hot part."""
        files = []
        for f in self.files:
            lo, hi = start.get(f.partition, 0), end.get(f.partition, 0)
            if f.min_offset < hi and f.max_offset >= lo:
                files.append(replace(f, low=lo, high=hi))
        hot = []
        for p, hi in sorted(end.items()):
            lo = start.get(p, hi)
            tiered = self.hot.get(p, (hi, hi))[0]
            if max(lo, tiered) < hi:
                hot.append(HotSplit(p, max(lo, tiered), hi))
        return files, hot


def fetch_plan(
    connection: Connection, row_filter: Expr | None, as_of: str | None, *, unretried: bool = False
) -> PinnedPlan:
    """Ask the gateway for a plan (files pruned by ``row_filter``'s partition values and
    column statistics), or raise a clear error naming the table; ``unretried``: fail at
    once when the gateway is away (the caller rides the outage)."""
    try:
        response: pb.PlanReadResponse = connection.shared(unretried=unretried).plan_read(
            connection.table,
            filter=to_text(row_filter) if row_filter is not None else "",
            as_of=as_of,
        )
    except TidegateError as err:
        raise described(err, f"planning a read of {connection.table}") from None
    # Rows below a partition's earliest offset (retention recorded, not yet removed).
    earliest = {e.partition: e.offset for e in response.earliest_offsets}
    files = tuple(
        FileSlice(
            f.url,
            f.file_size_bytes,
            f.partition,
            f.min_offset,
            f.max_offset,
            earliest[f.partition] if f.min_offset < earliest.get(f.partition, 0) else None,
            local=in_warehouse(connection.warehouse, f.warehouse_path),
        )
        for f in response.files
    )
    hot = {r.partition: (r.from_offset, r.to_offset) for r in response.hot_ranges}
    schema = pa.ipc.open_stream(pa.py_buffer(response.arrow_schema)).schema
    return PinnedPlan(response.snapshot_id, files, hot, schema)
