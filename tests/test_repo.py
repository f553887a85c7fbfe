"""Repository-level checks: generated stubs, the README quick start, packaging."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.services import REPO_ROOT, free_port, wait_for_port


def test_grpc_stubs_match_proto() -> None:
    proc = subprocess.run(
        [sys.executable, "scripts/gen_proto.py", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def quickstart_commands() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:sh|bash|console)?\n(.*?)```", section, re.S)
    assert block, "the quick start must hold one code block"
    return [
        line.split("#")[0].strip()
        for line in block.group(1).splitlines()
        if line.split("#")[0].strip()
    ]


def test_readme_quick_start_is_two_commands() -> None:
    assert quickstart_commands() == ["make run", "make test"]
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


@pytest.mark.integration
def test_run_command_serves_on_embedded_defaults(tmp_path: Path) -> None:
    """`make run` (the README's first command) starts a working gateway with no services."""
    http_port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    env.update(
        TIDEGATE_SERVER__HTTP_PORT=str(http_port),
        TIDEGATE_SERVER__GRPC_PORT=str(grpc_port),
        TIDEGATE_DATA_DIR=str(tmp_path / "data"),
    )
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "run"],
        cwd=REPO_ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(http_port, 120, proc)  # type: ignore[arg-type]
        base = f"http://127.0.0.1:{http_port}"
        with httpx.Client(base_url=base, timeout=10) as c:
            for _ in range(100):
                if c.get("/readyz").status_code == 200:
                    break
            # The operator key was generated at first start and kept in the data folder.
            operator = (tmp_path / "data" / "operator.key").read_text().strip()
            admin = {"authorization": f"Bearer {operator}"}
            assert c.get("/v1/tables").status_code == 401
            assert c.post("/v1/admin/tenants", json={"name": "demo"}, headers=admin).is_success
            issued = c.post("/v1/admin/tenants/demo/keys", headers=admin)
            assert issued.status_code == 201, issued.text
            c.headers["authorization"] = f"Bearer {issued.json()['api_key']}"
            created = c.post(
                "/v1/tables",
                json={"namespace": "demo", "name": "t", "schema": {"v": "int64"}, "partitions": 1},
            )
            assert created.status_code == 201, created.text
            assert c.post("/v1/tables/demo/t/records", json={"rows": [{"v": 7}]}).status_code == 200
            got = c.get("/v1/tables/demo/t/partitions/0/records", params={"offset": 0}).json()
            assert [r["v"] for r in got["records"]] == [7]
        assert (tmp_path / "data" / "metadata.db").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert b"stopped" in out, out.decode(errors="replace")[-2000:]
    assert operator.encode() in out, "the generated operator key is printed at first start"
