"""The README's examples run, as written, against a live gateway."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import REPO_ROOT, GatewayProcess

pytestmark = pytest.mark.integration


def blocks(lang: str) -> list[str]:
    section = (REPO_ROOT / "README.md").read_text().split("## Use it", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def test_readme_examples(gateway: GatewayProcess, tmp_path: Path) -> None:
    curl, cli = blocks("sh")
    (python,) = blocks("python")
    env = {**os.environ, "TIDEGATE_TARGET": gateway.grpc_target}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    curl = curl.replace("localhost:8080", gateway.http_url.removeprefix("http://")).replace(
        "curl -s", "curl -sf"
    )
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", curl],
        check=True,
        env=env,
        timeout=60,
        capture_output=True,
    )
    code = python.replace("127.0.0.1:50051", gateway.grpc_target)
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env=env,
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert "AppendRange(partition=0, base_offset=0, count=2, duplicate=False)" in out.stdout
    assert "[{'kind': 'buy'}]" in out.stdout
    (tmp_path / "clicks.csv").write_text("user,page\nada,/home\nalan,/buy\n")
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", cli],
        check=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert "appended 2 records" in out.stdout
    with gateway.client() as c:
        orders = c.describe_table("shop.orders")
        assert sum(p.high_watermark for p in orders.partition_info) == 1
        clicks = c.describe_table("shop.clicks")
        assert sum(p.high_watermark for p in clicks.partition_info) == 2
