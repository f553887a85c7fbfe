"""docs/client.md and docs/engines.md, run as their reader runs them: in a fresh terminal
whose PATH starts with the checkout's virtualenv (Get a key's export), holding a tenant's
key, each Python block saved to a file and run with `python`. docs/client.md's blocks make
one program, in page order (the page says they run in order); docs/engines.md's are
separate programs. The Spark and Trino examples of docs/engines.md are accounted for in
tests/integration/test_docs.py (ELSEWHERE)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.docs_runner import Block, Shell, blocks, expected_output
from tests.integration.test_docs import PAGES_RUN
from tests.services import REPO_ROOT, GatewayProcess

pytestmark = pytest.mark.integration


def _shell(folder: Path, gateway: GatewayProcess, **env: str) -> Shell:
    return Shell(
        folder,
        replace={
            "127.0.0.1:50051": gateway.grpc_target,
            "127.0.0.1:8080": gateway.http_url.removeprefix("http://"),
        },
        env={
            "PATH": f"{folder / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "TIDEGATE_API_KEY": str(gateway.api_key),
            **env,
        },
    )


def _page(name: str) -> list[Block]:
    found = blocks(REPO_ROOT / "docs" / name)
    return [b for b in found if (b.page, b.heading) in PAGES_RUN]


@pytest.mark.parametrize("gateway", ["disk"], indirect=True)
def test_the_client_guide_runs(gateway: GatewayProcess, tmp_path: Path) -> None:
    guide = _page("client.md")
    assert len(guide) >= 6 and {b.lang for b in guide} == {"python"}
    whole = Block("docs/client.md", "", "python", "\n".join(b.text for b in guide), 1)
    shell = _shell(tmp_path, gateway)
    ran = shell.python(whole, "guide.py", timeout=180)
    assert ran.ok(), ran.err
    lines = ran.out.splitlines()
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
    # The key table: one live row per key, and every change with its kind.
    assert "get: [{'id': 1, 'balance': 25}]" in lines
    assert "scan: [{'id': 1, 'balance': 25}]" in lines
    assert (
        "changelog: [(1, '+I', 10), (1, '+U', 25), (1, '-U', 10), (2, '+I', 5), (2, '-D', 5)]"
        in lines
    )
    assert "over Flight: True" in lines  # the test gateways have a Flight edge
    assert "the same rows either way: True" in lines  # the SDK's client-side scan
    assert "the same records either way: True" in lines  # the SDK's client-side read


def test_the_pyiceberg_and_duckdb_examples_run(tmp_path: Path) -> None:
    examples = _page("engines.md")
    assert len(examples) == 4
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
            deadline = time.monotonic() + 60
            while c.describe_table("shop.visits").partition_info[0].tiered_watermark < 2:
                assert time.monotonic() < deadline, "not tiered"
                time.sleep(0.2)
        # A fresh home: DuckDB's extensions come from the example's own install.
        shell = _shell(tmp_path, gateway, TIDEGATE_TENANT=gateway.tenant)
        for n, code in enumerate(examples):
            ran = shell.python(code, f"engine{n}.py")
            assert ran.ok(), ran.err
            assert ran.out.splitlines() == expected_output(code), code.text
    finally:
        gateway.stop()
