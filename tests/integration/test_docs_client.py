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
    assert "schema version 1 ['ref']" in lines
    assert "refused: SCHEMA_CHANGE_REFUSED" in lines
    assert "over Flight: True" in lines  # the test gateways have a Flight edge
