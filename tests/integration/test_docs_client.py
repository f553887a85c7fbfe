"""docs/client.md runs, as written, against a live gateway."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.services import REPO_ROOT, GatewayProcess

pytestmark = pytest.mark.integration


def test_client_guide_runs(gateway: GatewayProcess) -> None:
    text = (REPO_ROOT / "docs" / "client.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 6
    code = "\n".join(blocks).replace("127.0.0.1:50051", gateway.grpc_target)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "TIDEGATE_API_KEY": str(gateway.api_key)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "typed error: TABLE_NOT_FOUND" in lines
    assert "4 ('user',) ['user', 'page', 'ms']" in lines
    assert "0" in lines  # the resumed group consumer found nothing left
    # Two members of one group share the table's four partitions, each read once.
    assert "a holds [0, 1, 2, 3] at generation 1" in lines
    assert "each partition once: [0, 1, 2, 3]" in lines
    assert any(line.startswith("stable generation ") for line in lines)
    assert "[]" in lines  # the tail that rides outages, started at the end
    # The asyncio member polled every record and auto-committed it on close.
    (async_line,) = [line for line in lines if line.endswith("}") and line[0].isdigit()]
    count, offsets = async_line.split(" ", 1)
    assert int(count) == sum(eval(offsets).values())
    assert "schema version 1 ['ref']" in lines
    assert "refused: SCHEMA_CHANGE_REFUSED" in lines
    assert "over Flight: True" in lines  # the test gateways have a Flight edge
