"""The Iceberg cold store, on every storage (local/S3 warehouse x SQLite/PostgreSQL)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gateway.cold import (
    WATERMARKS_PROPERTY,
    ColdSnapshot,
    DataFile,
    fs_path,
    load_cold_store,
    write_data_file,
)
from gateway.cold.base import OFFSET_SORT, ROW_GROUP_ROWS, SORTED_KEY, DataFileWriter
from gateway.cold.iceberg import IcebergColdStore, IcebergColdTable, arrow_to_iceberg
from gateway.config import Settings
from gateway.meta import TableDef
from gateway.wire.errors import CommitConflict, InvalidSchema, SnapshotNotFound
from gateway.wire.schema import fields_to_json, system_schema, with_system_columns
from tests.cold.helpers import (
    ALL_TYPES,
    all_types_batch,
    duckdb_rows,
    normalise,
    pyiceberg_rows,
    pyiceberg_view,
)


def table_def(schema: pa.Schema, partitions: int = 2, tenant: str = "acme") -> TableDef:
    return TableDef(
        table_id=str(uuid.uuid4()),
        tenant=tenant,
        namespace="ns",
        name=f"t{uuid.uuid4().hex[:8]}",
        fields=fields_to_json(schema),
        partitions=partitions,
        key_columns=[],
        created_at=dt.datetime.now(dt.UTC),
    )


def write(
    store: IcebergColdStore, table: IcebergColdTable, partition: int, start: int, n: int, **kw: int
) -> tuple[pa.RecordBatch, DataFile]:
    user = all_types_batch(start, n)
    rows = with_system_columns(user, partition, start, 1_700_000_000_000_000 + start)
    f = write_data_file(
        store.storage_options(),
        table.data_location(partition),
        pa.Table.from_batches([rows]),
        table.file_schema(),
    )
    return rows, f


def test_layout_of_a_new_table(cold_store: IcebergColdStore) -> None:
    d = table_def(ALL_TYPES)
    table = cold_store.create_table(d, ALL_TYPES)
    ice = table._load()
    assert ice.location() == (
        f"{cold_store.warehouse}/{d.tenant}/{d.namespace}/{d.name}-{d.table_id}"
    )
    assert cold_store.catalog.table_exists((d.tenant, d.namespace, d.name))
    schema = ice.schema()
    for name, type_name in (
        ("_partition", "int"),
        ("_offset", "long"),
        ("_timestamp", "timestamptz"),
    ):
        field = schema.find_field(name)
        assert field.required and str(field.field_type) == type_name
    assert not schema.find_field("i8").required and schema.find_field("req").required
    assert [f.name for f in ice.spec().fields] == ["_partition"]
    assert str(ice.spec().fields[0].transform) == "identity"
    order = ice.sort_order()
    assert [schema.find_column_name(f.source_id) for f in order.fields] == ["_partition", "_offset"]
    assert ice.properties["write.delete.isolation-level"] == "snapshot"
    # Field ids are stable: the same schema maps to the same ids every time.
    assert arrow_to_iceberg(ALL_TYPES) == arrow_to_iceberg(ALL_TYPES)
    assert {f.field_id for f in schema.fields} == {
        f.field_id for f in arrow_to_iceberg(ALL_TYPES).fields
    }
    assert table.snapshot() == ColdSnapshot(None, {}, None)


@pytest.mark.parametrize(
    "bad",
    [
        pa.uint32(),
        pa.timestamp("ns"),
        pa.timestamp("us", tz="Europe/Paris"),
        pa.large_list(pa.int32()),
        pa.map_(pa.string(), pa.int32()),
        pa.dictionary(pa.int32(), pa.string()),
        pa.float16(),
        pa.list_(pa.uint8()),
    ],
)
def test_unstorable_types_are_refused(tmp_path: Path, bad: pa.DataType) -> None:
    # Refusal happens before any storage is touched: one storage is enough.
    cold_store = load_cold_store(Settings.explicit(data_dir=tmp_path))
    assert isinstance(cold_store, IcebergColdStore)
    schema = pa.schema([pa.field("ok", pa.int64()), pa.field("bad", bad)])
    d = table_def(schema)
    with pytest.raises(InvalidSchema, match="bad"):
        cold_store.create_table(d, schema)
    assert not cold_store.catalog.table_exists((d.tenant, d.namespace, d.name))


def test_a_load_parses_a_metadata_file_once_and_follows_every_commit(
    cold_settings: Settings, cold_store: IcebergColdStore
) -> None:
    d = table_def(ALL_TYPES)
    table = cold_store.create_table(d, ALL_TYPES)
    # Another process's store over the same catalog (a tiering job, another gateway).
    other = load_cold_store(cold_settings)
    assert isinstance(other, IcebergColdStore)
    try:
        theirs = other.table(d)
        _, f = write(other, theirs, 0, 0, 10)
        committed = theirs.commit_tiered([f], {0: 10}, theirs.snapshot())
        # The catalog's row names a new metadata file: this store reads it.
        assert table.snapshot() == committed
        first, second = table._load(), table._load()
        assert first is not second and first.metadata is second.metadata  # parsed once
        # Parsed, not read again: the file may even be gone for a moment.
        fs = cold_store.filesystem()
        location = fs_path(first.metadata_location)
        fs.move(location, location + ".away")
        try:
            assert table.snapshot() == committed
        finally:
            fs.move(location + ".away", location)
        _, g = write(cold_store, table, 1, 0, 5)
        mine = table.commit_tiered([g], {1: 5}, committed)
        assert other.table(d).snapshot() == mine
        assert table.snapshot() == mine and table._load().metadata_location != location
    finally:
        other.close()


def test_every_admitted_type_round_trips_and_other_readers_agree(
    cold_store: IcebergColdStore,
) -> None:
    d = table_def(ALL_TYPES)
    table = cold_store.create_table(d, ALL_TYPES)
    rows0, f0 = write(cold_store, table, 0, 0, 40)
    rows1, f1 = write(cold_store, table, 1, 0, 25)
    snap = table.commit_tiered([f0, f1], {0: 40, 1: 25}, table.snapshot())
    assert snap.watermarks == {0: 40, 1: 25}

    got0 = pa.Table.from_batches(list(table.read_range(snap, 0, 0, 40)))
    assert got0.schema == system_schema(ALL_TYPES)
    assert got0.to_pylist() == rows0.to_pylist()
    scanned = pa.Table.from_batches(list(table.scan(snap)))
    assert scanned.schema == system_schema(ALL_TYPES)
    expected = rows0.to_pylist() + rows1.to_pylist()
    key = lambda r: (r["_partition"], r["_offset"])  # noqa: E731
    assert sorted(scanned.to_pylist(), key=key) == expected

    stored = system_schema(ALL_TYPES)
    assert normalise(duckdb_rows(cold_store, table), stored) == expected
    assert normalise(pyiceberg_rows(cold_store, table), stored) == pyiceberg_view(expected)


def test_snapshots_by_id_and_time_and_watermarks_never_move_back(
    cold_store: IcebergColdStore,
) -> None:
    table = cold_store.create_table(table_def(ALL_TYPES), ALL_TYPES)
    _, f = write(cold_store, table, 0, 0, 10)
    s1 = table.commit_tiered([f], {0: 10}, table.snapshot())
    _, f = write(cold_store, table, 1, 0, 5)
    # A lower watermark for partition 0 is ignored: watermarks only move forward.
    s2 = table.commit_tiered([f], {0: 3, 1: 5}, s1)
    assert s2.watermarks == {0: 10, 1: 5}
    summary = table._load().current_snapshot().summary  # type: ignore[union-attr]
    assert json.loads(summary[WATERMARKS_PROPERTY]) == {"0": 10, "1": 5}

    assert table.snapshot(s1.snapshot_id) == s1
    assert s1.timestamp_ms is not None and s2.timestamp_ms is not None
    at = dt.datetime.fromtimestamp(s1.timestamp_ms / 1000, dt.UTC)
    assert table.snapshot(at).snapshot_id == s1.snapshot_id
    assert table.snapshot(dt.datetime.now(dt.UTC)).snapshot_id == s2.snapshot_id
    with pytest.raises(SnapshotNotFound):
        table.snapshot(12345)
    with pytest.raises(SnapshotNotFound):
        table.snapshot(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    # The old snapshot still reads what it held.
    assert [b.num_rows for b in table.scan(s1)] and sum(b.num_rows for b in table.scan(s1)) == 10


def test_commit_from_a_stale_base_conflicts(cold_store: IcebergColdStore) -> None:
    table = cold_store.create_table(table_def(ALL_TYPES), ALL_TYPES)
    base = table.snapshot()
    _, f = write(cold_store, table, 0, 0, 10)
    table.commit_tiered([f], {0: 10}, base)
    _, g = write(cold_store, table, 0, 0, 10)
    with pytest.raises(CommitConflict) as info:
        table.commit_tiered([g], {0: 10}, base)
    assert info.value.retryable
    assert table.snapshot().watermarks == {0: 10}
    assert sum(b.num_rows for b in table.scan(table.snapshot())) == 10


@pytest.mark.parametrize("storage", ["local-sqlite"], indirect=True)  # no storage specifics
def test_lost_offsets_raise_the_watermark_and_every_later_commit_keeps_them(
    cold_store: IcebergColdStore,
) -> None:
    """Issue 33, item 3: offsets lost with a hot tier's state are recorded in the snapshot
    summary (``tidegate.lost``), with ``T(p)`` raised past them, and kept by tiering,
    compaction and retention commits alike."""
    table = cold_store.create_table(table_def(ALL_TYPES), ALL_TYPES)
    _, f = write(cold_store, table, 0, 0, 10)
    s1 = table.commit_tiered([f], {0: 10}, table.snapshot())
    with pytest.raises(CommitConflict):
        table.commit_lost(0, 25, ColdSnapshot(None, {}, None))  # a stale base
    s2 = table.commit_lost(0, 25, s1)
    assert s2.watermarks == {0: 25} and s2.lost == {0: ((10, 25),)}
    assert table.commit_lost(0, 20, s2) == s2  # already past: nothing committed
    assert table.snapshot() == s2
    assert s2.lost_through(0, 10, 25) and s2.lost_through(0, 12, 20)
    assert not s2.lost_through(0, 9, 25) and not s2.lost_through(0, 10, 26)
    assert not s2.lost_through(1, 10, 11)
    _, g = write(cold_store, table, 0, 25, 5)
    s3 = table.commit_tiered([g], {0: 30}, s2)
    s4 = table.commit_lost(0, 40, s3)
    assert s4.lost == {0: ((10, 25), (30, 40))} and s4.watermarks == {0: 40}
    assert s4.lost_through(0, 10, 25) and not s4.lost_through(0, 10, 31)
    _, h = write(cold_store, table, 1, 0, 3)
    s5 = table.commit_tiered([h], {1: 3}, s4)
    after, _ = table.commit_retention({0: 5})
    summary = table._load().current_snapshot().summary  # type: ignore[union-attr]
    assert summary["tidegate.operation"] == "retention"
    assert after.lost == s5.lost == {0: ((10, 25), (30, 40))}
    assert json.loads(summary["tidegate.lost"]) == {"0": [[10, 25], [30, 40]]}
    # The rows around the holes read as before, in offset order.
    rows = [o for b in table.read_range(after, 0, 5, 40) for o in b.column("_offset").to_pylist()]
    assert rows == [*range(5, 10), *range(25, 30)]


class RecordingFS:
    """The warehouse filesystem, recording which files are opened for reading."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.opened: list[str] = []

    def open_input_file(self, path: str) -> Any:
        self.opened.append(path)
        return self.inner.open_input_file(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# Pruning depends on the manifests (any catalog) and file access (any warehouse): one
# combination of each keeps the suite fast.
@pytest.mark.parametrize("storage", ["local-sqlite", "s3-postgresql"], indirect=True)
def test_range_read_opens_only_the_files_that_hold_it(cold_store: IcebergColdStore) -> None:
    """200 data files; a 1,000-record read at a random offset is planned from the
    manifests (partition value + _offset bounds) and touches only its files."""
    schema = pa.schema([pa.field("v", pa.int64())])
    d = table_def(schema)
    table = cold_store.create_table(d, schema)
    per_file, nfiles = 100, 200
    opts, file_schema = cold_store.storage_options(), table.file_schema()
    files = []
    for p in (0, 1):
        for i in range(nfiles // 2):
            start = i * per_file
            user = pa.record_batch([pa.array(range(start, start + per_file), pa.int64())], schema)
            rows = with_system_columns(user, p, start, 0)
            files.append(
                write_data_file(
                    opts, table.data_location(p), pa.Table.from_batches([rows]), file_schema
                )
            )
    snap = table.commit_tiered(files, {0: 10_000, 1: 10_000}, table.snapshot())
    assert len(table.plan(snap)) == nfiles

    rng = random.Random(7)
    for _ in range(3):
        offset = rng.randrange(0, 9_000)
        chosen = table.files(snap, 1, offset, offset + 1000)
        want = {
            (1, s)
            for s in range(0, 10_000, per_file)
            if s + per_file > offset and s < offset + 1000
        }
        assert {(f.partition, f.min_offset) for f in chosen} == want
        assert len(chosen) <= 11
        assert [f.min_offset for f in chosen] == sorted(f.min_offset for f in chosen)
        recorder = RecordingFS(cold_store.filesystem())
        cold_store._fs = recorder
        try:
            got = pa.Table.from_batches(list(table.read_range(snap, 1, offset, offset + 1000)))
        finally:
            cold_store._fs = recorder.inner
        assert sorted(recorder.opened) == sorted(fs_path(f.path) for f in chosen)
        assert got.column("_offset").to_pylist() == list(range(offset, offset + 1000))
        assert got.column("v").to_pylist() == list(range(offset, offset + 1000))
        assert set(got.column("_partition").to_pylist()) == {1}
    assert table.files(snap, 0, 10_000, 10_500) == []


class PlanCounting(IcebergColdTable):
    """Counts pyiceberg planning passes (manifest reads)."""

    plans = 0

    def _tasks(self, snap: ColdSnapshot, row_filter: Any) -> list[Any]:
        self.plans += 1
        return super()._tasks(snap, row_filter)


@pytest.mark.parametrize("storage", ["local-sqlite"], indirect=True)
def test_stream_reads_plan_a_snapshot_once_and_see_the_next(cold_store: IcebergColdStore) -> None:
    """Reads of one snapshot and partition reuse one planning pass; a newer snapshot is
    planned afresh and its new files are read; the older snapshot keeps its own files."""
    schema = pa.schema([pa.field("v", pa.int64())])
    d = table_def(schema)
    cold_store.create_table(d, schema)
    table = PlanCounting(cold_store, ("acme", "ns", d.name), schema)
    opts, file_schema = cold_store.storage_options(), table.file_schema()

    def file(start: int, n: int) -> DataFile:
        user = pa.record_batch([pa.array(range(start, start + n), pa.int64())], schema)
        rows = pa.Table.from_batches([with_system_columns(user, 0, start, 0)])
        return write_data_file(opts, table.data_location(0), rows, file_schema)

    s1 = table.commit_tiered([file(0, 50), file(50, 50)], {0: 100}, table.snapshot())
    for offset in (0, 40, 60, 90):
        got = pa.Table.from_batches(list(table.read_range(s1, 0, offset, offset + 10)))
        assert got.column("v").to_pylist() == list(range(offset, offset + 10))
    assert table.plans == 1
    assert table.files(s1, 1, 0, 100) == []  # another partition: its own (empty) list
    assert table.plans == 2

    s2 = table.commit_tiered([file(100, 30)], {0: 130}, s1)
    got = pa.Table.from_batches(list(table.read_range(s2, 0, 95, 125)))
    assert got.column("v").to_pylist() == list(range(95, 125))
    assert table.plans == 3
    assert [f.min_offset for f in table.files(s1, 0, 0, 200)] == [0, 50]
    assert [f.min_offset for f in table.files(s2, 0, 0, 200)] == [0, 50, 100]
    assert table.plans == 3


def test_plan_urls_read_without_warehouse_credentials(cold_store: IcebergColdStore) -> None:
    table = cold_store.create_table(table_def(ALL_TYPES), ALL_TYPES)
    _, f = write(cold_store, table, 1, 0, 12)
    snap = table.commit_tiered([f], {1: 12}, table.snapshot())
    [planned] = table.plan(snap)
    assert planned.file.partition == 1 and planned.file.record_count == 12
    assert (planned.file.min_offset, planned.file.max_offset) == (0, 11)
    if cold_store.warehouse.startswith("s3://"):
        assert planned.url.startswith("http") and "Signature" in planned.url
        assert planned.expires_at is not None
        body = httpx.get(planned.url).raise_for_status().content  # no credentials
        data = pq.read_table(pa.BufferReader(body))
    else:
        assert planned.expires_at is None
        data = pq.read_table(planned.url)
    assert data.column("_offset").to_pylist() == list(range(12))
    # A filter prunes by the partition value.
    from gateway.wire.filters import compile_filter

    assert table.plan(snap, compile_filter("_partition = 0", table.stored_schema)) == []


def test_drop_purges_the_files(cold_store: IcebergColdStore) -> None:
    d = table_def(ALL_TYPES)
    table = cold_store.create_table(d, ALL_TYPES)
    _, f = write(cold_store, table, 0, 0, 5)
    table.commit_tiered([f], {0: 5}, table.snapshot())
    location = table.location
    fs, _ = cold_store.storage_options().filesystem()
    from pyarrow import fs as pafs

    assert fs.get_file_info(pafs.FileSelector(fs_path(location), recursive=True))
    cold_store.drop_table(d)
    assert not cold_store.catalog.table_exists((d.tenant, d.namespace, d.name))
    leftover = fs.get_file_info(
        pafs.FileSelector(fs_path(location), recursive=True, allow_not_found=True)
    )
    assert [i.path for i in leftover if i.type == pafs.FileType.File] == []


# The statistics are computed by pyiceberg from a footer either way: one storage suffices.
@pytest.mark.parametrize("storage", ["local-sqlite"], indirect=True)
def test_commit_takes_the_statistics_from_the_writers_footer(
    cold_store: IcebergColdStore,
) -> None:
    from gateway.cold.iceberg.summary import iceberg_data_files as _iceberg_data_files

    table = cold_store.create_table(table_def(ALL_TYPES), ALL_TYPES)
    _, f = write(cold_store, table, 1, 7, 40)
    assert f.footer is not None
    ice = table._load()
    from_footer = _iceberg_data_files(ice.io, ice.metadata, [f])[0]
    from_file = _iceberg_data_files(ice.io, ice.metadata, [dataclasses.replace(f, footer=None)])[0]
    for name in (
        "file_path",
        "partition",
        "record_count",
        "file_size_in_bytes",
        "column_sizes",
        "value_counts",
        "null_value_counts",
        "nan_value_counts",
        "lower_bounds",
        "upper_bounds",
        "split_offsets",
    ):
        assert getattr(from_footer, name) == getattr(from_file, name), name
    assert from_footer.record_count == 40
    snap = table.commit_tiered([f], {1: 47}, table.snapshot())
    assert [(g.min_offset, g.max_offset) for g in table.files(snap, 1, 0, 100)] == [(7, 46)]


def test_data_files_stream_whole_row_groups_and_skip_useless_dictionaries(
    cold_store: IcebergColdStore,
) -> None:
    schema = pa.schema([pa.field("k", pa.string()), pa.field("n", pa.int64())])
    table = cold_store.create_table(table_def(schema), schema)
    writer = DataFileWriter(
        cold_store.storage_options(), table.data_location(0), table.file_schema()
    )
    total = ROW_GROUP_ROWS * 2 + 100
    start = 0
    for size in (1000, ROW_GROUP_ROWS + 5, 3, total - ROW_GROUP_ROWS - 1008):
        user = pa.RecordBatch.from_pydict(
            {
                "k": [f"k{i % 3}" for i in range(start, start + size)],
                "n": range(start, start + size),
            },
            schema=schema,
        )
        writer.write(with_system_columns(user, 0, 10 + start, 1_700_000_000_000_000))
        start += size
    with pytest.raises(ValueError, match="increasing offset order"):
        writer.write(with_system_columns(user.slice(0, 1), 0, 10, 1_700_000_000_000_000))
    with pytest.raises(ValueError, match="one partition"):
        writer.write(with_system_columns(user.slice(0, 1), 1, 10 + total, 1_700_000_000_000_000))
    f = writer.close()
    assert (f.record_count, f.min_offset, f.max_offset) == (total, 10, 10 + total - 1)
    filesystem, _ = cold_store.storage_options().filesystem()
    with filesystem.open_input_file(fs_path(f.path)) as source:
        parquet = pq.ParquetFile(source)
        meta = parquet.metadata
        assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [
            ROW_GROUP_ROWS,
            ROW_GROUP_ROWS,
            100,
        ]
        assert parquet.schema_arrow.metadata[SORTED_KEY] == OFFSET_SORT
        encodings = {
            meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).encodings
            for i in range(meta.num_columns)
        }
        # _offset and the all-distinct n plain; k (three values) with a dictionary.
        assert not any("DICTIONARY" in e for e in encodings["_offset"])
        assert not any("DICTIONARY" in e for e in encodings["n"])
        assert any("DICTIONARY" in e for e in encodings["k"])
        rows = parquet.read()
    assert rows.column("_offset").to_pylist() == list(range(10, 10 + total))
    assert rows.column("n").to_pylist() == list(range(total))
    assert meta.num_rows == f.record_count
    assert f.file_size_bytes == filesystem.get_file_info(fs_path(f.path)).size


def _metadata_files(store: IcebergColdStore, table: IcebergColdTable) -> list[str]:
    from pyarrow.fs import FileSelector

    filesystem, _ = store.storage_options().filesystem()
    where = fs_path(f"{table._load().location()}/metadata")
    found = filesystem.get_file_info(FileSelector(where, recursive=False))
    return [f.path for f in found if f.path.endswith(".metadata.json")]


# One storage: 100 commits, each reading and writing a metadata file of every schema.
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("storage", ["local-sqlite"])
def test_schema_changes_leave_a_bounded_number_of_metadata_files(
    cold_store: IcebergColdStore,
) -> None:
    """Issue 33.7: every commit writes a metadata file holding every schema version; the
    superseded ones are deleted at each commit, keeping the last
    ``write.metadata.previous-versions-max``."""
    from gateway.cold.iceberg.table import METADATA_PROPERTIES

    keep = int(METADATA_PROPERTIES["write.metadata.previous-versions-max"])
    user = pa.schema([pa.field("a", pa.int64())])
    table = cold_store.create_table(table_def(user), user)
    assert table._load().properties["write.metadata.delete-after-commit.enabled"] == "true"
    changes = keep + 15  # enough commits to pass the bound well; each writes every schema
    for i in range(changes):
        user = user.append(pa.field(f"c{i}", pa.string()))
        table.evolve_schema(user, {f"c{i}": "d" * 100})
    files = _metadata_files(cold_store, table)
    assert len(files) <= keep + 1, len(files)
    ice = table._load()
    assert len(ice.schema().fields) == changes + 4  # a, the c columns and three system ones
    assert str(ice.metadata_location).rsplit("/", 1)[1] in {f.rsplit("/", 1)[1] for f in files}


def test_a_table_created_before_the_rule_gets_it_at_its_next_commit(
    cold_store: IcebergColdStore,
) -> None:
    from gateway.cold.iceberg.table import METADATA_PROPERTIES

    keep = int(METADATA_PROPERTIES["write.metadata.previous-versions-max"])
    table = cold_store.create_table(table_def(ALL_TYPES), ALL_TYPES)
    ice = table._load()
    with ice.transaction() as tx:  # as a table created before the properties was
        tx.remove_properties(*METADATA_PROPERTIES)
    for i in range(keep + 5):  # commits that keep every metadata file (pyiceberg's default)
        with ice.transaction() as tx:
            tx.set_properties({"test.commit": str(i)})
    assert len(_metadata_files(cold_store, table)) > keep + 5
    _, f = write(cold_store, table, 0, 0, 10)
    table.commit_tiered([f], {0: 10}, table.snapshot())  # the next tiering commit
    ice = table._load()
    assert {k: ice.properties.get(k) for k in METADATA_PROPERTIES} == METADATA_PROPERTIES
    assert len(_metadata_files(cold_store, table)) <= keep + 1
    assert table.snapshot().watermark(0) == 10  # and it reads on
    assert len(pyiceberg_rows(cold_store, table)) == 10


def test_first_uses_at_once_in_one_process_all_see_the_made_table(
    cold_store: IcebergColdStore,
) -> None:
    """A stream-table's Iceberg table is made at its first use. Threads of one gateway
    using one handle at once (a describe, a read, an append's floor check) all get the
    table that one of them made: none is told it does not exist (the handle's maker is
    used up by the first thread while the others are between their miss and its check)."""
    errors: list[BaseException] = []

    def use(handle: IcebergColdTable, start: threading.Barrier) -> None:
        start.wait()
        try:
            assert handle.snapshot() == ColdSnapshot(None, {}, None)
        except BaseException as exc:  # collected, asserted below
            errors.append(exc)

    for _ in range(10):
        handle = cold_store.table(table_def(pa.schema([("n", pa.int64())])))
        start = threading.Barrier(12)
        threads = [threading.Thread(target=use, args=(handle, start)) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors[:3]


@pytest.mark.parametrize("storage", ["local-sqlite", "s3-sqlite"], indirect=True)
def test_a_table_whose_maker_died_is_made_and_one_tiered_into_is_never_made_again(
    cold_store: IcebergColdStore,
) -> None:
    """A maker that died between writing a table's first metadata file and its catalog row
    (a gateway killed at a key table's first write) leaves only that file: the table never
    held a snapshot, so the next first use makes it. A table that was committed to and then
    dropped from the catalog is refused: made again empty, it would say nothing was tiered."""
    d = table_def(ALL_TYPES)
    ident = (d.tenant, d.namespace, d.name)
    assert cold_store.table(d).snapshot() == ColdSnapshot(None, {}, None)
    cold_store.catalog.drop_table(ident)  # the row only: as if the maker never wrote it
    again = cold_store.table(d)
    assert again.snapshot() == ColdSnapshot(None, {}, None)
    assert cold_store.catalog.table_exists(ident)

    _, f = write(cold_store, again, 0, 0, 10)
    again.commit_tiered([f], {0: 10}, again.snapshot())
    cold_store.catalog.drop_table(ident)
    with pytest.raises(SnapshotNotFound, match="dropped from the catalog outside Tidegate"):
        cold_store.table(d).snapshot()
