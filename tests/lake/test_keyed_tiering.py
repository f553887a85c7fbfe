"""Tiering primary-key tables (issue 42) on both hot tiers: the changelog is tiered as any
table's records, and each run applies the changes ``[A(p), T(p))`` to the state table in
one overwrite commit carrying ``tidegate.applied`` (docs/decisions/primary-keys.md). The
state table, read by pyiceberg without Tidegate, equals a model of random upserts and
deletes; the stream read (now partly from Iceberg) is still the changelog and the scan
still current state; a tiering job killed between the changelog's commit and the state
table's applies nothing twice."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.exceptions import NoSuchTableError

from gateway.config import Settings
from gateway.core import StreamTables
from gateway.hot import PartitionId
from gateway.lake.components import Components
from gateway.lake.tiering import tier_table
from gateway.server.app import build_service
from gateway.wire.changes import Change
from gateway.wire.errors import Unavailable
from tests.keytables import FIELDS, USER, Key, replay
from tests.lake.test_crash import _tier_in_child
from tests.services import RedisServer

TENANT = "default"
WRITE = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("region", pa.string()),
        pa.field("v", pa.int64()),
        pa.field("note", pa.string()),
        pa.field("_change", pa.int8()),
    ]
)


def _settings(kind: str, tmp_path: Path, redis: RedisServer | None) -> Settings:
    hot: dict[str, Any] = (
        {"type": "disk", "fsync": "never"}
        if kind == "disk"
        else {"type": "redis", "url": redis.url}  # type: ignore[union-attr]
    )
    return Settings.explicit(
        data_dir=tmp_path,
        tenant=TENANT,
        hot=hot,
        tiering={"hot_retention_s": 0, "enabled": False},
        compaction={"enabled": False},
        retention={"enabled": False, "settle_s": 0},
        expiry={"enabled": False},
    )


@pytest.fixture(params=["disk", "redis"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    kind = str(request.param)
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    return _settings(kind, tmp_path, redis)


@pytest.fixture
def service(settings: Settings) -> Iterator[StreamTables]:
    svc = build_service(settings)
    try:
        yield svc
    finally:
        svc.close()


class Writer:
    """Random upserts and deletes of a key table, and the model they make."""

    def __init__(self, svc: StreamTables, name: str, seed: int, keys: int = 200) -> None:
        self.svc, self.name, self.keys = svc, name, keys
        self.rng = random.Random(seed)
        self.model: dict[Key, dict[str, Any]] = {}
        self.step = 0

    def batch(self) -> list[dict[str, Any]]:
        rng, rows = self.rng, []
        self.step += 1
        for _ in range(rng.randint(5, 60)):
            key = (rng.randrange(self.keys), rng.choice(["eu", "us", "ap"]))
            if rng.random() < 0.25:
                rows.append({"id": key[0], "region": key[1], "_change": Change.DELETE})
                self.model.pop(key, None)
            else:
                row = {"id": key[0], "region": key[1], "v": self.step, "note": f"n{rng.random()}"}
                rows.append({**row, "_change": rng.choice([0, 2])})
                self.model[key] = row
        return rows

    async def write(self, batches: int) -> None:
        for _ in range(batches):
            rows = self.batch()
            full = [{n: r.get(n) for n in WRITE.names} for r in rows]
            batch = pa.RecordBatch.from_pylist(full, schema=WRITE)
            await self.svc.append(TENANT, "ns", self.name, [batch])


async def _create(svc: StreamTables, partitions: int = 3) -> str:
    name = f"k{uuid.uuid4().hex[:8]}"
    await svc.create_table(TENANT, "ns", name, FIELDS, partitions, primary_key=["id", "region"])
    return name


def _state_iceberg(svc: StreamTables, name: str) -> Any:
    """The state table as an engine outside Tidegate opens it: pyiceberg, the catalog."""
    assert svc.cold is not None
    catalog = svc.cold.catalog  # type: ignore[attr-defined]
    return catalog.load_table((TENANT, "ns", f"{name}$state"))


def _rows_by_key(rows: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for r in rows:
        key = (r["id"], r["region"])
        assert key not in out, f"key {key} twice"
        out[key] = {n: r[n] for n in USER}
    return out


def _made_by(changes: list[dict[str, Any]]) -> dict[Key, tuple[int, int]]:
    """Each live key's (partition, offset) of the change that made its row."""
    last: dict[Key, tuple[int, int, int]] = {}
    for c in changes:
        last[(c["id"], c["region"])] = (c["_partition"], c["_offset"], c["_change"])
    return {k: (p, o) for k, (p, o, kind) in last.items() if kind != Change.DELETE}


async def _changelog(svc: StreamTables, name: str, partitions: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in range(partitions):
        res = await svc.read(TENANT, "ns", name, p, 0, 1 << 20, None)
        out += pa.Table.from_batches(res.batches, res.schema).to_pylist()
    return out


def _state_commits(table: Any) -> list[dict[str, str]]:
    table.refresh()
    return [
        dict(s.summary.additional_properties)
        for s in sorted(table.snapshots(), key=lambda s: s.sequence_number)
        if s.summary is not None
    ]


def test_the_state_table_equals_the_model_after_every_run(service: StreamTables) -> None:
    async def main() -> None:
        svc = service
        assert svc.cold is not None
        name = await _create(svc)
        d = svc.meta.get_table(TENANT, "ns", name)
        c = Components(svc.settings, svc.meta, svc.hot, svc.cold)
        w = Writer(svc, name, seed=11)
        for run in range(4):
            await w.write(12)
            result = tier_table(c, d)
            assert result.records > 0 and set(result.applied) == set(result.moved)
            state = _state_iceberg(svc, name)
            rows = state.scan().to_arrow()
            assert "_change" not in rows.column_names
            assert _rows_by_key(rows.to_pylist()) == w.model, f"run {run}"
            tiered = svc.cold.table(d).snapshot().watermarks
            commits = _state_commits(state)
            assert len(commits) == run + 1  # one state commit per run
            assert json.loads(commits[-1]["tidegate.applied"]) == {
                str(p): t for p, t in tiered.items()
            }
            assert commits[-1]["tidegate.operation"] == "apply"
        changes = await _changelog(svc, name, 3)
        assert replay(changes) == w.model  # the stream read: Iceberg, then the hot tier
        made = _made_by(changes)
        state_rows = _state_iceberg(svc, name).scan().to_arrow().to_pylist()
        assert {(r["id"], r["region"]): (r["_partition"], r["_offset"]) for r in state_rows} == made
        # A scan is the state table merged with the hot changes above A(p).
        await w.write(5)
        scanned = [b async for b in (await svc.scan(TENANT, "ns", name)).batches]
        assert _rows_by_key(pa.Table.from_batches(scanned).to_pylist()) == w.model
        low = [
            b
            async for b in (
                await svc.scan(TENANT, "ns", name, ["id", "region", "v"], "id < 50")
            ).batches
        ]
        assert sorted((r["id"], r["region"], r["v"]) for b in low for r in b.to_pylist()) == sorted(
            (k[0], k[1], r["v"]) for k, r in w.model.items() if k[0] < 50
        )
        # A run with nothing to move commits nothing to either table.
        tier_table(c, d)
        before = len(_state_commits(_state_iceberg(svc, name)))
        again = tier_table(c, d)
        assert again.applied == {} and again.moved == {}
        assert len(_state_commits(_state_iceberg(svc, name))) == before

    asyncio.run(main())


def test_a_changed_key_rewrites_only_the_files_its_key_falls_in(service: StreamTables) -> None:
    async def main() -> None:
        svc = service
        assert svc.cold is not None
        name = await _create(svc, partitions=1)
        d = svc.meta.get_table(TENANT, "ns", name)
        c = Components(svc.settings, svc.meta, svc.hot, svc.cold)

        async def upsert(ids: range | list[int], v: int) -> None:
            rows = [{"id": i, "region": "eu", "v": v, "note": None, "_change": 0} for i in ids]
            await svc.append(TENANT, "ns", name, [pa.RecordBatch.from_pylist(rows, schema=WRITE)])

        # Two runs far apart in the key space: two files with disjoint key ranges.
        await upsert(range(100), 1)
        tier_table(c, d)
        await upsert(range(1000, 1100), 1)
        tier_table(c, d)
        state = svc.cold.state_table(d)
        files = state.key_files(state.snapshot(), 0)
        assert sorted((f.low, f.high) for f in files) == [(0, 99), (1000, 1099)]
        # A change of key 5 replaces the file of 0..99 only.
        await upsert([5], 2)
        tier_table(c, d)
        after = state.key_files(state.snapshot(), 0)
        kept = {f.file.path for f in files} & {f.file.path for f in after}
        assert [f.low for f in files if f.file.path in kept] == [1000]
        rows = _state_iceberg(svc, name).scan().to_arrow().to_pylist()
        assert len(rows) == 200 and {r["v"] for r in rows if r["id"] == 5} == {2}

    asyncio.run(main())


@pytest.mark.integration
@pytest.mark.parametrize(
    ("crash", "kind"),
    [
        ("after_commit", "disk"),
        ("before_state_commit", "disk"),
        ("after_state_commit", "disk"),
        ("after_commit", "redis"),
    ],
)
def test_a_tiering_job_killed_around_the_state_commit_applies_each_change_once(
    crash: str, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    settings = _settings(kind, tmp_path, redis)

    async def write(batches: int, w: Writer | None = None, name: str = "") -> tuple[Writer, str]:
        svc = build_service(settings)
        try:
            if w is None:
                name = await _create(svc, partitions=2)
                w = Writer(svc, name, seed=5, keys=60)
            w.svc = svc
            await w.write(batches)
            return w, name
        finally:
            svc.close()

    w, name = asyncio.run(write(10))
    killed = _tier_in_child(settings, crash)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    svc = build_service(settings)
    try:
        assert svc.cold is not None
        d = svc.meta.get_table(TENANT, "ns", name)
        tiered = svc.cold.table(d).snapshot().watermarks
        assert sum(tiered.values()) > 0  # the changelog's commit is in
        # Killed before the state commit: nothing applied (the state table is made empty,
        # at the first write's lookup of keys no partition held); after it: all of it.
        commits = _state_commits(_state_iceberg(svc, name))
        assert len(commits) == (1 if crash == "after_state_commit" else 0)
        # The run's lake work is marked done after the state commit only: killed at any
        # of these points, the embedded schedule (which visits marked tables only) tiers
        # the table again.
        assert name in [t.name for t in svc.meta.due_tables(["tier"])]
    finally:
        svc.close()

    w, _ = asyncio.run(write(4, w, name))
    done = _tier_in_child(settings, None)
    assert done.returncode == 0, done.stderr

    svc = build_service(settings)
    try:
        assert svc.cold is not None
        state = _state_iceberg(svc, name)
        assert _rows_by_key(state.scan().to_arrow().to_pylist()) == w.model
        commits = _state_commits(state)
        # The rerun applied what was left in one commit: the killed run's range once.
        assert len(commits) == (2 if crash == "after_state_commit" else 1)
        tiered = svc.cold.table(d).snapshot().watermarks
        assert json.loads(commits[-1]["tidegate.applied"]) == {str(p): t for p, t in tiered.items()}
        changes = asyncio.run(_changelog(svc, name, 2))
        assert replay(changes) == w.model
        made = _made_by(changes)
        rows = state.scan().to_arrow().to_pylist()
        assert {(r["id"], r["region"]): (r["_partition"], r["_offset"]) for r in rows} == made
    finally:
        svc.close()


def test_keys_the_hot_tier_lost_before_the_state_table_applied_them_wait_for_it(
    tmp_path: Path,
) -> None:
    """The changelog committed, the run killed before the state commit (``A(p)`` = 0),
    then the hot tier's folder lost (what an emptied Redis does to a shard): the hot tier
    starts again at ``T(p)``, and the keys whose last change is in ``[A(p), T(p))`` are in
    neither the hot index nor the state table. A write or a ``get`` of them is refused
    ``Unavailable`` (it was resolved on the empty state: a delete dropped, an update made
    an insert; fault seed 415); once tiering applied the changelog they go through, and
    the changelog replays to the model."""
    settings = _settings("disk", tmp_path, None)
    live: list[Key] = []

    async def first() -> tuple[Writer, str]:
        svc = build_service(settings)
        try:
            name = await _create(svc, partitions=2)
            w = Writer(svc, name, seed=9, keys=40)
            await w.write(10)
            live.extend(sorted(w.model))
            return w, name
        finally:
            svc.close()

    w, name = asyncio.run(first())
    killed = _tier_in_child(settings, "before_state_commit")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    shutil.rmtree(settings.hot_path / TENANT)

    async def refused() -> None:
        svc = build_service(settings)
        try:
            delete = [{"id": k[0], "region": k[1], "_change": Change.DELETE} for k in live]
            full = [{n: r.get(n) for n in WRITE.names} for r in delete]
            batch = pa.RecordBatch.from_pylist(full, schema=WRITE)
            with pytest.raises(Unavailable, match="before the state table applied"):
                await svc.append(TENANT, "ns", name, [batch])
            with pytest.raises(Unavailable, match="once tiering applied them"):
                await _get(svc, name, live)
        finally:
            svc.close()

    asyncio.run(refused())
    done = _tier_in_child(settings, None)
    assert done.returncode == 0, done.stderr

    async def after() -> None:
        svc = build_service(settings)
        try:
            w.svc = svc
            await w.write(6)  # upserts and deletes of keys last changed before the loss
            every = [(i, r) for i in range(40) for r in ("eu", "us", "ap")]
            assert await _get(svc, name, every) == w.model
            assert replay(await _changelog(svc, name, 2)) == w.model
        finally:
            svc.close()

    asyncio.run(after())


async def _get(svc: StreamTables, name: str, keys: list[Key]) -> dict[Key, dict[str, Any]]:
    table = pa.table({"id": [k[0] for k in keys], "region": [k[1] for k in keys]})
    return _rows_by_key((await svc.get(TENANT, "ns", name, table)).to_pylist())


def test_writes_lookups_and_scans_fall_through_to_the_state_table_once_trimmed(
    service: StreamTables,
) -> None:
    """Tiered and trimmed (hot retention 0: trimmed below min(T(p), A(p)) by the run),
    a key whose last change is only in Iceberg is found by the resolution of a write
    (its -U and -D carry the old row: the replay checks each against its mirror), by
    ``get`` and by the scan."""

    async def main() -> None:
        svc = service
        assert svc.cold is not None
        name = await _create(svc)
        d = svc.meta.get_table(TENANT, "ns", name)
        c = Components(svc.settings, svc.meta, svc.hot, svc.cold)
        w = Writer(svc, name, seed=23, keys=120)
        for run in range(4):
            await w.write(10)
            result = tier_table(c, d)
            tiered = svc.cold.table(d).snapshot().watermarks
            assert result.trimmed == dict(tiered), f"run {run}"
            for p in range(3):
                low = svc.hot.offsets(PartitionId(d.tenant, d.table_id, p)).low
                assert low == tiered[p] > 0  # every change below T(p) left the hot tier
            every = [(i, r) for i in range(120) for r in ("eu", "us", "ap")]
            assert await _get(svc, name, every) == w.model  # all from the state table
            await w.write(6)  # upserts and deletes of keys held in Iceberg only
            assert await _get(svc, name, every) == w.model  # hot and state together
            scanned = [b async for b in (await svc.scan(TENANT, "ns", name)).batches]
            assert _rows_by_key(pa.Table.from_batches(scanned).to_pylist()) == w.model
        changes = await _changelog(svc, name, 3)  # below T(p) from Iceberg
        assert replay(changes) == w.model
        assert sum(c["_change"] == Change.UPDATE_BEFORE for c in changes) > 50

    asyncio.run(main())


def test_a_versioned_write_compares_with_the_version_held_in_iceberg(
    service: StreamTables,
) -> None:
    async def main() -> None:
        svc = service
        assert svc.cold is not None
        name = f"k{uuid.uuid4().hex[:8]}"
        await svc.create_table(
            TENANT,
            "ns",
            name,
            FIELDS,
            1,
            primary_key=["id", "region"],
            merge_engine={"type": "versioned", "column": "v"},
        )
        d = svc.meta.get_table(TENANT, "ns", name)
        c = Components(svc.settings, svc.meta, svc.hot, svc.cold)

        async def write(v: int, note: str) -> int:
            row = {"id": 1, "region": "eu", "v": v, "note": note, "_change": 0}
            got = await svc.append(
                TENANT, "ns", name, [pa.RecordBatch.from_pylist([row], schema=WRITE)]
            )
            return got[0].count

        assert await write(5, "five") == 1  # +I
        tier_table(c, d)
        assert svc.hot.offsets(PartitionId(d.tenant, d.table_id, 0)).low == 1
        assert await write(3, "three") == 0  # a lower version than Iceberg's: nothing
        assert await write(7, "seven") == 2  # -U (the row in Iceberg), +U
        changes = await _changelog(svc, name, 1)
        assert [(x["_change"], x["v"], x["note"]) for x in changes] == [
            (0, 5, "five"),
            (1, 5, "five"),
            (2, 7, "seven"),
        ]

    asyncio.run(main())


def test_retention_shortens_the_changelog_never_past_the_state_table(
    service: StreamTables,
) -> None:
    """Retention by record count applies to the changelog: its earliest offset moves
    (a stream read below it is refused), but never above ``A(p)``, and the state table
    keeps every live key however old its last change."""

    async def main() -> None:
        from gateway.lake.retention import retain_table
        from gateway.wire.errors import OffsetOutOfRange

        svc = service
        assert svc.cold is not None
        name = await _create(svc, partitions=1)
        c = Components(svc.settings, svc.meta, svc.hot, svc.cold)
        w = Writer(svc, name, seed=31, keys=40)
        await w.write(8)
        d = svc.meta.get_table(TENANT, "ns", name)
        tier_table(c, d)
        applied = svc.cold.state_table(d).snapshot().applied_through(0)
        await w.write(8)  # changes above A(0), not yet applied
        high = svc.hot.offsets(PartitionId(d.tenant, d.table_id, 0)).high
        await svc.set_retention(TENANT, "ns", name, retention_records=5)  # the last 5
        d = svc.meta.get_table(TENANT, "ns", name)
        result = retain_table(c, d)
        assert result.earliest == {0: applied} and applied < high - 5
        with pytest.raises(OffsetOutOfRange):
            await svc.read(TENANT, "ns", name, 0, 0, 10, None)
        scanned = [b async for b in (await svc.scan(TENANT, "ns", name)).batches]
        assert _rows_by_key(pa.Table.from_batches(scanned).to_pylist()) == w.model
        tier_table(c, d)
        assert retain_table(c, d).earliest == {0: high - 5}  # applied now: it moves on
        rows = _state_iceberg(svc, name).scan().to_arrow().to_pylist()
        assert _rows_by_key(rows) == w.model
        keys = [(i, r) for i in range(40) for r in ("eu", "us", "ap")]
        assert await _get(svc, name, keys) == w.model

    asyncio.run(main())


def test_compaction_expiry_and_orphans_keep_the_state_table_bounded(
    settings: Settings,
) -> None:
    """Each tiering run leaves new state files; compaction merges a partition's small
    ones (keeping ``tidegate.applied``), snapshot expiry deletes the files only expired
    snapshots read, and the orphan clean-up removes a file no commit names, in the state
    table's folder as in the changelog's: the state table still equals the model."""
    from gateway.lake.compaction import compact_table
    from gateway.lake.expiry import clean_orphans, expire_table

    values = settings.model_dump()
    values["expiry"] = {"enabled": False, "retention_s": 60, "keep_last": 1, "orphan_age_s": 0}
    svc = build_service(Settings.explicit(**values))

    async def main() -> None:
        assert svc.cold is not None
        name = await _create(svc, partitions=2)
        d = svc.meta.get_table(TENANT, "ns", name)
        c = Components(svc.settings, svc.meta, svc.hot, svc.cold)
        w = Writer(svc, name, seed=41)
        for run in range(4):  # each run's keys past the last run's: a new file each
            rows = [
                {"id": 1000 * run + i, "region": r, "v": run, "note": None}
                for i in range(30)
                for r in ("eu", "us")
            ]
            w.model.update({(x["id"], x["region"]): x for x in rows})
            batch = [{**x, "_change": 0} for x in rows]
            await svc.append(TENANT, "ns", name, [pa.RecordBatch.from_pylist(batch, schema=WRITE)])
            tier_table(c, d)
        state = svc.cold.state_table(d)
        before = [len(state.key_files(state.snapshot(), p)) for p in range(2)]
        applied = dict(state.snapshot().applied)
        assert min(before) >= 2
        result = compact_table(c, d)
        snap = state.snapshot()
        assert [len(state.key_files(snap, p)) for p in range(2)] == [1, 1]
        assert result.removed >= sum(before) and dict(snap.applied) == applied
        assert _state_commits(_state_iceberg(svc, name))[-1]["tidegate.operation"] == "compact"
        stray = f"{state.data_location(0)}/stray.parquet"
        filesystem = svc.cold.storage_options().filesystem()[0]
        with filesystem.open_output_stream(stray.removeprefix("file://")) as out:
            out.write(b"not committed")
        expired = expire_table(c, d, now=time.time() + 120)  # past the 60 s retention
        assert expired.expired and expired.deleted_files >= sum(before)
        assert len(_state_iceberg(svc, name).snapshots()) == 1
        cleaned = clean_orphans(c, d, now=time.time() + 1)
        assert any(p.endswith("stray.parquet") for p in cleaned.removed)
        rows = _state_iceberg(svc, name).scan().to_arrow().to_pylist()
        assert _rows_by_key(rows) == w.model
        scanned = [b async for b in (await svc.scan(TENANT, "ns", name)).batches]
        assert _rows_by_key(pa.Table.from_batches(scanned).to_pylist()) == w.model
        await w.write(5)  # the compacted files take changes as any
        tier_table(c, d)
        rows = _state_iceberg(svc, name).scan().to_arrow().to_pylist()
        assert _rows_by_key(rows) == w.model

    try:
        asyncio.run(main())
    finally:
        svc.close()


def test_dropping_a_key_table_drops_its_state_table(service: StreamTables) -> None:
    async def main() -> None:
        svc = service
        assert svc.cold is not None
        name = await _create(svc, partitions=1)
        d = svc.meta.get_table(TENANT, "ns", name)
        w = Writer(svc, name, seed=2, keys=20)
        await w.write(3)
        tier_table(Components(svc.settings, svc.meta, svc.hot, svc.cold), d)
        folder = svc.cold.state_table(d).location.removeprefix("file://")
        assert Path(folder).is_dir()
        await svc.drop_table(TENANT, "ns", name)
        with pytest.raises(NoSuchTableError):
            _state_iceberg(svc, name)
        assert not Path(folder).exists()

    asyncio.run(main())


def test_writes_interleaved_with_every_lake_job_keep_each_reader_equal_to_the_model(
    settings: Settings,
) -> None:
    """Random upserts and deletes interleaved at random with tiering (which trims),
    compaction, snapshot expiry and orphan clean-up: after each step ``get`` of every key,
    the scan and, after each tiering run, the state table read by pyiceberg equal the
    model, and the changelog replays to it at the end."""
    from gateway.lake.compaction import compact_table
    from gateway.lake.expiry import clean_orphans, expire_table

    values = settings.model_dump()
    values["expiry"] = {"enabled": False, "retention_s": 60, "keep_last": 1, "orphan_age_s": 0}
    values["compaction"] = {"enabled": False, "min_files": 2}
    svc = build_service(Settings.explicit(**values))

    async def main() -> None:
        assert svc.cold is not None
        name = await _create(svc, partitions=2)
        d = svc.meta.get_table(TENANT, "ns", name)
        c = Components(svc.settings, svc.meta, svc.hot, svc.cold)
        w = Writer(svc, name, seed=97, keys=80)
        every = [(i, r) for i in range(80) for r in ("eu", "us", "ap")]
        jobs = random.Random(5)
        for step in range(24):
            await w.write(jobs.randint(1, 4))
            job = jobs.choice(["tier", "tier", "compact", "expire", "orphans", "none"])
            if job == "tier":
                tier_table(c, d)
                rows = _state_iceberg(svc, name).scan().to_arrow().to_pylist()
                assert _rows_by_key(rows) == w.model, f"step {step}"
            elif job == "compact":
                compact_table(c, d)
            elif job == "expire":
                expire_table(c, d, now=time.time() + 120)
            elif job == "orphans":
                clean_orphans(c, d, now=time.time() + 1)
            assert await _get(svc, name, every) == w.model, f"step {step} ({job})"
            scanned = [b async for b in (await svc.scan(TENANT, "ns", name)).batches]
            got = _rows_by_key(pa.Table.from_batches(scanned).to_pylist()) if scanned else {}
            assert got == w.model, f"step {step} ({job})"
        assert replay(await _changelog(svc, name, 2)) == w.model

    try:
        asyncio.run(main())
    finally:
        svc.close()


def test_a_changelog_table_made_without_change_gets_it_at_the_first_run(
    service: StreamTables,
) -> None:
    """A key table's Iceberg table made at a first use before key tables were tiered
    holds the user and system columns only: the first run adds ``_change``."""
    from gateway.wire.schema import parse_fields

    async def main() -> None:
        svc = service
        assert svc.cold is not None
        name = await _create(svc, partitions=1)
        d = svc.meta.get_table(TENANT, "ns", name)
        svc.cold._create_iceberg(d, parse_fields(d.fields, stored=True))  # type: ignore[attr-defined]
        assert "_change" not in svc.cold.table(d).file_schema().names
        w = Writer(svc, name, seed=8, keys=30)
        await w.write(6)
        tier_table(Components(svc.settings, svc.meta, svc.hot, svc.cold), d)
        assert "_change" in svc.cold.table(d).file_schema().names
        assert replay(await _changelog(svc, name, 1)) == w.model  # read from Iceberg
        rows = _state_iceberg(svc, name).scan().to_arrow().to_pylist()
        assert _rows_by_key(rows) == w.model

    asyncio.run(main())
