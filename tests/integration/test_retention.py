"""Table retention through a running gateway, on both hot tiers: set at create (SDK) or
later (HTTP PATCH, SDK, CLI), applied by the embedded schedule; below the earliest
offset every read path answers OFFSET_OUT_OF_RANGE naming it, scans and plans leave the
rows out, describe shows it, DuckDB reading the Iceberg table no longer sees them, and a
consumer group left behind resumes at the earliest offset."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow.flight as fl
import pytest

from gateway.client import Client
from gateway.client._flight import error_from_flight
from gateway.wire.errors import InvalidRequest, OffsetOutOfRange
from tests.cold.helpers import duckdb_scan
from tests.integration.conftest import gateway_env
from tests.services import FIRST_CONTACT_S, REPO_ROOT, GatewayProcess, RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture(params=["disk", "redis"])
def lake_gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    kind = str(request.param)
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    env = {
        **gateway_env(kind, redis),
        "TIDEGATE_TIERING__INTERVAL_S": "0.5",
        "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
        "TIDEGATE_RETENTION__INTERVAL_S": "0.5",
        "TIDEGATE_COMPACTION__ENABLED": "false",
        "TIDEGATE_EXPIRY__ENABLED": "false",
    }
    gw = GatewayProcess(tmp_path / "gw", env).start()
    try:
        yield gw
    finally:
        gw.stop()


def _wait(gw: GatewayProcess, table: str, check: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    with gw.client() as c:
        while True:
            info = c.describe_table(table)
            if check(info):
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"{table} never got there: {info}\n{gw.log()}")
            time.sleep(0.2)


def _offsets(table: Any) -> list[int]:
    return [] if table.num_rows == 0 else table.column("_offset").to_pylist()


def _user(rows: list[dict[str, Any]]) -> list[int]:
    return [r["_offset"] for r in rows]


def test_retention_by_records_and_by_time_through_the_gateway(
    lake_gateway: GatewayProcess,
) -> None:
    gw = lake_gateway
    with gw.client() as c:
        info = c.create_table("r.byrec", {"n": "int64"}, retention_records=5)
        assert info.retention_records == 5 and info.retention_ms is None
        for i in range(20):  # one record per batch: the hot tier trims exactly
            c.append("r.byrec", [{"n": i}], partition=0)
        c.create_table("r.bytime", {"n": "int64"})
        c.append("r.bytime", [{"n": i} for i in range(6)], partition=0)
    with gw.http_client() as h:
        changed = h.patch("/v1/tables/r/bytime", json={"retention_ms": 1000})
        assert changed.status_code == 200, changed.text
        assert changed.json()["retention_ms"] == 1000

    byrec = _wait(
        gw,
        "r.byrec",
        lambda i: (
            i.partition_info[0].earliest_offset == 15 and i.partition_info[0].tiered_watermark == 20
        ),
    )
    bytime = _wait(gw, "r.bytime", lambda i: i.partition_info[0].earliest_offset == 6)
    assert bytime.partition_info[0].high_watermark == 6

    with gw.client() as c, gw.client(flight=False) as plain:
        # gRPC (plain) and Flight (the SDK's read_range goes over Flight when it can).
        for sdk in (plain, c):
            with pytest.raises(OffsetOutOfRange) as caught:
                list(sdk.read_range("r.byrec", partition=0, start=14, end=20))
            assert int(caught.value.details["earliest"]) == 15
            assert "no longer kept" in caught.value.message
        with pytest.raises(OffsetOutOfRange) as caught:
            plain.read("r.byrec", partition=0, offset=0)
        assert int(caught.value.details["earliest"]) == 15
        assert _offsets(plain.read("r.byrec", partition=0, offset=15)) == list(range(15, 20))
        assert _offsets(c.read("r.byrec", partition=0, offset=17)) == [17, 18, 19]
        # A scan has no order: the records sit in as many files as tiering passes took them.
        assert sorted(_offsets(c.scan("r.byrec"))) == list(range(15, 20))
        assert _offsets(c.scan("r.bytime")) == []
        plan = plain.plan_read("r.byrec")
        assert plan.files and all(f.max_offset >= 15 for f in plan.files)
        assert [(e.partition, e.offset) for e in plan.earliest_offsets] == [(0, 15)]
        with pytest.raises(OffsetOutOfRange) as caught:
            plain.read("r.bytime", partition=0, offset=5)
        assert int(caught.value.details["earliest"]) == 6
        # A consumer group whose commit fell below resumes at the earliest offset.
        c.commit_offsets("late", "r.byrec", {0: 3})
        with c.consumer("r.byrec", group="late", follow=False) as consumer:
            assert [r["_offset"] for r in consumer] == list(range(15, 20))

    flight = fl.connect(f"grpc+tcp://127.0.0.1:{gw.flight_port}")
    ticket = fl.Ticket(
        json.dumps(
            {"read": {"namespace": "r", "name": "byrec", "partition": 0, "offset": 10}}
        ).encode()
    )
    headers = [(b"authorization", f"Bearer {gw.api_key}".encode())]
    with pytest.raises(fl.FlightError) as raised:
        flight.do_get(ticket, fl.FlightCallOptions(headers=headers)).read_all()
    err = error_from_flight(raised.value)
    assert isinstance(err, OffsetOutOfRange) and int(err.details["earliest"]) == 15
    flight.close()

    with gw.http_client() as h:
        below = h.get("/v1/tables/r/byrec/partitions/0/records", params={"offset": 14})
        assert below.status_code == 416
        assert below.json()["error"]["earliest"] == 15
        at = h.get("/v1/tables/r/byrec/partitions/0/records", params={"offset": 15})
        assert [r["_offset"] for r in at.json()["records"]] == list(range(15, 20))
        desc = h.get("/v1/tables/r/byrec").json()
        assert desc["retention_records"] == 5
        assert desc["partition_info"][0]["earliest_offset"] == 15
        scanned = h.post("/v1/tables/r/byrec/scan", json={"filter": "_offset < 17"}).json()
        assert sorted(r["_offset"] for r in scanned["rows"]) == [15, 16]  # no order

    assert _user(_duckdb_rows(_metadata(gw, "r.byrec"))) == list(range(15, 20))
    assert byrec.partition_info[0].high_watermark == 20


def _metadata(gw: GatewayProcess, table: str) -> str:
    with gw.client() as c:
        return c.describe_table(table).iceberg_metadata


def _duckdb_rows(metadata: str) -> list[dict[str, Any]]:
    return list(duckdb_scan(metadata).to_pylist())


def test_a_bad_retention_is_one_clear_sentence(
    gateway: GatewayProcess, client: Client, http: httpx.Client, namespace: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        client.create_table(f"{namespace}.bad", {"n": "int64"}, retention_ms=-5)
    assert caught.value.message == (
        "retention_ms -5 is not accepted: give a whole number of milliseconds from 1 to "
        "9223372036854775807, or 0 for no limit"
    )
    assert "\n" not in caught.value.message
    client.create_table(f"{namespace}.ok", {"n": "int64"})
    answer = http.patch(f"/v1/tables/{namespace}/ok", json={"retention_records": -1})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith("retention_records -1 is not accepted")
    # Nothing changed, and 0 clears a limit.
    info = client.alter_table(f"{namespace}.ok", retention_ms=60_000)
    assert (info.retention_ms, info.retention_records) == (60_000, None)
    info = client.alter_table(f"{namespace}.ok", retention_records=10)
    assert (info.retention_ms, info.retention_records) == (60_000, 10)
    info = client.alter_table(f"{namespace}.ok", retention_ms=0)
    assert (info.retention_ms, info.retention_records) == (None, 10)
    typed = http.patch(f"/v1/tables/{namespace}/ok", json={"retention_ms": "a week"})
    assert typed.status_code in (400, 422)
    assert "retention_ms" in typed.json()["error"]["message"]

    async def by_async() -> tuple[Any, Any]:
        async with gateway.async_client() as ac:
            made = await ac.create_table(f"{namespace}.aio", {"n": "int64"}, retention_ms=5000)
            return made, await ac.alter_table(f"{namespace}.aio", retention_records=3)

    made, changed = asyncio.run(by_async())
    assert (made.retention_ms, made.retention_records) == (5000, None)
    assert (changed.retention_ms, changed.retention_records) == (5000, 3)


def test_retention_commands_beside_a_gateway(tmp_path: Path, redis_server: RedisServer) -> None:
    """`tidegate table create/alter --retention-*`, then `tidegate retention` and
    `python -m tiering retention` as jobs beside a gateway sharing Redis."""
    gw = GatewayProcess(
        tmp_path / "gw",
        {
            "TIDEGATE_HOT__TYPE": "redis",
            "TIDEGATE_HOT__URL": redis_server.url,
            "TIDEGATE_TIERING__ENABLED": "false",
            "TIDEGATE_RETENTION__ENABLED": "false",
        },
    ).start()
    try:
        user = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
        user["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{user['PATH']}"
        user.update({"TIDEGATE_TARGET": gw.grpc_target, "TIDEGATE_API_KEY": str(gw.api_key)})
        user["TIDEGATE_CONNECT_TIMEOUT"] = str(FIRST_CONTACT_S)  # a gateway we started

        def run(*argv: str, env: dict[str, str] = user) -> str:
            out = subprocess.run(
                argv, env=env, cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=120
            )
            assert out.returncode == 0, out.stderr
            return out.stdout

        made = run("tidegate", "table", "create", "cli.ret", "--schema", "n:int64",
                   "--retention-records", "4", "--json")  # fmt: skip
        assert json.loads(made)["retention_records"] == 4
        with gw.client() as c:
            for i in range(10):
                c.append("cli.ret", [{"n": i}], partition=0)
        # The job is applied at once: no gateway but this test's reads the table.
        job_env = {**gw.env(), "PATH": user["PATH"], "TIDEGATE_RETENTION__SETTLE_S": "0"}
        assert "removed 6 records in 1 table" in run("tidegate", "retention", env=job_env)
        with gw.client() as c:
            assert c.describe_table("cli.ret").partition_info[0].earliest_offset == 6
            with pytest.raises(OffsetOutOfRange):
                c.read("cli.ret", partition=0, offset=5)
        text = run("tidegate", "table", "alter", "cli.ret", "--retention-records", "2")
        assert "records kept the last 2 records per partition" in text
        run(sys.executable, "-m", "tiering", "retention", "--runner", "local", env=job_env)
        with gw.client() as c:
            info = c.describe_table("cli.ret")
            assert info.partition_info[0].earliest_offset == 8
            assert _offsets(c.read("cli.ret", partition=0, offset=8)) == [8, 9]
    finally:
        gw.stop()
