"""What a new user trips on in the first hour (issue 16): the CLI reads everything, takes
its global options anywhere, answers bad input with one sentence, and a client pointed at
nothing fails fast naming the address. Every CLI case checks the exit code and that no
traceback is printed."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gateway.client import AdminClient, Client, TableInfo, Unavailable
from gateway.client.aio import AsyncClient
from tests.forkserver import fork_server
from tests.services import FIRST_CONTACT_S, GatewayProcess, free_port, running

pytestmark = pytest.mark.integration


def cli(
    gateway: GatewayProcess | None,
    *args: str,
    code: int = 0,
    stdin: str | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``tidegate`` as a user would (keys in the environment); check its exit code and
    that nothing it printed is a traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    if gateway is not None:
        env["TIDEGATE_API_KEY"] = str(gateway.api_key)
        env["TIDEGATE_OPERATOR_KEY"] = gateway.operator_key
        env["TIDEGATE_TARGET"] = gateway.grpc_target
        env["TIDEGATE_CONNECT_TIMEOUT"] = str(FIRST_CONTACT_S)  # one we started: see there
    # `python -m gateway *args`, forked from the suite's fork server (tests/forkserver.py).
    proc = fork_server().run(args, env, str(cwd or Path.cwd()), stdin=stdin, timeout=60)
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    return proc


def rows(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture
def clicks(gateway: GatewayProcess, namespace: str, tmp_path: Path) -> str:
    """A 3-partition table holding 25,000 rows, spread over the partitions by key."""
    table = f"{namespace}.clicks"
    cli(gateway, "table", "create", table, "--schema", "user:string,n:int64", "--partitions", "3",
        "--key", "user")  # fmt: skip
    data = tmp_path / "clicks.jsonl"
    data.write_text(
        "".join(json.dumps({"user": f"u{i % 7}", "n": i}) + "\n" for i in range(25_000))
    )
    assert "appended 25000 records" in cli(gateway, "append", table, str(data)).stdout
    return table


# Item 3: read every partition, page through everything, start anywhere -----------------
def test_read_pages_through_every_partition(gateway: GatewayProcess, clicks: str) -> None:
    got = rows(cli(gateway, "read", clicks).stdout)
    assert sorted(r["n"] for r in got) == list(range(25_000))  # past 10,000, all partitions
    assert {r["_partition"] for r in got} == {0, 1, 2}


def test_read_stops_early_only_when_told_and_says_so(gateway: GatewayProcess, clicks: str) -> None:
    out = cli(gateway, "read", clicks, "--max-records", "100")
    assert len(rows(out.stdout)) == 100
    assert "stopped after 100 records" in out.stderr
    one = rows(cli(gateway, "read", clicks, "--partition", "2").stdout)
    assert one and {r["_partition"] for r in one} == {2}


def test_read_from_positions(gateway: GatewayProcess, clicks: str) -> None:
    with gateway.client() as c:
        high = c.describe_table(clicks).high_watermarks
    assert rows(cli(gateway, "read", clicks, "--from", "latest").stdout) == []
    from_5 = rows(cli(gateway, "read", clicks, "--from", "5").stdout)
    assert len(from_5) == sum(h - 5 for h in high)
    assert min(r["_offset"] for r in from_5) == 5
    everything = rows(cli(gateway, "read", clicks, "--from", "2000-01-01T00:00:00Z").stdout)
    assert len(everything) == 25_000
    future = rows(cli(gateway, "read", clicks, "--from", "2999-01-01T00:00:00Z").stdout)
    assert future == []
    bad = cli(gateway, "read", clicks, "--from", "yesterday", code=2)
    assert "earliest, latest, an offset or an ISO-8601 time" in bad.stderr
    wrong = cli(gateway, "read", clicks, "--partition", "3", code=2)
    assert "partitions 0 to 2, not 3" in wrong.stderr


# Item 5: one sentence instead of a traceback or a library's internals -----------------
def test_errors_in_plain_words(gateway: GatewayProcess, namespace: str, tmp_path: Path) -> None:
    for args in (["read", "orders"], ["table", "describe", "orders"], ["append", "orders", "-"]):
        out = cli(gateway, *args, code=2, stdin="")
        assert "'orders' is not a table name: write namespace.name" in out.stderr
    table = f"{namespace}.orders"
    cli(gateway, "table", "create", table, "--schema", "customer:string,amount:decimal128(10, 2)")
    bad = cli(gateway, "append", table, "-", code=2, stdin='{"customer": "a", "amount": "1.x"}\n')
    assert "line 1.amount: '1.x' is not a decimal number" in bad.stderr
    wide = cli(
        gateway, "append", table, "-", code=2, stdin='{"customer": "a", "amount": "123456789012"}'
    )
    assert "has 12 digits before the point; decimal128(10, 2) holds up to 8" in wide.stderr
    mixed = cli(
        gateway,
        "append",
        table,
        "-",
        code=2,
        stdin='{"customer": "a", "amount": 1}\n{"customer": 5, "amount": "2"}\n',
    )
    assert "line 2.customer" in mixed.stderr and "expected a string" in mixed.stderr
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    assert "cannot tell the format of notes.txt" in cli(gateway, "append", table, str(text),
                                                        code=2).stderr  # fmt: skip
    fake = tmp_path / "fake.parquet"
    fake.write_text("hello\n")
    out = cli(gateway, "append", table, str(fake), code=2)
    assert "cannot read" in out.stderr and "it is not a Parquet file" in out.stderr
    csv = tmp_path / "o.csv"
    csv.write_text("customer,amount\na,1.50\nb,1.5x\n")
    assert "column 'amount'" in cli(gateway, "append", table, str(csv), code=2).stderr
    grammar = cli(gateway, "scan", table, "--filter", "amount >>= 10", code=2)
    assert len(grammar.stderr.strip().splitlines()) == 1 and "amount >>= 10" in grammar.stderr
    cli(gateway, "append", table, "-", stdin='{"customer": "a", "amount": "1.00"}\n')
    with gateway.client() as c, pytest.raises(Exception) as exc:
        c.read(table, partition=0, offset=1000)
    message = str(exc.value)
    assert "offset 1000 is past the end" in message
    assert "holds offsets 0 to 0" in message and "high watermark 1" in message


def test_serve_on_a_taken_port_says_which(gateway: GatewayProcess, tmp_path: Path) -> None:
    port = gateway.grpc_target.rsplit(":", 1)[1]
    out = cli(None, "serve", "--grpc-port", port, "--http-port", "0", "--data-dir",
              str(tmp_path / "d"), code=2)  # fmt: skip
    assert f"cannot listen for gRPC on 127.0.0.1:{port}" in out.stderr
    assert "--grpc-port" in out.stderr


# Item 6: one rule per question, global options anywhere --------------------------------
def test_global_options_anywhere(gateway: GatewayProcess, namespace: str) -> None:
    # No key or target in the environment: they come from the command line only.
    target, key = gateway.grpc_target, str(gateway.api_key)
    table = f"{namespace}.g"
    for args in (
        ["--target", target, "--api-key", key, "table", "create", table, "--schema", "v:int64",
         "--if-not-exists"],
        ["table", "list", "--target", target, "--api-key", key],
        ["table", "--api-key", key, "describe", table, f"--target={target}"],
        ["-t", target, "table", "describe", table, "--api-key", key],
    ):  # fmt: skip
        out = cli(None, *args)
        assert table in out.stdout
    # With no key at all: refused in one sentence.
    assert "UNAUTHENTICATED" in cli(None, "table", "list", "-t", target, code=2).stderr


def test_nullable_columns_need_a_value_everywhere(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    table = f"{namespace}.nullable"
    cli(gateway, "table", "create", table, "--schema", "a:int64,b:string")
    out = cli(gateway, "append", table, "-", code=2, stdin='{"a": 1}\n')
    assert "missing column(s) ['b']" in out.stderr and "write null" in out.stderr
    assert "appended 1" in cli(gateway, "append", table, "-", stdin='{"a": 1, "b": null}\n').stdout
    with gateway.client() as c, pytest.raises(Exception, match=r"missing column\(s\) \['b'\]"):
        c.append(table, [{"a": 2}])
    with gateway.http_client() as http:
        answer = http.post(
            f"/v1/tables/{namespace}/nullable/records", json={"rows": [{"a": 3}]}
        ).json()
        assert "missing column(s) ['b']" in answer["error"]["message"]
        # HTTP creates one partition by default, like the SDK and the CLI.
        made = http.post(
            "/v1/tables",
            json={"namespace": namespace, "name": "defaults", "schema": {"v": "int64"}},
        )
        assert made.status_code == 201 and made.json()["partitions"] == 1


def test_quota_help_names_its_verbs(gateway: GatewayProcess) -> None:
    out = cli(gateway, "tenant", "quota", "-h").stdout
    assert "Set (set) and show (get)" in out


# Item 10: what a Kafka or Iceberg user looks for -----------------------------------------
def test_version_and_short_help() -> None:
    assert cli(None, "--version").stdout.startswith("tidegate ")
    assert "Usage" in cli(None, "-h").stdout
    assert "--from" in cli(None, "read", "-h").stdout


def test_table_list_describe_and_drop_with_yes(gateway: GatewayProcess, namespace: str) -> None:
    table = f"{namespace}.t"
    cli(gateway, "table", "create", table, "--schema", "v:int64,name:string", "--partitions", "2")
    assert f"{table}\t2 partitions" in cli(gateway, "table", "list").stdout
    text = cli(gateway, "table", "describe", table).stdout
    assert "name  string  nullable" in text and "tiered" in text
    refused = cli(gateway, "table", "drop", table, code=2, stdin="")
    assert "add --yes to confirm" in refused.stderr
    assert table in cli(gateway, "table", "list").stdout  # nothing was dropped
    cli(gateway, "table", "drop", table, "--yes")
    assert table not in cli(gateway, "table", "list").stdout


def test_groups_stdin_system_columns_and_as_of(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    table = f"{namespace}.events"
    cli(gateway, "table", "create", table, "--schema", "kind:string,n:int64", "--partitions", "2")
    lines = "".join(json.dumps({"kind": "k", "n": i}) + "\n" for i in range(10))
    assert "appended 10 records" in cli(gateway, "append", table, "-", stdin=lines).stdout
    # What `read --output` writes (system columns included) appends again as it is.
    out_file = tmp_path / "copy.parquet"
    cli(gateway, "read", table, "--output", str(out_file))
    assert "_offset" in pq.read_table(out_file).column_names
    assert "appended 10 records" in cli(gateway, "append", table, str(out_file)).stdout
    # A consumer group: first read takes 20, the second nothing; reset moves it back.
    assert len(rows(cli(gateway, "read", table, "--group", "g").stdout)) == 20
    assert rows(cli(gateway, "read", table, "--group", "g").stdout) == []
    described = cli(gateway, "group", "describe", "g", table).stdout.splitlines()
    assert described[0] == f"group g on {table}: generation 0, empty, 0 members, lag 0"
    assert described[2].split() == ["partition", "member", "committed", "high", "watermark",
                                    "lag"]  # fmt: skip
    # Each append lands on one partition (the CLI's producer picks it), so only the
    # total is known: every partition is committed up to its end.
    parts = [line.split() for line in described[3:]]
    assert [(p[0], p[1], p[2] == p[3], p[4]) for p in parts] == [("0", "-", True, "0"),
                                                                ("1", "-", True, "0")]  # fmt: skip
    assert sum(int(p[3]) for p in parts) == 20
    assert f"g\t{table}" in cli(gateway, "group", "list").stdout.splitlines()
    assert cli(gateway, "group", "list", table).stdout.splitlines() == [f"g\t{table}"]
    with gateway.http_client() as http:
        groups = http.get("/v1/groups", params={"namespace": namespace, "name": "events"}).json()
        assert groups == {"groups": [{"group": "g", "namespace": namespace, "name": "events"}]}
        assert http.get(f"/v1/tables/{namespace}/events/snapshots").json() == {"snapshots": []}
    assert "has no snapshot yet" in cli(gateway, "table", "snapshots", table).stdout
    cli(gateway, "group", "reset", "g", table, "--to", "earliest")
    assert len(rows(cli(gateway, "read", table, "--group", "g").stdout)) == 20
    # Scans, and --as-of on a table that has no Iceberg snapshot yet: one sentence.
    scanned = rows(cli(gateway, "scan", table, "-c", "n", "--filter", "n < 3").stdout)
    assert sorted(r["n"] for r in scanned) == [0, 0, 1, 1, 2, 2]
    old = cli(gateway, "scan", table, "--as-of", "2000-01-01T00:00:00Z", code=2)
    assert "SNAPSHOT_NOT_FOUND" in old.stderr or "no snapshot" in old.stderr.lower()


# Item 11 and item 4 in the SDK ----------------------------------------------------------
def test_sdk_describe_is_typed_and_create_exist_ok(gateway: GatewayProcess, namespace: str) -> None:
    with gateway.client() as c:
        made = c.create_table(f"{namespace}.typed", {"v": "int64"}, partitions=2)
        again = c.create_table(f"{namespace}.typed", {"v": "int64"}, exist_ok=True)
        assert isinstance(made, TableInfo) and again.table_id == made.table_id
        info = c.describe_table(f"{namespace}.typed")
        assert info.schema.field("v").type == pa.int64()
        assert [p.partition for p in info.partition_info] == [0, 1]
        assert str(info.table) == f"{namespace}.typed"
        assert [str(t.table) for t in c.list_tables(namespace)] == [f"{namespace}.typed"]


def test_sdk_against_a_closed_port_fails_fast_naming_it() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    deadline = 1.5
    for call in (
        lambda: Client(address, connect_timeout=deadline).describe_table("a.b"),
        lambda: Client(address, connect_timeout=deadline).read("a.b", partition=0, offset=0),
        lambda: AdminClient(address, operator_key="x", connect_timeout=deadline).list_tenants(),
        lambda: asyncio.run(_aio_describe(address, deadline)),
    ):
        started = time.monotonic()
        with pytest.raises(Unavailable) as exc:
            call()
        assert time.monotonic() - started < deadline + 1.0  # the deadline, plus one backoff
        assert address in str(exc.value) and "connection refused" in str(exc.value)
    assert Client(address).reach.connect_timeout <= 5.0  # the default


def test_a_call_that_may_not_run_twice_waits_for_a_gateway_still_starting(
    tmp_path: Path,
) -> None:
    """Creating a table or a tenant must not be sent twice, but a call that never left (no gateway
    listens yet: gRPC never connected) is sent again within the connect deadline, so a
    client started beside its gateway does not fail on its first call; and it runs once.
    Both SDK flavours, each client new (never reached its gateway), while the gateway is
    down and then starts again on the same ports."""
    import concurrent.futures

    proc = GatewayProcess(tmp_path / "gw", {"TIDEGATE_HOT__TYPE": "disk"})
    proc.start()
    proc.stop()

    async def aio_create() -> None:
        async with proc.async_client() as c:
            await c.create_table("late.aio", {"a": "int64"})

    client = proc.client()
    admin = proc.admin()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        # The calls are made while no gateway listens: their first tries connect nowhere.
        made = pool.submit(client.create_table, "late.sync", {"a": "int64"})
        made_aio = pool.submit(asyncio.run, aio_create())
        made_tenant = pool.submit(admin.create_tenant, "late-tenant")
        time.sleep(0.2)
        assert not any(f.done() for f in (made, made_aio, made_tenant))  # still trying
        with running(proc.start()):
            made.result(timeout=FIRST_CONTACT_S)
            made_aio.result(timeout=FIRST_CONTACT_S)
            made_tenant.result(timeout=FIRST_CONTACT_S)
            names = [str(t.ref) for t in client.list_tables()]
            assert names.count("late.sync") == 1 and names.count("late.aio") == 1
            tenants = [t["name"] for t in admin.list_tenants()]
            assert tenants.count("late-tenant") == 1
    client.close()
    admin.close()


async def _aio_describe(address: str, deadline: float) -> None:
    async with AsyncClient(address, connect_timeout=deadline) as c:
        await c.describe_table("a.b")


def test_cli_against_a_closed_port() -> None:
    address = f"127.0.0.1:{free_port()}"
    out = cli(None, "table", "list", "--target", address, "--connect-timeout", "1", code=2)
    assert f"cannot reach a Tidegate gateway at {address}" in out.stderr


def test_tier_in_an_empty_folder_says_so(tmp_path: Path) -> None:
    out = cli(None, "tier", "--data-dir", str(tmp_path / "elsewhere"))
    assert "tiered 0 records in 0 tables" in out.stdout
    assert f"no tables found (data folder {tmp_path / 'elsewhere'}" in out.stderr
