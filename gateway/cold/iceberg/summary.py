"""What a snapshot's summary and a table's metadata say: the tiered watermarks, lost
ranges, properties carried from commit to commit, and our data files as Iceberg's."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from gateway.cold.base import (
    APPLIED_PROPERTY,
    LOST_PROPERTY,
    WATERMARKS_PROPERTY,
    ColdSnapshot,
    DataFile,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table


#: Iceberg's own clean-up of superseded metadata files: each commit writes a new
#: metadata JSON (holding every schema version and the snapshot log), and without these
#: every one is kept forever. The previous versions kept let a reader that loaded a
#: metadata location a few commits ago still open it. Set at create
#: (``TABLE_PROPERTIES``), and on a table created before them at its next commit.
METADATA_PROPERTIES = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
}


def iceberg_data_files(io: Any, metadata: Any, files: Sequence[DataFile]) -> list[Any]:
    """pyiceberg's data files (column sizes, counts and bounds) for ``files``: from the
    Parquet footer their writer handed back when there is one (the file is not read
    again, and the footer's schema is checked against the table's once per commit), else
    from the footer read from storage, as pyiceberg's ``add_files`` does."""
    from pyiceberg.io.pyarrow import (
        _check_pyarrow_schema_compatible,
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_file_to_data_file,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile as IcebergDataFile
    from pyiceberg.manifest import DataFileContent, FileFormat

    schema = metadata.schema()
    plan: Any = None
    mapping: Any = None
    checked: list[pa.Schema] = []
    out = []
    for f in files:
        if f.footer is None:
            out.append(parquet_file_to_data_file(io, metadata, f.path))
            continue
        footer = pq.read_metadata(pa.BufferReader(f.footer))
        arrow = footer.schema.to_arrow_schema()
        if not any(arrow.equals(c, check_metadata=True) for c in checked):
            _check_pyarrow_schema_compatible(schema, arrow, format_version=metadata.format_version)
            checked.append(arrow)
        if plan is None:
            plan = compute_statistics_plan(schema, metadata.properties)
            mapping = parquet_path_to_id_mapping(schema)
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=footer, stats_columns=plan, parquet_column_mapping=mapping
        )
        out.append(
            IcebergDataFile.from_args(
                content=DataFileContent.DATA,
                file_path=f.path,
                file_format=FileFormat.PARQUET,
                partition=stats.partition(metadata.spec(), schema),
                file_size_in_bytes=f.file_size_bytes,
                sort_order_id=None,
                spec_id=metadata.default_spec_id,
                equality_ids=None,
                key_metadata=None,
                **stats.to_serialized_dict(),
            )
        )
    return out


def summary_watermarks(summary: Any) -> dict[int, int]:
    if summary is None:
        return {}
    raw = summary.additional_properties.get(WATERMARKS_PROPERTY)
    if not raw:
        return {}
    return {int(k): int(v) for k, v in json.loads(raw).items()}


def summary_applied(summary: Any) -> dict[int, int]:
    """A state table's ``tidegate.applied`` (empty for any other table)."""
    raw = None if summary is None else summary.additional_properties.get(APPLIED_PROPERTY)
    if not raw:
        return {}
    return {int(k): int(v) for k, v in json.loads(raw).items()}


def summary_lost(summary: Any) -> dict[int, tuple[tuple[int, int], ...]]:
    raw = None if summary is None else summary.additional_properties.get(LOST_PROPERTY)
    if not raw:
        return {}
    return {
        int(p): tuple((int(lo), int(hi)) for lo, hi in ranges)
        for p, ranges in json.loads(raw).items()
    }


def carried_properties(summary: Any) -> dict[str, str]:
    """The properties every new snapshot carries from the current one besides the
    watermarks: the lost ranges."""
    raw = None if summary is None else summary.additional_properties.get(LOST_PROPERTY)
    return {LOST_PROPERTY: raw} if raw else {}


def lost_props(lost: Mapping[int, Sequence[tuple[int, int]]]) -> dict[str, str]:
    if not lost:
        return {}
    doc = {str(p): [list(r) for r in lost[p]] for p in sorted(lost)}
    return {LOST_PROPERTY: json.dumps(doc, separators=(",", ":"))}


def current_snapshot_id(table: Any) -> int | None:
    snap = table.current_snapshot()
    return None if snap is None else int(snap.snapshot_id)


def missing_metadata_properties(table: Table) -> dict[str, str]:
    """The ``METADATA_PROPERTIES`` a table (created before them) lacks."""
    have = table.properties
    return {k: v for k, v in METADATA_PROPERTIES.items() if k not in have}


def cold_snapshot(snap: Any) -> ColdSnapshot:
    if snap is None:
        return ColdSnapshot(None, {}, None)
    return ColdSnapshot(
        snap.snapshot_id,
        summary_watermarks(snap.summary),
        snap.timestamp_ms,
        summary_lost(snap.summary),
        summary_applied(snap.summary),
    )
