"""The files of an Iceberg REST catalog scan plan on an Iceberg table (see
:mod:`gateway.cold.plans`): the snapshot's data files turned into the spec's content-file
JSON, and the hot-tail files written and named again under ``tidegate-plans/``."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from gateway.cold.base import ColdSnapshot, DataFileWriter, StorageOptions, fs_path
from gateway.cold.iceberg.filters import to_pyiceberg
from gateway.cold.plans import PLANS_FOLDER, HotFile, PlanFiles
from gateway.wire.errors import InvalidRequest, SnapshotNotFound
from gateway.wire.schema import PARTITION_COLUMN

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from gateway.wire.filters import Expr

__all__ = ["IcebergPlanFiles", "PlanHome", "content_file"]

#: Footers of hot-tail files named again, kept per process: (path, size) -> footer.
_FOOTERS = 1024
_footers: OrderedDict[tuple[str, int], pq.FileMetaData] = OrderedDict()
_footers_lock = threading.Lock()


class PlanHome(Protocol):
    """What plans need of the Iceberg table they plan (its own parts: this module never
    imports the table's)."""

    stored_schema: pa.Schema

    @property
    def location(self) -> str: ...

    def file_schema(self) -> pa.Schema: ...

    def _tasks(self, snap: ColdSnapshot, prune: Any) -> list[Any]: ...

    def _load_for(self, snap: ColdSnapshot) -> Table: ...

    def _load(self) -> Table: ...


class PlanStore(Protocol):
    def filesystem(self) -> Any: ...

    def storage_options(self) -> StorageOptions: ...


def _json_value(kind: Any, raw: bytes) -> Any:
    """A bound's bytes as the spec's single-value JSON; None when it has none (NaN,
    infinities, a type without one)."""
    from pyiceberg.conversions import from_bytes, to_json
    from pyiceberg.types import BinaryType, DoubleType, FixedType, FloatType, UUIDType

    try:
        value: Any = from_bytes(kind, raw)
        if isinstance(kind, UUIDType):
            return str(uuid.UUID(bytes=bytes(value)))
        if isinstance(kind, BinaryType | FixedType):
            return bytes(value).hex().upper()
        if isinstance(kind, FloatType | DoubleType) and not math.isfinite(value):
            return None
        return to_json(kind, value)
    except Exception:
        return None


def _count_map(counts: Mapping[int, int] | None, keep: set[int]) -> dict[str, list[int]] | None:
    if not counts:
        return None
    keys = sorted(k for k in counts if k in keep)
    return {"keys": keys, "values": [int(counts[k]) for k in keys]} if keys else None


def _value_map(
    bounds: Mapping[int, bytes] | None, keep: set[int], schema: Schema
) -> dict[str, list[Any]] | None:
    if not bounds:
        return None
    keys, values = [], []
    for k in sorted(bounds):
        if k not in keep:
            continue
        value = _json_value(schema.find_field(k).field_type, bounds[k])
        if value is not None:
            keys.append(k)
            values.append(value)
    return {"keys": keys, "values": values} if keys else None


def content_file(
    *,
    path: str,
    partition: Sequence[Any],
    spec_id: int,
    file_size_in_bytes: int,
    record_count: int,
    stats: Mapping[str, Any],
    schema: Schema,
    keep: set[int],
) -> dict[str, Any]:
    """The spec's ``DataFile`` JSON of a Parquet data file; ``stats`` holds pyiceberg's
    ``column_sizes``, ``value_counts``, ``null_value_counts``, ``nan_value_counts``,
    ``lower_bounds``, ``upper_bounds`` (by field id) and ``split_offsets``; only the fields
    ``keep`` get column statistics."""
    out: dict[str, Any] = {
        "content": "data",
        "file-path": path,
        "file-format": "parquet",
        "spec-id": int(spec_id),
        "partition": list(partition),
        "file-size-in-bytes": int(file_size_in_bytes),
        "record-count": int(record_count),
    }
    splits = stats.get("split_offsets")
    if splits:
        out["split-offsets"] = [int(s) for s in splits]
    for key, name in (
        ("column_sizes", "column-sizes"),
        ("value_counts", "value-counts"),
        ("null_value_counts", "null-value-counts"),
        ("nan_value_counts", "nan-value-counts"),
    ):
        counts = _count_map(stats.get(key), keep)
        if counts is not None:
            out[name] = counts
    for key, name in (("lower_bounds", "lower-bounds"), ("upper_bounds", "upper-bounds")):
        values = _value_map(stats.get(key), keep, schema)
        if values is not None:
            out[name] = values
    return out


def _stats_of(f: Any) -> dict[str, Any]:
    return {
        "column_sizes": f.column_sizes,
        "value_counts": f.value_counts,
        "null_value_counts": f.null_value_counts,
        "nan_value_counts": f.nan_value_counts,
        "lower_bounds": f.lower_bounds,
        "upper_bounds": f.upper_bounds,
        "split_offsets": f.split_offsets,
    }


def _file_name(start: int, end: int, written_ms: int) -> str:
    """``<start>-<end>-<written>.parquet``: the offsets and when it was written (Unix ms),
    so a file written again for the same range never replaces one a clean-up may be
    deleting at that moment."""
    return f"{start:020d}-{end:020d}-{written_ms:013d}.parquet"


def _parse_name(name: str) -> tuple[int, int, int] | None:
    stem, _, ext = name.partition(".")
    parts = stem.split("-")
    if ext != "parquet" or len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


class IcebergPlanFiles(PlanFiles):
    """The files of catalog scan plans of one Iceberg table."""

    def __init__(self, table: PlanHome, store: PlanStore) -> None:
        self._table = table
        self._store = store

    # -- the snapshot's data files ----------------------------------------------------
    def data_files(
        self, snap: ColdSnapshot, row_filter: Expr | None, stats_fields: Sequence[str]
    ) -> list[dict[str, Any]]:
        if snap.snapshot_id is None:
            return []
        t = self._table
        metadata = t._load_for(snap).metadata
        schema = metadata.schema()
        keep = self._keep(schema, stats_fields)
        prune = to_pyiceberg(row_filter, t.stored_schema)
        tasks = sorted(
            t._tasks(snap, prune),
            key=lambda task: (int(task.file.partition[0]), str(task.file.file_path)),
        )
        return [self._content_file(metadata, schema, task.file, keep) for task in tasks]

    def added_files(
        self, start_id: int, end_id: int, row_filter: Expr | None, stats_fields: Sequence[str]
    ) -> list[dict[str, Any]]:
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
        from pyiceberg.table.snapshots import Operation

        table = self._table._load()
        metadata = table.metadata
        for which, sid in (("start-snapshot-id", start_id), ("end-snapshot-id", end_id)):
            if metadata.snapshot_by_id(sid) is None:
                raise SnapshotNotFound(
                    f"{which} {sid} names no snapshot of this table", as_of=str(sid)
                )
        lineage = []
        at = metadata.snapshot_by_id(end_id)
        while at is not None and at.snapshot_id != start_id:
            lineage.append(at)
            parent = at.parent_snapshot_id
            at = metadata.snapshot_by_id(parent) if parent is not None else None
        if at is None:
            raise InvalidRequest(
                f"start-snapshot-id {start_id} is not an ancestor of end-snapshot-id "
                f"{end_id} (or the snapshots between them have expired): an incremental "
                "scan reads the appends after start up to end on end's lineage"
            )
        schema = metadata.schema()
        keep = self._keep(schema, stats_fields)
        may_match = self._evaluator(row_filter)
        found = []
        for snap in lineage:
            summary = snap.summary
            if summary is None or summary.operation != Operation.APPEND:
                continue
            for manifest in snap.manifests(table.io):
                if (
                    manifest.content != ManifestContent.DATA
                    or manifest.added_snapshot_id != snap.snapshot_id
                ):
                    continue
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    f = entry.data_file
                    if entry.status != ManifestEntryStatus.ADDED or (
                        may_match is not None and not may_match(f.record_count, _stats_of(f))
                    ):
                        continue
                    found.append(f)
        found.sort(key=lambda f: (int(f.partition[0]), str(f.file_path)))
        return [self._content_file(metadata, schema, f, keep) for f in found]

    def snapshot_columns(self, snapshot_id: int) -> list[str]:
        metadata = self._table._load().metadata
        snap = metadata.snapshot_by_id(snapshot_id)
        if snap is None:
            raise SnapshotNotFound(
                f"snapshot-id {snapshot_id} names no snapshot of this table",
                as_of=str(snapshot_id),
            )
        schema_id = snap.schema_id if snap.schema_id is not None else metadata.current_schema_id
        for schema in metadata.schemas:
            if schema.schema_id == schema_id:
                return [f.name for f in schema.fields]
        return [f.name for f in metadata.schema().fields]

    @staticmethod
    def _content_file(metadata: Any, schema: Schema, f: Any, keep: set[int]) -> dict[str, Any]:
        """The spec's ``DataFile`` JSON of a pyiceberg data file of the table."""
        spec = metadata.specs()[f.spec_id]
        partition = [
            _json_value_of(schema, spec, i, f.partition[i]) for i in range(len(spec.fields))
        ]
        return content_file(
            path=str(f.file_path),
            partition=partition,
            spec_id=f.spec_id,
            file_size_in_bytes=f.file_size_in_bytes,
            record_count=f.record_count,
            stats=_stats_of(f),
            schema=schema,
            keep=keep,
        )

    @staticmethod
    def _keep(schema: Schema, names: Sequence[str]) -> set[int]:
        keep: set[int] = set()
        for name in names:
            field = schema.find_field(name)
            keep.add(field.field_id)
            keep.update(_nested_ids(field.field_type))
        return keep

    # -- the hot tail ------------------------------------------------------------------
    def _folder(self, partition: int) -> str:
        return f"{self._table.location}/{PLANS_FOLDER}/{PARTITION_COLUMN}={int(partition)}"

    def _existing(self, fs: Any, folder: str) -> dict[tuple[int, int], tuple[str, int, float]]:
        """The youngest file of the folder per offset range: (path, size, when written)."""
        from pyarrow import fs as pafs

        out: dict[tuple[int, int], tuple[str, int, float]] = {}
        for info in fs.get_file_info(pafs.FileSelector(fs_path(folder), allow_not_found=True)):
            if info.type != pafs.FileType.File:
                continue
            parsed = _parse_name(info.base_name)
            if parsed is None:
                continue
            lo, hi, written_ms = parsed
            known = out.get((lo, hi))
            if known is None or known[2] < written_ms / 1000:
                path = f"{folder}/{info.base_name}"
                out[(lo, hi)] = (path, int(info.size or 0), written_ms / 1000)
        return out

    @staticmethod
    def _next_file(
        existing: dict[tuple[int, int], tuple[str, int, float]], at: int, end: int, young: float
    ) -> int | None:
        """The end of the longest file written earlier that starts at ``at``, ends
        within ``end`` and is younger than ``young`` (a Unix time); None when none."""
        ends = [
            hi for (lo, hi), (_, _, mtime) in existing.items()
            if lo == at and at < hi <= end and mtime > young
        ]  # fmt: skip
        return max(ends) if ends else None

    def covered(self, partition: int, start: int, end: int, reuse_age_s: float) -> int:
        if end <= start:
            return end
        existing = self._existing(self._store.filesystem(), self._folder(partition))
        young = time.time() - reuse_age_s
        at = start
        while at < end:
            hi = self._next_file(existing, at, end, young)
            if hi is None:
                return at
            at = hi
        return at

    def hot_files(
        self,
        partition: int,
        start: int,
        end: int,
        rows: Callable[[int, int], Iterator[pa.RecordBatch]],
        stats_fields: Sequence[str],
        reuse_age_s: float,
        row_filter: Expr | None = None,
    ) -> list[HotFile]:
        if end <= start:
            return []
        may_match = self._evaluator(row_filter)
        fs = self._store.filesystem()
        folder = self._folder(partition)
        existing = self._existing(fs, folder)
        metadata = self._table._load().metadata
        schema = metadata.schema()
        keep = self._keep(schema, stats_fields)
        young = time.time() - reuse_age_s
        out: list[HotFile] = []
        at = start
        while at < end:
            found = self._next_file(existing, at, end, young)
            if found is not None:
                hi = found
                path, size, _ = existing[(at, hi)]
                footer = self._footer(fs, path, size)
                written = 0
            else:
                hi = end
                path, size, footer = self._write(fs, folder, partition, at, hi, rows)
                written = size
            stats = _footer_stats(footer, schema, metadata.properties)
            at, start_at = hi, at
            if may_match is not None and not may_match(footer.num_rows, stats):
                continue
            out.append(
                HotFile(
                    partition,
                    start_at,
                    hi,
                    content_file(
                        path=path,
                        partition=[int(partition)],
                        spec_id=metadata.default_spec_id,
                        file_size_in_bytes=size,
                        record_count=footer.num_rows,
                        stats=stats,
                        schema=schema,
                        keep=keep,
                    ),
                    written,
                )
            )
        return out

    def _evaluator(self, row_filter: Expr | None) -> Callable[[int, dict[str, Any]], bool] | None:
        """Whether a file of that many rows and these statistics may hold rows that
        ``row_filter`` keeps (pyiceberg's metrics evaluation, as its own planning prunes
        data files); None without a filter."""
        if row_filter is None:
            return None
        from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

        schema = self._table._load().schema()
        evaluator = _InclusiveMetricsEvaluator(
            schema, to_pyiceberg(row_filter, self._table.stored_schema)
        )

        def may_match(rows: int, stats: dict[str, Any]) -> bool:
            f = DataFile.from_args(
                content=DataFileContent.DATA,
                file_path="",
                file_format=FileFormat.PARQUET,
                **{**stats, "record_count": rows},
            )
            return bool(evaluator.eval(f))

        return may_match

    @staticmethod
    def _footer(fs: Any, path: str, size: int) -> pq.FileMetaData:
        key = (path, size)
        with _footers_lock:
            hit = _footers.get(key)
            if hit is not None:
                _footers.move_to_end(key)
                return hit
        with fs.open_input_file(fs_path(path)) as source:
            meta = pq.ParquetFile(source).metadata
        with _footers_lock:
            _footers[key] = meta
            while len(_footers) > _FOOTERS:
                _footers.popitem(last=False)
        return meta

    def _write(
        self,
        fs: Any,
        folder: str,
        partition: int,
        start: int,
        end: int,
        rows: Callable[[int, int], Iterator[pa.RecordBatch]],
    ) -> tuple[str, int, pq.FileMetaData]:
        """Write offsets ``[start, end)`` as ``<folder>/<start>-<end>.parquet``: in place
        on object storage (a PUT is atomic), through a temporary name and a rename on a
        file system, so a reader never sees half a file."""
        final = f"{folder}/{_file_name(start, end, int(time.time() * 1000))}"
        local = not folder.startswith(("s3://", "s3a://"))
        writer = DataFileWriter(
            self._store.storage_options(), folder, self._table.file_schema(), filesystem=fs
        )
        writer.path = f"{final}.{uuid.uuid4().hex}.tmp" if local else final
        try:
            for batch in rows(start, end):
                writer.write(batch)
            written = writer.close()
        except BaseException:
            writer.abort()
            if local and _exists(fs, writer.path):
                fs.delete_file(fs_path(writer.path))
            raise
        if local:
            fs.move(fs_path(writer.path), fs_path(final))
        assert written.footer is not None
        footer = pq.read_metadata(pa.BufferReader(written.footer))
        with _footers_lock:
            _footers[(final, written.file_size_bytes)] = footer
        return final, written.file_size_bytes, footer


def _exists(fs: Any, path: str) -> bool:
    from pyarrow import fs as pafs

    return bool(fs.get_file_info(fs_path(path)).type != pafs.FileType.NotFound)


def _nested_ids(kind: Any) -> list[int]:
    """The ids of every field nested in an Iceberg type (none for a primitive)."""
    if kind.is_primitive:
        return []
    out = []
    for f in kind.fields if hasattr(kind, "fields") else ():
        out.append(f.field_id)
        out.extend(_nested_ids(f.field_type))
    for attr in ("element_field", "key_field", "value_field"):
        f = getattr(kind, attr, None)
        if f is not None:
            out.append(f.field_id)
            out.extend(_nested_ids(f.field_type))
    return out


def _json_value_of(schema: Schema, spec: Any, index: int, value: Any) -> Any:
    """A partition value as the spec's single-value JSON."""
    from pyiceberg.conversions import to_json

    if value is None:
        return None
    field = spec.fields[index]
    kind = field.transform.result_type(schema.find_field(field.source_id).field_type)
    return to_json(kind, value)


def _footer_stats(
    footer: pq.FileMetaData, schema: Schema, properties: Mapping[str, str]
) -> dict[str, Any]:
    """pyiceberg's column statistics of a Parquet file from its footer (what a commit
    would record for it)."""
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )

    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer,
        stats_columns=compute_statistics_plan(schema, dict(properties)),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return stats.to_serialized_dict()
