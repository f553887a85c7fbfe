"""The first hour, second pass (issue 32): one test per numbered item of the issue, each
checking the exit code (or the raised error), the message, and that no traceback is
printed. The README and docs/ snippets themselves run in tests/integration/test_docs.py."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess

import pytest

from gateway.client import SchemaMismatch
from tests.integration.test_first_hour import cli, rows
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration

#: One gateway is enough for what a user sees: the disk hot tier (what `make run` serves).
on_disk = pytest.mark.parametrize("gateway", ["disk"], indirect=True)


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr


# Item 9: every interface takes the same rows ----------------------------------------------
@on_disk
def test_item9_every_interface_takes_the_same_rows(gateway: GatewayProcess, namespace: str) -> None:
    """An ``int`` for an ``int32`` column and an ISO-8601 string for a timestamp: the SDK's
    ``append`` (both flavours), its producer, HTTP JSON and the CLI all store them, as the
    same values."""
    table = f"{namespace}.typed"
    row = {"small": 7, "at": "2026-11-21T10:00:00Z", "price": "12.50"}
    schema = {"small": "int32", "at": "timestamp[us, tz=UTC]", "price": "decimal128(10, 2)"}
    with gateway.client() as c:
        c.create_table(table, schema)
        c.append(table, [row])
        c.append(table, row)  # one dict
        with c.producer(table) as producer:
            sent = producer.send(row)
        assert sent.result().offset == 2

    async def aio() -> None:
        async with gateway.async_client() as a:
            await a.append(table, [row])

    asyncio.run(aio())
    with gateway.http_client() as http:
        answer = http.post(f"/v1/tables/{namespace}/typed/records", json={"rows": [row]})
        assert answer.status_code == 200, answer.text
    out = cli(gateway, "append", table, "-", stdin=json.dumps(row) + "\n")
    assert out.stdout.strip() == f"appended 1 record to {table}"
    stored = rows(cli(gateway, "read", table).stdout)
    assert len(stored) == 6
    assert {(r["small"], r["at"], r["price"]) for r in stored} == {
        (7, "2026-11-21T10:00:00Z", "12.50")
    }


# Item 10 (first part): an out-of-range integer names its row and the range --------------
@on_disk
def test_item10_an_int32_overflow_names_the_row_and_the_range(
    gateway: GatewayProcess, namespace: str
) -> None:
    table = f"{namespace}.small"
    fine = {"small": 1}
    big = {"small": 99999999999}
    expected = "99999999999 is out of range for int32 (-2147483648 to 2147483647)"
    with gateway.client() as c:
        c.create_table(table, {"small": "int32"})
        with pytest.raises(SchemaMismatch) as err:
            c.append(table, [fine, big])
        assert str(err.value).endswith(f"row 2.small: {expected}")
        refused = pytest.raises(SchemaMismatch, match=re.escape(expected))
        with c.producer(table) as producer, refused:
            producer.send(big)
    with gateway.http_client() as http:
        answer = http.post(f"/v1/tables/{namespace}/small/records", json={"rows": [fine, big]})
        assert answer.status_code == 400
        assert answer.json()["error"]["message"] == f"row 1.small: {expected}"
    out = cli(gateway, "append", table, "-", code=2, stdin='{"small": 1}\n{"small": 99999999999}\n')
    assert out.stderr.strip() == f"error: SCHEMA_MISMATCH: line 2.small: {expected}"
    assert "C integer" not in out.stderr
    no_traceback(out)
    with gateway.client() as c:
        assert list(c.describe_table(table).high_watermarks) == [0]  # nothing written
