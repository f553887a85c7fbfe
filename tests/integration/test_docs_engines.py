"""docs/engines.md: the pyiceberg and DuckDB examples run, as written, against a live gateway
(its Iceberg REST catalog). The Spark and Trino ones need Iceberg's Spark runtime jar and a
Trino server, which no package registry this project uses ships: they are not run here."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.integration.test_docs import _duckdb_home, run, user_env
from tests.services import REPO_ROOT, GatewayProcess

pytestmark = pytest.mark.integration


def blocks(heading: str, lang: str) -> list[str]:
    page = (REPO_ROOT / "docs" / "engines.md").read_text()
    section = page.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def test_the_pyiceberg_and_duckdb_examples_run(tmp_path: Path) -> None:
    examples = blocks("pyiceberg", "python") + blocks("DuckDB", "python")
    assert len(examples) == 3
    assert blocks("Spark with Iceberg's runtime", "sh") and blocks("Trino", "properties")
    gateway = GatewayProcess(
        tmp_path / "gw",
        {
            "TIDEGATE_HOT__TYPE": "disk",
            "TIDEGATE_TIERING__INTERVAL_S": "0.5",
            "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
        },
    ).start()
    try:
        with gateway.client() as c:
            c.create_table("shop.visits", {"page": "string", "ms": "int64"}, partitions=1)
            c.append("shop.visits", [{"page": "/", "ms": 12}, {"page": "/buy", "ms": 40}])
            deadline = time.monotonic() + 30
            while c.describe_table("shop.visits").partition_info[0].tiered_watermark < 2:
                assert time.monotonic() < deadline, "not tiered"
                time.sleep(0.2)
        env = user_env(gateway.grpc_target)
        env.update({"TIDEGATE_API_KEY": str(gateway.api_key), "TIDEGATE_TENANT": gateway.tenant})
        _duckdb_home(tmp_path / "home")
        env["HOME"] = str(tmp_path / "home")
        for code in examples:
            here = code.replace("127.0.0.1:8080", gateway.http_url.removeprefix("http://"))
            printed = run(here, env, tmp_path, python=True)
            expected = [line[2:] for line in code.splitlines() if line.startswith("# ")]
            assert printed.splitlines() == expected, code
    finally:
        gateway.stop()
