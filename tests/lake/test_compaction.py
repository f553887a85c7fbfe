"""Compaction with the local runner over real hot tiers and a real Iceberg SQL catalog:
runs of small files become one file per run, every record stays exactly once, the
snapshot keeps ``tidegate.watermarks``, and a tiering commit racing the compaction (in
either order) is never lost. A second compaction racing the first gives up cleanly."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gateway.cold.base import OPERATION_PROPERTY, WATERMARKS_PROPERTY, DataFile, fs_path
from gateway.config import Settings
from gateway.lake.compaction import compact_all, compact_table, plan_bins
from gateway.lake.runners import LocalRunner
from gateway.lake.tasks import LakeTask
from gateway.lake.tiering import tier_table
from gateway.meta import TableDef
from gateway.wire.evolution import apply_changes
from gateway.wire.schema import parse_fields
from tests.cold.helpers import duckdb_rows
from tests.lake.conftest import Harness, tier_settings


def compaction_settings(base: Settings, **compaction: Any) -> Settings:
    values = base.model_dump()
    values["compaction"] = {
        "small_file_bytes": 1024 * 1024,
        "target_file_bytes": 4 * 1024 * 1024,
        **compaction,
    }
    return Settings.explicit(**values)


@pytest.fixture
def h(hot_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    redis = request.getfixturevalue("redis_server") if hot_kind == "redis" else None
    harness = Harness(compaction_settings(tier_settings(hot_kind, tmp_path, redis)))
    try:
        yield harness
    finally:
        harness.close()


def _fill(h: Harness, d: TableDef, commits: int, per: int = 3) -> None:
    """``commits`` tiering commits of ``per`` records in every partition."""
    for i in range(commits):
        for p in range(d.partitions):
            h.append(d, p, [{"k": f"{p}-{i}-{j}", "n": i * per + j} for j in range(per)])
        tier_table(h.c, d, trim=False)


def _live(h: Harness, d: TableDef) -> dict[int, list[DataFile]]:
    cold = h.c.cold.table(d)
    snap = cold.snapshot()
    return {p: cold.files(snap, p, 0, 2**62) for p in range(d.partitions)}


def _keys(h: Harness, d: TableDef) -> list[tuple[int, int, int]]:
    return [(r["_partition"], r["_offset"], r["n"]) for r in h.cold_rows(d)]


def _expected(d: TableDef, counts: Sequence[int]) -> list[tuple[int, int, int]]:
    return [(p, o, o) for p in range(d.partitions) for o in range(counts[p])]


def test_plan_bins_cuts_runs_at_large_files_and_target() -> None:
    def f(i: int, size: int) -> DataFile:
        return DataFile(f"f{i}", 0, 1, size, i, i)

    files = [f(0, 10), f(1, 10), f(2, 100), f(3, 10), f(4, 10), f(5, 10), f(6, 10), f(7, 10)]
    bins = plan_bins(files, small_bytes=50, target_bytes=30, min_files=2)
    assert [[x.path for x in b] for b in bins] == [["f0", "f1"], ["f3", "f4", "f5"], ["f6", "f7"]]
    # Files are never merged across a gap in the offsets (a range lost with the hot tier).
    gap = [DataFile(f"g{i}", 0, 10, 10, lo, lo + 9) for i, lo in enumerate([0, 10, 30, 40])]
    cut = plan_bins(gap, small_bytes=50, target_bytes=100, min_files=2)
    assert [[x.path for x in b] for b in cut] == [["g0", "g1"], ["g2", "g3"]]
    # A lone small file between large ones is left alone.
    assert (
        plan_bins([f(0, 100), f(1, 10), f(2, 100)], small_bytes=50, target_bytes=30, min_files=2)
        == []
    )


def test_compaction_rewrites_small_files_into_one_per_partition(h: Harness) -> None:
    d = h.create_table(partitions=2)
    _fill(h, d, commits=5)
    before = _live(h, d)
    assert [len(before[p]) for p in range(2)] == [5, 5]
    marks = h.watermarks(d)

    result = compact_table(h.c, d)

    assert (result.removed, result.added, result.records) == (10, 2, 30)
    after = _live(h, d)
    assert [len(after[p]) for p in range(2)] == [1, 1]
    assert [(f.min_offset, f.max_offset, f.record_count) for f in after[0]] == [(0, 14, 15)]
    assert not {f.path for fs in before.values() for f in fs} & {
        f.path for fs in after.values() for f in fs
    }
    assert _keys(h, d) == _expected(d, [15, 15])
    assert h.watermarks(d) == marks == {0: 15, 1: 15}
    summary = h.c.cold.table(d).snapshots()[-1].summary
    assert summary[OPERATION_PROPERTY] == "compact"
    assert WATERMARKS_PROPERTY in summary
    # Nothing left to do: a second run changes nothing.
    again = compact_table(h.c, d)
    assert again.removed == 0 and again.snapshot_id == result.snapshot_id
    # A third-party engine reads the same records.
    cold = h.c.cold.table(d)
    assert [(r["_partition"], r["_offset"], r["n"]) for r in duckdb_rows(h.c.cold, cold)] == (
        _expected(d, [15, 15])
    )


class _Interleaving(LocalRunner):
    """A local runner that runs ``between`` once its tasks have written their files: the
    other job commits after this one planned and wrote, before it commits."""

    def __init__(self, h: Harness, between: Callable[[], None]) -> None:
        super().__init__(h.c)
        self.between: Callable[[], None] | None = between

    def write(self, tenant: str, tasks: Sequence[LakeTask]) -> list[DataFile]:
        files = super().write(tenant, tasks)
        if self.between is not None:
            between, self.between = self.between, None
            between()
        return files


def test_tiering_commit_between_compaction_plan_and_commit_is_kept(h: Harness) -> None:
    d = h.create_table(partitions=2)
    _fill(h, d, commits=4)

    def tier_more() -> None:
        for p in range(2):
            h.append(d, p, [{"k": "late", "n": 12 + j} for j in range(2)])
        tier_table(h.c, d, trim=False)

    result = compact_table(h.c, d, runner=_Interleaving(h, tier_more))

    assert result.removed == 8 and result.added == 2 and not result.obsolete
    assert h.watermarks(d) == {0: 14, 1: 14}  # the tiering commit's watermarks survive
    assert _keys(h, d) == _expected(d, [14, 14])
    assert [len(fs) for fs in _live(h, d).values()] == [2, 2]  # compacted + the late one


def test_compaction_between_tiering_plan_and_commit_is_kept(h: Harness) -> None:
    d = h.create_table(partitions=2)
    _fill(h, d, commits=4)
    for p in range(2):
        h.append(d, p, [{"k": "late", "n": 12 + j} for j in range(2)])
    compacted: list[Any] = []

    result = tier_table(
        h.c,
        d,
        runner=_Interleaving(h, lambda: compacted.append(compact_table(h.c, d))),
        trim=False,
    )

    assert compacted[0].removed == 8
    assert result.conflicts == 1 and result.moved == {0: (12, 14), 1: (12, 14)}
    assert h.watermarks(d) == {0: 14, 1: 14}
    assert _keys(h, d) == _expected(d, [14, 14])


def test_compaction_whose_inputs_were_compacted_meanwhile_gives_up(h: Harness) -> None:
    d = h.create_table(partitions=1)
    _fill(h, d, commits=3)
    first: list[Any] = []
    result = compact_table(
        h.c, d, runner=_Interleaving(h, lambda: first.append(compact_table(h.c, d)))
    )
    assert first[0].removed == 3 and result.obsolete and result.removed == 0
    assert _keys(h, d) == _expected(d, [9])
    live = _live(h, d)[0]
    assert len(live) == 1
    # The loser's file was deleted: only the winner's new file is in the partition folder.
    folder = Path(fs_path(live[0].path)).parent
    written = {p.name for p in folder.iterdir()}
    assert Path(live[0].path).name in written
    assert len(written) == 3 + 1


@pytest.mark.parametrize("hot_kind", ["disk"])
def test_one_tenants_broken_table_does_not_stop_others(h: Harness) -> None:
    good = [h.create_table(partitions=1) for _ in range(2)]
    bad = h.create_table(partitions=1)
    for d in [bad, *good]:
        _fill(h, d, commits=2)
    # Corrupt one file of the bad table: its rewrite task fails.
    victim = _live(h, bad)[0][0]
    Path(fs_path(victim.path)).write_bytes(b"not parquet")

    report = compact_all(h.c, tables=[bad, *good])

    assert list(report.failures) == [f"{bad.tenant}/{bad.qualified_name}"]
    assert sorted(r.removed for r in report.tables) == [2, 2]
    for d in good:
        assert [len(fs) for fs in _live(h, d).values()] == [1]
        assert _keys(h, d) == _expected(d, [6])
    assert [len(fs) for fs in _live(h, bad).values()] == [2]  # untouched


def _evolve(h: Harness, d: TableDef, changes: list[dict[str, Any]]) -> TableDef:
    """Apply schema ``changes`` the way the gateway does: Iceberg first, then the store."""
    fields = apply_changes(d.fields, changes, d.key_columns)
    h.c.cold.table(d).evolve_schema(parse_fields(fields, stored=True), {})
    return h.c.meta.set_fields(d.table_id, d.schema_version, fields)


def test_compaction_merges_files_written_under_older_schemas(h: Harness) -> None:
    # Files of three schema versions in one run: int32 `n`, then `n` widened to int64,
    # then a nullable `tag` added. The compacted file is in the current schema, with the
    # old rows' `tag` null and every `n` kept, and DuckDB reads it so.
    fields = [
        {"name": "k", "type": "string", "nullable": True},
        {"name": "n", "type": "int32", "nullable": False},
    ]
    d = h.create_table(partitions=1, fields=fields)
    _fill(h, d, commits=2)
    d = _evolve(h, d, [{"op": "update_type", "column": "n", "type": "int64"}])
    h.append(d, 0, [{"k": "big", "n": 2**40}])
    tier_table(h.c, d, trim=False)
    d = _evolve(h, d, [{"op": "add_column", "column": "tag", "type": "string"}])
    h.append(d, 0, [{"k": "tagged", "n": 7, "tag": "x"}])
    tier_table(h.c, d, trim=False)
    assert len(_live(h, d)[0]) == 4

    result = compact_table(h.c, d)

    assert (result.removed, result.added, result.records) == (4, 1, 8)
    (merged,) = _live(h, d)[0]
    schema = pq.read_schema(fs_path(merged.path), filesystem=h.c.cold.filesystem())
    assert schema.field("n").type == pa.int64() and schema.field("tag").type == pa.string()
    want = [(0, o, o, None) for o in range(6)] + [(0, 6, 2**40, None), (0, 7, 7, "x")]
    assert [(r["_partition"], r["_offset"], r["n"], r["tag"]) for r in h.cold_rows(d)] == want
    cold = h.c.cold.table(d)
    assert [
        (r["_partition"], r["_offset"], r["n"], r["tag"]) for r in duckdb_rows(h.c.cold, cold)
    ] == want
