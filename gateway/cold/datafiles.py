"""The cold tier's data files as tasks write them: where the warehouse is and how to reach
it (:class:`StorageOptions`, :func:`fs_path`), and the Parquet writer of one partition's
rows (:class:`DataFileWriter`, :func:`write_data_file`). Pure pyarrow: runs in a Spark
task without pyiceberg or a catalog. :mod:`gateway.cold.base` (the interface) re-exports
every public name."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from gateway.cold.values import DataFile
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN

__all__ = [
    "OFFSET_SORT",
    "ROW_GROUP_ROWS",
    "SORTED_KEY",
    "DataFileWriter",
    "StorageOptions",
    "fs_path",
    "write_data_file",
]

#: Parquet key-value metadata of data files written sorted by ``_offset`` (by tiering and
#: compaction): their rows can be streamed in order, a row group at a time.
SORTED_KEY = b"tidegate.sorted"
OFFSET_SORT = b"_offset"
#: Rows per Parquet row group of the files we write: the unit a stream read decodes and
#: prunes by offset bounds. 16k rows keep a short read at a random offset of a large
#: (compacted) file cheap (it decodes one group) at no cost to whole-file reads.
ROW_GROUP_ROWS = 16 * 1024


@dataclass(frozen=True, slots=True)
class StorageOptions:
    """What a task on another process or host needs to write or read warehouse files:
    serialisable, so the Spark driver can ship it to executors. ``properties`` are
    pyiceberg FileIO properties (``s3.endpoint``, ``s3.access-key-id``...)."""

    warehouse: str
    properties: Mapping[str, str] = field(default_factory=dict)

    def filesystem(self) -> tuple[Any, str]:
        """A ``pyarrow.fs.FileSystem`` and the root path for this warehouse.

        Local warehouses get a ``LocalFileSystem``; ``s3://`` ones an ``S3FileSystem``
        configured from ``properties`` (endpoint override for MinIO or moto, keys,
        region, path-style addressing).
        """
        from pyarrow import fs as pafs

        if self.warehouse.startswith(("s3://", "s3a://")):
            p = self.properties
            endpoint = p.get("s3.endpoint")
            scheme = None
            if endpoint and "://" in endpoint:
                scheme, endpoint = endpoint.split("://", 1)
            s3 = pafs.S3FileSystem(
                access_key=p.get("s3.access-key-id"),
                secret_key=p.get("s3.secret-access-key"),
                region=p.get("s3.region") or None,
                endpoint_override=endpoint,
                scheme=scheme or "https",
                force_virtual_addressing=p.get("s3.force-virtual-addressing") == "true",
            )
            return s3, fs_path(self.warehouse)
        return pafs.LocalFileSystem(), fs_path(self.warehouse)


def fs_path(uri: str) -> str:
    """A warehouse URI as a path of :meth:`StorageOptions.filesystem`'s filesystem:
    ``s3://bucket/key`` -> ``bucket/key``, ``file:///a/b`` -> ``/a/b``."""
    from urllib.parse import unquote, urlparse

    if uri.startswith(("s3://", "s3a://")):
        return uri.split("://", 1)[1]
    if uri.startswith("file:"):
        return unquote(urlparse(uri).path)
    return uri


def _leaf_paths(schema: pa.Schema) -> list[str]:
    """The Parquet leaf column paths of ``schema`` (``s.x.list.element``), as the writer
    names them in its per-column options."""
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_metadata(schema, sink)
    meta = pq.read_metadata(pa.BufferReader(sink.getvalue()))
    return [meta.schema.column(i).path for i in range(meta.num_columns)]


def _numpy(column: pa.Array | pa.ChunkedArray) -> Any:
    """A column without nulls as one numpy array (no copy when it is one chunk)."""
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            return column.chunk(0).to_numpy()
        return column.to_numpy()
    return column.to_numpy()


#: Rows of a file's first row group that decide which columns get a dictionary.
_DICTIONARY_SAMPLE = 4096


def _dictionary_columns(schema: pa.Schema, first: pa.Table) -> list[str]:
    """The Parquet columns worth a dictionary, judged on a file's first rows: every
    column but ``_offset`` (it never repeats) and the top-level columns whose first rows
    are mostly distinct (ids, times, measurements), for which a dictionary only costs
    time and bytes. Parquet-mr makes the same call after a column's first page; Arrow's
    writer never does, and would keep a dictionary of every value of a 16k-row group."""
    import pyarrow.compute as pc

    keep = []
    for path in _leaf_paths(schema):
        if path == OFFSET_COLUMN:
            continue
        if path in first.column_names and not pa.types.is_nested(first.schema.field(path).type):
            sample = first.column(path).slice(0, _DICTIONARY_SAMPLE)
            if len(sample) > 1 and pc.count_distinct(sample).as_py() > len(sample) // 2:
                continue
        keep.append(path)
    return keep


class DataFileWriter:
    """Streams the rows of one partition, in increasing offset order, into one new
    Parquet data file in ``folder`` (a :meth:`ColdTable.data_location`), in
    ``file_schema`` (:meth:`ColdTable.file_schema`, which carries the Iceberg field ids).
    Rows are written in row groups of :data:`ROW_GROUP_ROWS` as they come: nothing but
    the current row group is held in memory, and no row is sorted or copied on the
    Python side. Pure pyarrow: runs in a Spark task without pyiceberg or a catalog.

    ``_offset``, and the columns whose first rows are mostly distinct, are written plain
    (:func:`_dictionary_columns`); the others keep Parquet's dictionary encoding. The
    writer's own footer is handed back with the :class:`DataFile`, so the commit builds the Iceberg
    column statistics without reading the file again.

    Use :meth:`write` then :meth:`close` (or :meth:`abort`)."""

    def __init__(
        self,
        options: StorageOptions,
        folder: str,
        file_schema: pa.Schema,
        *,
        filesystem: Any = None,
    ) -> None:
        import uuid

        self.path = f"{folder.rstrip('/')}/{uuid.uuid4().hex}.parquet"
        self.schema = file_schema
        fs = filesystem if filesystem is not None else options.filesystem()[0]
        if not folder.startswith(("s3://", "s3a://")):
            fs.create_dir(fs_path(folder), recursive=True)
        self._filesystem = fs
        self._writer: Any = None  # opened with the first row group (see _open)
        self._out: Any = None
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        #: Rows written so far, and their Arrow bytes.
        self.records = 0
        self.nbytes = 0
        self.partition: int | None = None
        self.min_offset = -1
        self.max_offset = -1

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Add ``batch`` (stored or file schema: user columns then the system columns;
        columns of ``file_schema`` it lacks are written as nulls). Its offsets must be
        increasing and above every offset written before, its partition the file's.

        Raises:
            ValueError: offsets out of order, or a second partition.
        """
        n = batch.num_rows
        if n == 0:
            return
        offsets = _numpy(batch.column(OFFSET_COLUMN))
        if offsets[0] <= self.max_offset or (n > 1 and not (offsets[1:] > offsets[:-1]).all()):
            raise ValueError("a data file's rows must come in increasing offset order")
        parts = batch.column(PARTITION_COLUMN)
        if parts.null_count:
            raise ValueError("a data file's rows need a partition")
        values = _numpy(parts)
        if self.partition is None:
            self.partition = int(values[0])
        if not (values == self.partition).all():
            found = sorted({self.partition, *(int(v) for v in set(values.tolist()))})
            raise ValueError(f"a data file holds one partition, got {found}")
        if self.min_offset < 0:
            self.min_offset = int(offsets[0])
        self.max_offset = int(offsets[-1])
        self._pending.append(
            batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        )
        self._pending_rows += n
        self.records += n
        self.nbytes += batch.nbytes
        if self._pending_rows >= ROW_GROUP_ROWS:
            self._flush(whole_groups=True)

    def _flush(self, *, whole_groups: bool) -> None:
        if not self._pending:
            return
        rows = self._pending[0] if len(self._pending) == 1 else pa.concat_tables(self._pending)
        keep = rows.num_rows % ROW_GROUP_ROWS if whole_groups else 0
        out = rows.slice(0, rows.num_rows - keep)
        self._pending = [rows.slice(rows.num_rows - keep)] if keep else []
        self._pending_rows = keep
        if out.num_rows:
            rows = self._conform(out)
            if self._writer is None:
                self._open(rows)
            self._writer.write_table(rows, row_group_size=ROW_GROUP_ROWS)

    def _open(self, first: pa.Table) -> None:
        """Open the file, choosing the columns to dictionary-encode from its first rows
        (:func:`_dictionary_columns`)."""
        import pyarrow.parquet as pq

        # Flagged as sorted by offset, so readers stream it instead of reading it whole.
        metadata = {**(self.schema.metadata or {}), SORTED_KEY: OFFSET_SORT}
        out = self._filesystem.open_output_stream(fs_path(self.path))
        try:
            self._writer = pq.ParquetWriter(
                out,
                self.schema.with_metadata(metadata),
                compression="zstd",
                use_dictionary=_dictionary_columns(self.schema, first),
            )
        except BaseException:
            out.close()
            raise
        self._out = out

    def _conform(self, rows: pa.Table) -> pa.Table:
        """``rows`` in the file schema: reordered, cast, and columns added to the table
        since the rows' schema was read filled with nulls."""
        if rows.schema.equals(self.schema):
            return rows
        for f in self.schema:
            if f.name not in rows.column_names:
                rows = rows.append_column(f.name, pa.nulls(rows.num_rows, f.type))
        return rows.select(self.schema.names).cast(self.schema)

    def close(self) -> DataFile:
        """Finish the file and return its description for :meth:`ColdTable.commit_tiered`.

        Raises:
            ValueError: no row was written.
        """
        if self.records == 0 or self.partition is None:
            self.abort()
            raise ValueError("a data file needs at least one row")
        try:
            self._flush(whole_groups=False)
            self._writer.close()
            size = self._out.tell()
        finally:
            if self._out is not None:
                self._out.close()
        footer = pa.BufferOutputStream()
        self._writer.writer.metadata.write_metadata_file(footer)
        return DataFile(
            path=self.path,
            partition=self.partition,
            record_count=self.records,
            file_size_bytes=int(size),
            min_offset=self.min_offset,
            max_offset=self.max_offset,
            footer=footer.getvalue().to_pybytes(),
        )

    def abort(self) -> None:
        """Give the file up (what was written stays an orphan until the clean-up)."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        if self._out is not None:
            self._out.close()


def write_data_file(
    options: StorageOptions, folder: str, rows: pa.Table, file_schema: pa.Schema
) -> DataFile:
    """Write ``rows`` (one partition, any order) as one Parquet data file in ``folder``
    (a :meth:`ColdTable.data_location`), sorted by offset and in ``file_schema``
    (:meth:`ColdTable.file_schema`, which carries the Iceberg field ids), and return
    its description for :meth:`ColdTable.commit_tiered`: a :class:`DataFileWriter`
    fed with the rows once sorted (they are not sorted again when they already are).
    Pure pyarrow: runs in a Spark task without pyiceberg or a catalog."""
    if rows.num_rows == 0:
        raise ValueError("a data file needs at least one row")
    offsets = rows.column(OFFSET_COLUMN).to_numpy()
    if not (offsets[1:] > offsets[:-1]).all():
        rows = rows.sort_by(OFFSET_COLUMN)
    writer = DataFileWriter(options, folder, file_schema)
    try:
        writer.write(rows)
    except BaseException:
        writer.abort()
        raise
    return writer.close()
