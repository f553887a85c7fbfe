"""Which readers apply Iceberg v2 delete files: the check behind the choice of
copy-on-write for primary-key tables (docs/decisions/primary-keys.md, issue 42).

An Iceberg v2 table gets a positional delete file and then an equality delete file, each
committed as its own snapshot the way an engine that writes merge-on-read commits them;
pyiceberg's ``scan().to_arrow()`` and DuckDB's ``iceberg`` extension then read it. What
each applies is pinned here, so that a reader upgrade that changes the answer fails this
test and the decision is looked at again. pyiceberg 0.12 writes neither kind of delete
file (its ``delete`` and ``upsert`` rewrite data files), so the files are written here
with pyarrow and committed through pyiceberg's snapshot producer with a delete manifest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import Record

from tests.cold.helpers import extension_file

#: Field ids the Iceberg spec reserves for a positional delete file's columns.
_FILE_PATH_ID = 2147483546
_POS_ID = 2147483545

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])


class _DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer, writing a manifest of delete files."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _AddDeleteFiles(_FastAppendFiles):
    """A snapshot that adds delete files (in a delete manifest) and keeps every manifest
    of its parent, as a merge-on-read writer's commit does."""

    def __init__(self, files: list[DataFile], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._delete_files = files

    def _manifests(self) -> list[ManifestFile]:
        kept = super()._manifests()
        writer = _DeleteManifestWriter(
            self._transaction.table_metadata.spec(),
            self.schema(),
            self.new_manifest_output(),
            self._snapshot_id,
            self._compression,
        )
        with writer:
            for f in self._delete_files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self._snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=f,
                    )
                )
        return [writer.to_manifest_file(), *kept]


def _with_id(field: pa.Field, field_id: int) -> pa.Field:
    return field.with_metadata({b"PARQUET:field_id": str(field_id).encode()})


def _commit_delete_file(table: Table, rows: pa.Table, path: Path, **fields: Any) -> None:
    pq.write_table(rows, path)
    delete_file = DataFile.from_args(
        _table_format_version=2,
        file_path=f"file://{path}",
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=rows.num_rows,
        file_size_in_bytes=os.path.getsize(path),
        **fields,
    )
    with table.transaction() as tx:
        _AddDeleteFiles(
            [delete_file], operation=Operation.DELETE, transaction=tx, io=table.io
        ).commit()


def _duckdb_ids(table: Table) -> list[int]:
    import duckdb

    con = duckdb.connect()
    try:
        for name in ("avro", "iceberg"):
            con.execute(f"INSTALL '{extension_file(name)}'")
            con.execute(f"LOAD {name}")
        location = table.metadata_location.removeprefix("file://")
        rows = con.execute("SELECT id FROM iceberg_scan(?) ORDER BY id", [location]).fetchall()
        return [r[0] for r in rows]
    finally:
        con.close()


def _pyiceberg_ids(table: Table) -> list[int]:
    ids: list[int] = table.scan().to_arrow().sort_by("id").column("id").to_pylist()
    return ids


@pytest.fixture
def table(tmp_path: Path) -> Table:
    """A v2 table of ids 0..4 in one data file."""
    catalog = SqlCatalog(
        "readers", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh"
    )
    catalog.create_namespace("ns")
    t = catalog.create_table("ns.t", schema=SCHEMA, properties={"format-version": "2"})
    t.append(pa.table({"id": [0, 1, 2, 3, 4], "v": list("abcde")}, schema=SCHEMA))
    return catalog.load_table("ns.t")


def test_positional_deletes_are_applied_by_pyiceberg_and_duckdb(
    table: Table, tmp_path: Path
) -> None:
    (task,) = table.scan().plan_files()
    data_path = task.file.file_path
    positions = pa.table(
        [pa.array([data_path, data_path]), pa.array([1, 3], pa.int64())],
        schema=pa.schema(
            [
                _with_id(pa.field("file_path", pa.string(), nullable=False), _FILE_PATH_ID),
                _with_id(pa.field("pos", pa.int64(), nullable=False), _POS_ID),
            ]
        ),
    )
    _commit_delete_file(
        table,
        positions,
        tmp_path / "positions.parquet",
        content=DataFileContent.POSITION_DELETES,
    )
    table.refresh()
    assert _pyiceberg_ids(table) == [0, 2, 4]
    assert _duckdb_ids(table) == [0, 2, 4]
    # The data file is unchanged: a reader that reads data files only (the gateway's
    # cold reads, both Spark connectors) would still see rows 1 and 3.
    (task,) = table.scan().plan_files()
    assert len(task.delete_files) == 1
    assert pq.read_table(task.file.file_path.removeprefix("file://")).num_rows == 5


def test_equality_deletes_are_applied_by_duckdb_and_refused_by_pyiceberg(
    table: Table, tmp_path: Path
) -> None:
    keys = pa.table(
        [pa.array([2], pa.int64())],
        schema=pa.schema([_with_id(pa.field("id", pa.int64(), nullable=False), 1)]),
    )
    _commit_delete_file(
        table,
        keys,
        tmp_path / "equality.parquet",
        content=DataFileContent.EQUALITY_DELETES,
        equality_ids=[1],
    )
    table.refresh()
    assert _duckdb_ids(table) == [0, 1, 3, 4]
    # pyiceberg 0.12 refuses to plan the whole scan, not just the deleted rows.
    with pytest.raises(ValueError, match="does not yet support equality deletes"):
        _pyiceberg_ids(table)
