"""The first hour, second pass (issue 32): one test per numbered item of the issue, each
checking the exit code (or the raised error), the message, and that no traceback is
printed. The README and docs/ snippets themselves run in tests/integration/test_docs.py."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.client import SchemaMismatch
from tests.integration.docs_runner import Served
from tests.integration.test_first_hour import cli, rows
from tests.services import GatewayProcess, run_cli

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


def _tenant_with_quota(gateway: GatewayProcess, **quota: int) -> str:
    """A new tenant of the shared gateway, with its own quotas; its API key."""
    name = f"q{secrets.token_hex(5)}"
    with gateway.admin() as admin:
        admin.create_tenant(name)
        key = admin.issue_key(name)[1]
        admin.set_quota(name, **quota)
    return key


def _user_env(gateway: GatewayProcess, key: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    return {**env, "TIDEGATE_API_KEY": key, "TIDEGATE_TARGET": gateway.grpc_target}


# Item 5: the producer says that it retries -------------------------------------------------
PRODUCE_UNDER_QUOTA = """
import os
from gateway.client import Client

with Client(os.environ["TIDEGATE_TARGET"], api_key=os.environ["TIDEGATE_API_KEY"]) as c:
    c.create_table("slow.events", {"s": "string"})
    with c.producer("slow.events", batch_records=20, linger=0) as producer:
        for i in range(300):
            producer.send({"s": "x" * 200})
    print("retries", producer.retries)
    print("stored", sum(c.describe_table("slow.events").high_watermarks))
"""


@on_disk
def test_item5_the_producer_warns_while_it_retries(gateway: GatewayProcess) -> None:
    """Under a quota of a fifth of what it sends per second, the producer resends many
    times; it says so on stderr (no logging set up, as in a user's first script) in a few
    lines, not one per retry, and stores every row once."""
    key = _tenant_with_quota(gateway, append_bytes_per_s=15_000)
    proc = subprocess.run(
        [sys.executable, "-c", PRODUCE_UNDER_QUOTA],
        env=_user_env(gateway, key),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    no_traceback(proc)
    out = dict(line.split() for line in proc.stdout.splitlines())
    retries, stored = int(out["retries"]), int(out["stored"])
    assert stored == 300 and retries > 0
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("tidegate producer for")]
    assert warnings, proc.stderr
    assert "slow.events: partition 0: THROTTLED" in warnings[0]
    assert "resending in" in warnings[0]
    assert len(warnings) <= 1 + retries // 2  # a summary every 10 s, not a line per retry


# Item 6: the CLI waits out THROTTLED ---------------------------------------------------------
@on_disk
def test_item6_cli_append_loads_a_file_larger_than_the_quota(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    key = _tenant_with_quota(gateway, append_bytes_per_s=20_000)
    env = _user_env(gateway, key)
    data = tmp_path / "big.jsonl"
    data.write_text("".join(json.dumps({"s": "y" * 100, "n": i}) + "\n" for i in range(800)))
    assert data.stat().st_size > 4 * 20_000  # four seconds of quota at least

    def tidegate(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(args, env, timeout=180)

    made = tidegate("table", "create", "bulk.rows", "--schema", "s:string,n:int64")
    assert made.returncode == 0, made.stderr
    out = tidegate("append", "bulk.rows", str(data), "--batch-rows", "100")
    assert out.returncode == 0, out.stderr
    no_traceback(out)
    assert out.stdout.strip() == "appended 800 records to bulk.rows"
    assert "THROTTLED" in out.stderr  # it was refused, and said it waits
    read = tidegate("read", "bulk.rows")
    assert sorted(json.loads(line)["n"] for line in read.stdout.splitlines()) == list(range(800))


# Item 8: CSV on stdin ------------------------------------------------------------------------
@on_disk
def test_item8_append_stdin_takes_csv_and_hints_at_formats(
    gateway: GatewayProcess, namespace: str
) -> None:
    table = f"{namespace}.clicks"
    cli(gateway, "table", "create", table, "--schema", "user:string,page:string")
    out = cli(gateway, "append", table, "-", stdin="user,page\nada,/home\nalan,/buy\n")
    assert out.stdout.strip() == f"appended 2 records to {table}"
    bad = cli(gateway, "append", table, "-", code=2, stdin="ada;/home\n")
    assert bad.stderr.strip() == (
        "error: INVALID_REQUEST: line 1 is not JSON (Expecting value): this input is read "
        "as JSON lines, one object per line; for CSV or Parquet say --format csv or "
        "--format parquet"
    )
    semicolons = cli(
        gateway, "append", table, "-", "--format", "csv", code=2, stdin="user;page\nada;/\n"
    )
    assert "unexpected column(s) ['user;page'], missing column(s) ['user', 'page']" in (
        semicolons.stderr
    )
    no_traceback(semicolons)
    assert [r["page"] for r in rows(cli(gateway, "read", table).stdout)] == ["/home", "/buy"]


# Item 2: a schema change asked twice, or of a column already so, is no error --------------
@on_disk
def test_item2_widen_and_optional_are_idempotent(gateway: GatewayProcess, namespace: str) -> None:
    table = f"{namespace}.events"
    with gateway.client() as c:
        c.create_table(
            table,
            [{"name": "kind", "type": "string"}, {"name": "n", "type": "int32", "nullable": False}],
        )
    alter = ("table", "alter", table, "--widen", "n:int64", "--optional", "n")
    first = cli(gateway, *alter)
    assert "schema      version 1" in first.stdout
    assert "  n     int64   nullable" in first.stdout
    again = cli(gateway, *alter)  # as the README's reader, who may run it twice
    assert "schema      version 1" in again.stdout  # nothing changed, nothing committed
    refused = cli(gateway, "table", "alter", table, "--widen", "n:int32", code=2)
    assert "int64 to int32 is narrowing" in refused.stderr
    no_traceback(refused)


# Item 10: messages in the user's terms --------------------------------------------------------
@on_disk
def test_item10_cli_messages(gateway: GatewayProcess, namespace: str) -> None:
    table = f"{namespace}.kept"
    cli(gateway, "table", "create", table, "--schema", "v:int64", "--retention-ms", "604800000")
    text = cli(gateway, "table", "describe", table).stdout
    assert "retention   records kept 7 days after append (604800000 ms)" in text
    assert f"{table}\t1 partition\n" in cli(gateway, "table", "list").stdout
    # No key: the CLI's own advice, not an HTTP header's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    nokey = run_cli(["table", "list", "--target", gateway.grpc_target], env, timeout=60)
    assert nokey.returncode == 2
    assert nokey.stderr.strip() == (
        "error: UNAUTHENTICATED: no API key was given: set TIDEGATE_API_KEY or pass "
        "--api-key (with the operator key, 'tidegate tenant key issue TENANT' makes one)"
    )
    assert "authorization" not in nokey.stderr
    no_traceback(nokey)


def test_item10_the_connect_deadline_counts_from_the_start_of_the_command() -> None:
    """`--connect-timeout 5` (the default) covers the whole command: what Python and the
    imports took (a second or more on a busy machine) is taken off the client's deadline
    (it said 5 s and took 7.5). The clock is the test's own, not the machine's speed."""
    from gateway.cli import STARTED
    from gateway.cli._common import Globals, connect_budget

    Globals.connect_timeout = 5.0
    assert connect_budget(now=STARTED + 1.5) == pytest.approx(3.5)
    # A start slower than the deadline still leaves three seconds of trying: a live
    # gateway on a busy machine is reached, never reported unreachable for slow imports.
    assert connect_budget(now=STARTED + 9.0) == 3.0
    Globals.connect_timeout = 1.0
    assert connect_budget(now=STARTED + 9.0) == 1.0  # a deadline shorter than that is kept


@pytest.mark.parametrize("command", ["serve", "migrate", "tier"])
def test_item10_a_setting_out_of_range_is_one_line_naming_its_variable(
    command: str, tmp_path: Path
) -> None:
    """A ``TIDEGATE_*`` value the settings refuse is one line naming the setting and its
    variable, exit 2, on every command that reads them (before: "unexpected
    ValidationError ... please report it", exit 3, on all but migrate); the value itself
    (a key, here) is not repeated."""
    secret = "tgop_short"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")},
        "TIDEGATE_DATA_DIR": str(tmp_path),
        "TIDEGATE_AUTH__OPERATOR_KEY": secret,
    }
    proc = run_cli([command], env, timeout=60)
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: setting auth.operator_key (TIDEGATE_AUTH__OPERATOR_KEY or TIDEGATE_CONFIG): "
        "String should have at least 16 characters\n",
    )
    assert secret not in proc.stdout + proc.stderr


# Items 7 and 10: a gateway started as `make run` starts it (docs_runner.Served) -------------
@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    gateway = Served(
        tmp_path_factory.mktemp("served"),
        {"TIDEGATE_TIERING__INTERVAL_S": "0.5", "TIDEGATE_TIERING__HOT_RETENTION_S": "0"},
    )
    try:
        yield gateway
    finally:
        gateway.stop()


def test_item10_serve_ends_with_the_next_steps(served: Served) -> None:
    text = served.out.read_text()
    key_file = served.data / "operator.key"
    assert (
        f"the console: http://127.0.0.1:{served.http}/console (sign in with the operator key, "
        f"in {key_file})"
    ) in text
    assert f"export TIDEGATE_OPERATOR_KEY=$(cat {key_file})" in text
    assert f"export TIDEGATE_TARGET=127.0.0.1:{served.grpc}" in text
    assert "tidegate tenant create shop" in text
    assert "export TIDEGATE_API_KEY=$(tidegate tenant key issue shop)" in text
    # The steps work as printed (through the same command line).
    env = {
        **served.env,
        "TIDEGATE_OPERATOR_KEY": key_file.read_text().strip(),
        "TIDEGATE_TARGET": f"127.0.0.1:{served.grpc}",
    }
    made = run_cli(["tenant", "create", "shop"], env, timeout=60)
    assert made.returncode == 0 and '"name": "shop"' in made.stdout, made.stderr


def test_item7_a_second_gateway_names_every_conflict_at_once(served: Served) -> None:
    out = cli(None, "serve", *served.args(), code=2, cwd=served.folder)
    text = out.stderr.strip()
    assert text.startswith("error: CANNOT_START: 4 conflicts, another gateway may be running: ")
    assert f"cannot listen for gRPC on 127.0.0.1:{served.grpc}" in text
    assert f"cannot listen for HTTP on 127.0.0.1:{served.http}" in text
    assert f"cannot listen for Kafka on 127.0.0.1:{served.kafka}" in text
    assert f"the disk hot tier at {served.data / 'hot'} is in use by pid {served.proc.pid}" in text
    assert "--grpc-port" in text and "--http-port" in text and "--data-dir" in text
    assert len(text.splitlines()) == 1


def test_item10_describe_shows_the_last_tiering_commit(served: Served) -> None:
    key_file = served.data / "operator.key"
    env = {
        **served.env,
        "TIDEGATE_OPERATOR_KEY": key_file.read_text().strip(),
        "TIDEGATE_TARGET": f"127.0.0.1:{served.grpc}",
    }

    def tidegate(*args: str, stdin: str | None = None) -> str:
        proc = run_cli(args, env, stdin=stdin, timeout=60)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        return proc.stdout

    tidegate("tenant", "create", "lake")
    env["TIDEGATE_API_KEY"] = tidegate("tenant", "key", "issue", "lake").strip()
    tidegate("table", "create", "lake.visits", "--schema", "page:string")
    tidegate("append", "lake.visits", "-", stdin='{"page": "/"}\n{"page": "/buy"}\n')
    for _ in range(600):
        text = tidegate("table", "describe", "lake.visits")
        if "tier ok at" in text:
            break
        time.sleep(0.1)
    (jobs,) = [ln for ln in text.splitlines() if ln.startswith("lake jobs")]
    tier = next(run for run in jobs.removeprefix("lake jobs   ").split(", ") if "tier" in run)
    assert re.fullmatch(r"tier ok at \S+ \S+Z \(2 records in snapshot \d+\)", tier), jobs
    assert "lake        1 data file (1 small)" in text
