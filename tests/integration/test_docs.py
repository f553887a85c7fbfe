"""The README's examples run, as written, against a live gateway."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.services import FIRST_CONTACT_S, REPO_ROOT, GatewayProcess

pytestmark = pytest.mark.integration


def blocks(heading: str, lang: str) -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


#: A line of DuckDB's progress bar: ``100% ▕████▏ (00:00:02.58 elapsed)``.
DUCKDB_BAR = re.compile(r"\s*\d{1,3}% ▕")


def run(argv_or_script: str, env: dict[str, str], cwd: Path, *, python: bool = False) -> str:
    """Run a snippet as the README's reader would (bash, or the Python interpreter) and
    return what it printed; a failing snippet fails the test."""
    argv = (
        [sys.executable, "-c", argv_or_script]
        if python
        else ["bash", "-euo", "pipefail", "-c", argv_or_script]
    )
    return subprocess.run(
        argv, check=True, env=env, timeout=120, cwd=cwd, capture_output=True, text=True
    ).stdout


def user_env(target: str) -> dict[str, str]:
    """A shell of a user: the venv's commands on PATH, no TIDEGATE_ setting but the target."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["TIDEGATE_TARGET"] = target
    env["TIDEGATE_CONNECT_TIMEOUT"] = str(FIRST_CONTACT_S)  # a gateway we started: see there
    return env


def test_readme_examples(gateway: GatewayProcess, tmp_path: Path) -> None:
    (get_key,) = blocks("Get a key", "sh")
    curl, cli = blocks("Use it", "sh")
    (python,) = blocks("Use it", "python")
    # The folder `make run` would have made: the operator key, where the README reads it.
    (tmp_path / "tidegate-data").mkdir()
    (tmp_path / "tidegate-data" / "operator.key").write_text(gateway.operator_key + "\n")
    env = user_env(gateway.grpc_target)
    key = run(get_key + '\necho "$TIDEGATE_API_KEY"', env, tmp_path).splitlines()[-1]
    assert key.startswith("tg_")
    env["TIDEGATE_API_KEY"] = key
    curl = curl.replace("localhost:8080", gateway.http_url.removeprefix("http://")).replace(
        "curl -s", "curl -sf"
    )
    answers = run(curl, env, tmp_path)
    # The append lands where the text says, and the read it shows returns that row.
    assert '"partition":1,"base_offset":0' in answers.replace(" ", "")
    assert '"customer":"ada"' in answers.replace(" ", "")
    code = python.replace("127.0.0.1:50051", gateway.grpc_target)
    out = run(code, env, tmp_path, python=True)
    assert "AppendRange(partition=0, base_offset=0, count=2, duplicate=False)" in out
    assert "RecordMetadata(partition=0, offset=2)" in out
    assert "2 view 3" in out
    assert "[{'kind': 'buy'}]" in out
    (tmp_path / "clicks.csv").write_text("user,page\nada,/home\nalan,/buy\n")
    out = run(cli, env, tmp_path)
    assert "appended 2 records" in out
    read_all = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert sorted(r["user"] for r in read_all[:2]) == ["ada", "alan"]  # both partitions
    with gateway.client(api_key=key) as c:
        orders = c.describe_table("shop.orders")
        assert sum(p.high_watermark for p in orders.partition_info) == 1
        clicks = c.describe_table("shop.clicks")
        assert sum(p.high_watermark for p in clicks.partition_info) == 2
    with gateway.client() as other:  # the bootstrap tenant sees none of shop's tables
        assert not other.list_tables("shop")


def _duckdb_home(home: Path) -> None:
    """DuckDB's extensions installed in ``home`` from their PyPI packages, so the README's
    ``INSTALL iceberg`` finds them there instead of downloading them (no internet here)."""
    import duckdb

    from tests.cold.helpers import extension_file

    home.mkdir(exist_ok=True)
    con = duckdb.connect(config={"extension_directory": str(home / ".duckdb" / "extensions")})
    for name in ("avro", "httpfs", "aws", "iceberg"):
        con.execute(f"INSTALL '{extension_file(name)}'")
    con.close()


def test_readme_tiering_and_direct_iceberg_reads(tmp_path: Path) -> None:
    """The Tiering section's commands, then "Query it from any engine": pyiceberg and DuckDB
    through the gateway's Iceberg REST catalog, on a gateway that tiers every half second
    (the text waits one 30 s interval: the test waits one of its)."""
    (commands,) = blocks("Tiering", "sh")
    (python,) = blocks("Query it from any engine", "python")
    gateway = GatewayProcess(
        tmp_path / "gw",
        {
            "TIDEGATE_HOT__TYPE": "disk",
            "TIDEGATE_TIERING__INTERVAL_S": "0.5",
            "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
            "TIDEGATE_METERING__FLUSH_INTERVAL_S": "0.5",
        },
    )
    gateway.start()
    try:
        env = user_env(gateway.grpc_target)
        env["TIDEGATE_API_KEY"] = str(gateway.api_key)
        assert "sleep 35" in commands
        out = run(commands.replace("sleep 35", "sleep 3"), env, tmp_path)
        lines = out.splitlines()
        # The last partition-0 row is describe's (create printed one before the appends).
        part0 = [line.split() for line in lines if line.strip().startswith("0 ")][-1]
        assert part0[:6] == ["0", "0", "2", "2", "0", "0"]  # HW 2, T 2, no lag
        read = [json.loads(line) for line in lines if line.startswith("{")]
        assert [(r["page"], r["_tier"]) for r in read] == [("/", "iceberg"), ("/buy", "iceberg")]
        assert any(line.split()[2:4] == ["append", "2"] for line in lines if line[:1].isdigit())
        _duckdb_home(tmp_path / "home")
        env["HOME"] = str(tmp_path / "home")
        code = python.replace("127.0.0.1:8080", gateway.http_url.removeprefix("http://"))
        printed = run(code, env, tmp_path, python=True)
        expected = [line.lstrip("# ") for line in python.splitlines() if line.startswith("# [")]
        # DuckDB draws a progress bar on stdout when a query runs past 2 s (a loaded machine),
        # redrawn with carriage returns and closed by a line break: the bar is not the
        # snippet's output, its lines and the blank ones it leaves are left out.
        lines = [ln for ln in printed.splitlines() if ln.strip() and not DUCKDB_BAR.match(ln)]
        assert lines == expected
        # Usage meters the tiered bytes too (it said cold_bytes 0 after tiering).
        deadline = time.monotonic() + 30
        with gateway.admin() as admin:
            while not any(r["cold_bytes"] > 0 for r in admin.usage(gateway.tenant)):
                assert time.monotonic() < deadline, admin.usage(gateway.tenant)
                time.sleep(0.2)
    finally:
        gateway.stop()
