"""Issue 16, item 7: what a gateway and `tidegate tier` print. The libraries' INFO chatter
(pyiceberg's "Loaded FileIO" on every table load, alembic's plugins and migrations) is off
by default and can be turned back up; `TIDEGATE_LOG__FORMAT=json` / `--log-format json`
make every line one JSON object."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_tiering_gateway import _wait_tiered
from tests.services import REPO_ROOT, GatewayProcess

pytestmark = pytest.mark.integration

CHATTY = ("pyiceberg", "alembic")


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every non-empty line as a JSON object (fails on the first line that is not one)."""
    records = []
    for line in text.splitlines():
        if line.strip():
            record = json.loads(line)
            assert isinstance(record, dict), line
            records.append(record)
    return records


def _tier(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "tier", *args],
        env=env,
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_gateway_and_tier_logs_are_quiet_and_json_on_demand(tmp_path: Path) -> None:
    env = {"TIDEGATE_TIERING__INTERVAL_S": "0.3", "TIDEGATE_TIERING__HOT_RETENTION_S": "0"}
    gw = GatewayProcess(tmp_path / "gw", {**env, "TIDEGATE_LOG__FORMAT": "json"}).start()
    try:
        with gw.client() as c:
            c.create_table("app.ev", {"n": "int64"}, partitions=2)
            for i in range(10):
                c.append("app.ev", [{"n": i}], partition=i % 2)
        _wait_tiered(gw, "app.ev", [5, 5])
        with gw.client() as c:  # reads of tiered records load the Iceberg table (a FileIO each)
            assert len(c.read("app.ev", partition=0, offset=0)) == 5
    finally:
        gw.stop()
    records = _json_lines(gw.log_path.read_text())
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records), records
    loggers = {r["logger"] for r in records}
    assert "tidegate.tiering" in loggers and "tidegate" in loggers, loggers
    runs = [re.match(r"tiering run: 1 tables, (\d+) records", r["message"]) for r in records]
    assert sum(int(m[1]) for m in runs if m) == 10  # in one pass or several
    chatter = [r for r in records if r["logger"].startswith(CHATTY) and r["level"] == "INFO"]
    assert chatter == []

    # `tidegate tier` on the same data folder, once the gateway that owns it has stopped.
    job_env = {k: v for k, v in gw.env().items() if k != "TIDEGATE_LOG__FORMAT"}
    # (An idle run logs at DEBUG; the libraries stay at WARNING whatever --log-level says.
    # Everything was tiered: the run visits at most the table a last mark, written as the
    # gateway stopped, still names; issue 30.)
    text = _tier(job_env, "--log-level", "debug")
    assert text.returncode == 0, text.stderr
    assert re.search(r"tiered 0 records in [01] tables?\n", text.stdout), text.stdout
    assert "warning: no tables found" not in text.stderr
    assert re.search(r"DEBUG tidegate.tiering: tiering run: [01] tables, 0 records", text.stderr)
    assert not [ln for ln in text.stderr.splitlines() if any(c in ln for c in CHATTY)]

    as_json = _tier(job_env, "--log-format", "json", "--log-level", "debug")
    assert as_json.returncode == 0, as_json.stderr
    assert any(r["logger"] == "tidegate.tiering" for r in _json_lines(as_json.stderr))

    # The setting that turns a library back up: the chatter the checks above rule out.
    # (--all: a sweep visits the table, so its Iceberg table is loaded.)
    loud = _tier({**job_env, "TIDEGATE_LOG__LEVELS": '{"pyiceberg.io": "INFO"}'}, "--all")
    assert loud.returncode == 0, loud.stderr
    assert "INFO pyiceberg.io: Loaded FileIO" in loud.stderr
