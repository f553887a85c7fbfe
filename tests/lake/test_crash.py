"""Exactly once across crashes: the tiering job, a real child process, SIGKILLs itself at
a crash point (before its commit, just after it, after the cached watermarks are
updated); the next run leaves every record in Iceberg exactly once and reads unchanged."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Settings
from gateway.hot import PartitionId
from gateway.lake.tasks import CRASH_POINT_ENV
from gateway.server.app import build_service
from tests.lake.conftest import Harness, tier_settings
from tests.services import REPO_ROOT, RedisServer, run_module

pytestmark = pytest.mark.integration


def _env(settings: Settings, crash: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    env.update(
        {
            "TIDEGATE_DATA_DIR": str(settings.data_dir),
            "TIDEGATE_HOT__TYPE": settings.hot.type,
            "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
        }
    )
    if settings.hot.type == "redis":
        env["TIDEGATE_HOT__URL"] = settings.hot.url  # type: ignore[union-attr]
    if crash:
        env[CRASH_POINT_ENV] = crash
    return env


def _tier_in_child(settings: Settings, crash: str | None) -> subprocess.CompletedProcess[str]:
    """``python -m tiering --runner local`` in a process of its own (forked where it can)."""
    argv = ["--runner", "local", "--log-level", "WARNING"]
    return run_module("tiering", argv, _env(settings, crash), REPO_ROOT)


def _read_all(settings: Settings, d: Any) -> list[list[tuple[int, int]]]:
    svc = build_service(settings)

    async def main() -> list[list[tuple[int, int]]]:
        out = []
        for p in range(d.partitions):
            res = await svc.read(d.tenant, d.namespace, d.name, p, 0, max_records=10_000)
            out.append([(r["_offset"], r["n"]) for b in res.batches for r in b.to_pylist()])
        return out

    try:
        return asyncio.run(main())
    finally:
        svc.close()


@pytest.mark.parametrize(
    ("crash", "kind"),
    [
        ("before_commit", "disk"),
        ("after_commit", "disk"),
        ("after_cache", "disk"),
        ("after_commit", "redis"),
    ],
)
def test_killed_tiering_job_leaves_each_record_once(
    crash: str, kind: str, tmp_path: Path, redis_server: RedisServer
) -> None:
    settings = tier_settings(kind, tmp_path, redis_server if kind == "redis" else None)
    settings = Settings.explicit(**{**settings.model_dump(), "tenant": "default"})
    h = Harness(settings)
    d = h.create_table(partitions=2, tenant="default")
    for p in range(2):
        h.append(d, p, [{"k": "a", "n": i} for i in range(5)])
        h.append(d, p, [{"k": "b", "n": i} for i in range(5, 8)])
    h.close()
    before = _read_all(settings, d)

    killed = _tier_in_child(settings, crash)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    h = Harness(settings)
    committed = h.watermarks(d)
    cached = [p.tiered_watermark for p in h.c.meta.partitions(d.table_id)]
    if crash == "before_commit":
        assert committed == {} and h.cold_rows(d) == []  # orphan files only
    else:
        assert committed == {0: 8, 1: 8}
        assert cached == ([0, 0] if crash == "after_commit" else [8, 8])
    for p in range(2):
        h.append(d, p, [{"k": "c", "n": 100 + p}])
    h.close()
    assert _read_all(settings, d) == [[*b, (8, 100 + p)] for p, b in enumerate(before)]

    done = _tier_in_child(settings, None)
    assert done.returncode == 0, done.stderr

    h = Harness(settings)
    try:
        assert h.watermarks(d) == {0: 9, 1: 9}
        rows = h.cold_rows(d)
        assert [(r["_partition"], r["_offset"]) for r in rows] == [
            (p, o) for p in range(2) for o in range(9)
        ]
        assert [p.tiered_watermark for p in h.c.meta.partitions(d.table_id)] == [9, 9]
        for p in range(2):
            low = h.c.hot.offsets(PartitionId(d.tenant, d.table_id, p)).low
            assert low <= 9 and (kind == "disk" or low == 9)
    finally:
        h.close()
    # Reads are unchanged, now served from Iceberg (the hot tier was trimmed).
    assert _read_all(settings, d) == [[*b, (8, 100 + p)] for p, b in enumerate(before)]
