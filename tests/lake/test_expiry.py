"""Snapshot expiry with file deletion, snapshot leases of scans and plans, and the orphan
clean-up, over a real Iceberg SQL catalog and local warehouse. Every check of files is
file by file: each file a retained snapshot references exists, each one no snapshot
references is gone (or, for orphans, only once older than the safety window)."""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from gateway.cold.base import SnapshotInfo, fs_path
from gateway.config import Settings
from gateway.lake.compaction import compact_table
from gateway.lake.components import Components
from gateway.lake.expiry import choose_expired, clean_orphans, expire_table
from gateway.lake.tiering import tier_table
from gateway.meta import TableDef
from gateway.server.app import build_service
from gateway.wire.errors import SnapshotNotFound
from tests.lake.conftest import Harness, tier_settings
from tests.lake.test_crash import _tier_in_child


def _settings(tmp_path: Path, **expiry: Any) -> Settings:
    base = tier_settings("disk", tmp_path, None).model_dump()
    base["tenant"] = "default"
    base["expiry"] = {"retention_s": 60, "keep_last": 1, **expiry}
    return Settings.explicit(**base)


def _served(settings: Settings) -> tuple[Any, Harness]:
    """A gateway's service and a harness over the very same backends (the disk hot tier
    has one owner)."""
    svc = build_service(settings)
    assert svc.cold is not None
    h = Harness.__new__(Harness)
    h.settings = settings
    h.c = Components(settings, svc.meta, svc.hot, svc.cold)
    return svc, h


def _fill(h: Harness, d: TableDef, commits: int, start: int = 0) -> None:
    for i in range(start, start + commits):
        for p in range(d.partitions):
            h.append(d, p, [{"k": f"{i}", "n": 3 * i + j} for j in range(3)])
        tier_table(h.c, d, trim=False)


def _on_disk(h: Harness, d: TableDef) -> set[str]:
    root = Path(fs_path(h.c.cold.table(d).location))
    return {str(p) for p in root.rglob("*") if p.is_file()}


def _referenced(h: Harness, d: TableDef) -> set[str]:
    return {fs_path(p) for p in h.c.cold.table(d).referenced_files()}


def _keys(h: Harness, d: TableDef) -> list[tuple[int, int, int]]:
    return [(r["_partition"], r["_offset"], r["n"]) for r in h.cold_rows(d)]


def test_choose_expired_counts_age_from_replacement() -> None:
    snaps = [SnapshotInfo(i, t, "append", {}) for i, t in [(1, 0), (2, 1000), (3, 50_000)]]
    # 1 was replaced at 1 s, 2 at 50 s; 3 is current.
    assert choose_expired(snaps, now_ms=61_000, retention_ms=60_000, keep_last=1) == [1]
    assert choose_expired(snaps, now_ms=111_000, retention_ms=60_000, keep_last=1) == [1, 2]
    assert choose_expired(snaps, now_ms=111_000, retention_ms=60_000, keep_last=2) == [1]
    assert choose_expired(snaps, now_ms=111_000, retention_ms=60_000, keep_last=1, pinned=[1]) == [
        2
    ]
    # The current snapshot is never expired, however old.
    assert choose_expired(snaps[:1], now_ms=10**12, retention_ms=0, keep_last=1) == []


def test_expiry_deletes_exactly_the_files_no_snapshot_references(tmp_path: Path) -> None:
    h = Harness(_settings(tmp_path))
    try:
        d = h.create_table(partitions=2, tenant="default")
        _fill(h, d, 4)
        compact_table(h.c, d)
        small = _on_disk(h, d)
        assert len(h.c.cold.table(d).snapshots()) == 5

        # Within the retention nothing goes.
        soon = expire_table(h.c, d, now=time.time() + 30)
        assert soon.expired == () and _on_disk(h, d) == small

        later = expire_table(h.c, d, now=time.time() + 3600)
        assert len(later.expired) == 4 and later.deleted_files > 0
        snaps = h.c.cold.table(d).snapshots()
        assert len(snaps) == 1
        referenced = _referenced(h, d)
        on_disk = _on_disk(h, d)
        for path in referenced:  # every referenced file is still there
            assert path in on_disk, path
        data = [p for p in on_disk if p.endswith(".parquet")]
        assert sorted(data) == sorted(p for p in referenced if p.endswith(".parquet"))
        assert len(data) == 2  # one compacted file per partition
        assert len(small - on_disk) == later.deleted_files
        assert _keys(h, d) == [(p, o, o) for p in range(2) for o in range(12)]
        assert h.c.meta.last_runs(d.table_id)["expire"].outcome == "ok"
    finally:
        h.close()


def test_a_plans_lease_keeps_its_files_until_it_ends(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    settings = Settings.explicit(
        **{**settings.model_dump(), "cold": {**settings.cold.model_dump(), "presign_expiry_s": 600}}
    )
    svc, h = _served(settings)
    try:
        d = h.create_table(partitions=1, tenant="default")
        _fill(h, d, 3)
        plan = asyncio.run(svc.plan("default", d.namespace, d.name))
        planned = [f.url for f in plan.files]
        assert len(planned) == 3
        [lease] = h.c.meta.leases(d.table_id)
        assert (lease.kind, lease.snapshot_id) == ("plan", plan.snapshot_id)
        compact_table(h.c, d)
        _fill(h, d, 1, start=3)

        compaction = h.c.cold.table(d).snapshots()[-2]
        # Past the retention, but within the plan's 600 s lease: its snapshot is kept.
        held = expire_table(h.c, d, now=time.time() + 300)
        assert plan.snapshot_id in held.pinned and plan.snapshot_id not in held.expired
        assert compaction.snapshot_id in held.expired  # the ones around it went
        # Time travel to when the expired compaction snapshot was current is refused,
        # not answered with the older snapshot the lease kept.
        when = dt.datetime.fromtimestamp(compaction.timestamp_ms / 1000, dt.UTC)
        with pytest.raises(SnapshotNotFound, match="has been expired"):
            h.c.cold.table(d).snapshot(when)
        for url in planned:  # the plan can still be read, file by file
            assert pq.read_table(url).num_rows == 3
        # Once the lease has ended, the plan's snapshot and its small files go.
        after = expire_table(h.c, d, now=time.time() + 3600)
        assert plan.snapshot_id in after.expired
        for url in planned:
            assert not Path(url).exists(), url
        assert _keys(h, d) == [(0, o, o) for o in range(12)]
    finally:
        svc.close()


def test_plans_of_a_snapshot_share_a_lease_while_it_outlasts_each_by_the_url_lifetime(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path)
    settings = Settings.explicit(
        **{**settings.model_dump(), "cold": {**settings.cold.model_dump(), "presign_expiry_s": 3}}
    )
    svc, h = _served(settings)
    lifetime = dt.timedelta(seconds=3)
    try:
        d = h.create_table(partitions=1, tenant="default")
        _fill(h, d, 2)

        def plan() -> tuple[int, dt.datetime]:
            at = dt.datetime.now(dt.UTC)
            p = asyncio.run(svc.plan("default", d.namespace, d.name))
            assert p.snapshot_id is not None
            # Whatever lease it shares, the plan's files are held a URL's lifetime.
            held = [x.expires_at for x in h.c.meta.leases(d.table_id)]
            assert held and max(held) >= at + lifetime
            return p.snapshot_id, at

        first, _ = plan()
        [lease] = h.c.meta.leases(d.table_id)
        assert (lease.kind, lease.snapshot_id) == ("plan", first)
        assert plan()[0] == first  # planned again at once: the same lease
        assert [x.lease_id for x in h.c.meta.leases(d.table_id)] == [lease.lease_id]

        # Once less than a URL's lifetime is left of it, the next plan takes a new one.
        time.sleep(
            max(0.0, (lease.expires_at - lifetime - dt.datetime.now(dt.UTC)).total_seconds())
        )
        time.sleep(0.05)
        assert plan()[0] == first
        assert len(h.c.meta.leases(d.table_id)) == 2

        # A new snapshot: a lease of its own.
        _fill(h, d, 1, start=2)
        second, _ = plan()
        assert second != first
        assert second in {x.snapshot_id for x in h.c.meta.leases(d.table_id)}
        # Time travel still takes a lease per plan (and checks its snapshot once leased).
        before = {x.lease_id for x in h.c.meta.leases(d.table_id)}
        asyncio.run(svc.plan("default", d.namespace, d.name, as_of=first))
        asyncio.run(svc.plan("default", d.namespace, d.name, as_of=first))
        new = [x for x in h.c.meta.leases(d.table_id) if x.lease_id not in before]
        assert [x.snapshot_id for x in new] == [first, first]
    finally:
        svc.close()


def test_a_scans_lease_lasts_while_it_reads(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    svc, h = _served(settings)
    try:
        d = h.create_table(partitions=1, tenant="default")
        _fill(h, d, 2)

        async def scan() -> list[int]:
            result = await svc.scan("default", d.namespace, d.name)
            it = result.batches
            first = await it.__anext__()
            [lease] = h.c.meta.leases(d.table_id)
            assert (lease.kind, lease.snapshot_id) == ("scan", result.snapshot_id)
            compact_table(h.c, d)
            # Past the 60 s retention, within the scan's lease (expiry.scan_lease_s).
            expired = expire_table(h.c, d, now=time.time() + 1800)
            assert result.snapshot_id in expired.pinned
            rest = [b async for b in it]
            # Released once the scan ended (off the request path: wait for it a moment).
            deadline = time.monotonic() + 10
            while h.c.meta.leases(d.table_id) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert h.c.meta.leases(d.table_id) == []
            return [n for b in [first, *rest] for n in b.column("n").to_pylist()]

        assert sorted(asyncio.run(scan())) == list(range(6))
    finally:
        svc.close()


def test_orphans_of_a_killed_tiering_job_go_only_after_the_window(tmp_path: Path) -> None:
    settings = _settings(tmp_path, orphan_age_s=3600)
    h = Harness(settings)
    d = h.create_table(partitions=2, tenant="default")
    _fill(h, d, 2)
    for p in range(2):
        h.append(d, p, [{"k": "late", "n": 6}])
    before = _on_disk(h, d)
    h.close()
    killed = _tier_in_child(settings, "before_commit")
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    h = Harness(settings)
    try:
        orphans = _on_disk(h, d) - before
        assert len(orphans) == 2  # one file per partition, never committed
        referenced = _referenced(h, d)
        assert not orphans & referenced

        young = clean_orphans(h.c, d, now=time.time() + 60)
        assert young.removed == () and young.young == 2
        assert _on_disk(h, d) == before | orphans

        old = clean_orphans(h.c, d, now=time.time() + 3600 + 60)
        assert sorted(fs_path(p) for p in old.removed) == sorted(orphans)
        on_disk = _on_disk(h, d)
        assert on_disk == before
        for path in referenced:
            assert path in on_disk, path
        assert _keys(h, d) == [(p, o, o) for p in range(2) for o in range(6)]
        # The next tiering run moves the late records as if nothing had happened.
        tier_table(h.c, d, trim=False)
        assert _keys(h, d) == [(p, o, o) for p in range(2) for o in range(7)]
        assert h.c.meta.last_runs(d.table_id)["orphans"].outcome == "ok"
    finally:
        h.close()
