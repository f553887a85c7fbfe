"""Compaction killed at each step: the job, a real child process (``python -m tiering
compact``), SIGKILLs itself after planning, after writing its files, after its commit. The
table keeps every record exactly once (for the gateway's reads and for DuckDB), and the
next run finishes the work."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from gateway.cold.base import fs_path
from gateway.config import Settings
from gateway.lake.compaction import CRASH_POINT_ENV
from gateway.lake.tiering import tier_table
from tests.cold.helpers import duckdb_rows
from tests.lake.conftest import Harness, tier_settings
from tests.lake.test_crash import _env, _read_all
from tests.services import REPO_ROOT, run_module

pytestmark = pytest.mark.integration


def _compact_in_child(settings: Settings, crash: str | None) -> subprocess.CompletedProcess[str]:
    env = _env(settings, None)
    if crash:
        env[CRASH_POINT_ENV] = crash
    argv = ["compact", "--runner", "local", "--log-level", "WARNING"]
    return run_module("tiering", argv, env, REPO_ROOT)


@pytest.mark.parametrize("crash", ["after_plan", "after_write", "after_commit"])
def test_killed_compaction_leaves_each_record_once(crash: str, tmp_path: Path) -> None:
    settings = tier_settings("disk", tmp_path, None)
    settings = Settings.explicit(**{**settings.model_dump(), "tenant": "default"})
    h = Harness(settings)
    d = h.create_table(partitions=2, tenant="default")
    for i in range(4):
        for p in range(2):
            h.append(d, p, [{"k": f"{i}", "n": 3 * i + j} for j in range(3)])
        tier_table(h.c, d, trim=False)
    cold = h.c.cold.table(d)
    folder = Path(fs_path(cold.data_location(0))).parent
    files_before = sorted(folder.rglob("*.parquet"))
    h.close()
    before = _read_all(settings, d)
    expected = [(p, o, o) for p in range(2) for o in range(12)]

    killed = _compact_in_child(settings, crash)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    h = Harness(settings)
    try:
        cold = h.c.cold.table(d)
        live = [cold.files(cold.snapshot(), p, 0, 2**62) for p in range(2)]
        on_disk = sorted(folder.rglob("*.parquet"))
        if crash == "after_commit":
            assert [len(fs) for fs in live] == [1, 1]
        else:
            assert [len(fs) for fs in live] == [4, 4]
            # after_write: the rewritten files are orphans, never visible.
            assert len(on_disk) == len(files_before) + (2 if crash == "after_write" else 0)
        assert [(r["_partition"], r["_offset"], r["n"]) for r in h.cold_rows(d)] == expected
        assert h.watermarks(d) == {0: 12, 1: 12}
    finally:
        h.close()
    assert _read_all(settings, d) == before

    done = _compact_in_child(settings, None)
    assert done.returncode == 0, done.stderr

    h = Harness(settings)
    try:
        cold = h.c.cold.table(d)
        assert [len(cold.files(cold.snapshot(), p, 0, 2**62)) for p in range(2)] == [1, 1]
        assert [(r["_partition"], r["_offset"], r["n"]) for r in h.cold_rows(d)] == expected
        ddb = duckdb_rows(h.c.cold, cold)
        assert [(r["_partition"], r["_offset"], r["n"]) for r in ddb] == expected
        assert h.watermarks(d) == {0: 12, 1: 12}
    finally:
        h.close()
    assert _read_all(settings, d) == before
