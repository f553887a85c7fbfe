"""SDK scans that read the lake themselves (issue 43): ``Client.scan`` plans once, reads
the plan's Parquet files with pyarrow and fetches only the hot ranges from the gateway.

Real gateway processes on both hot tiers (disk, Redis) and both warehouses (a local
folder, S3 on moto's server), each tiering on its own schedule every second while the
tests append and scan. What is checked:

- a client-side scan answers the rows of one pinned view (per partition, offsets
  ``0..n-1`` each exactly once, ``n`` at least what was acknowledged before the scan)
  while records move between the tiers under it, and the same rows as the gateway's own
  scan once appends stop, with filters, projections and limits;
- it reads the files itself, counted by the gateway's metrics: no ``Scan`` call on either
  edge, and the records served through the data plane are only those of the hot ranges;
- the fallback: a client that cannot reach the files (the gateway's links name an
  address nothing listens on) scans on the gateway in ``auto`` mode, and refuses in
  ``client`` mode with a sentence that says what to do.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from gateway.client import Client
from gateway.wire.errors import InvalidRequest, Unavailable
from tests.integration.conftest import gateway_env
from tests.integration.flavours import LoopThread, synced_client
from tests.integration.test_cli import tidegate
from tests.services import GatewayProcess, MotoServer, RedisServer, free_port

pytestmark = pytest.mark.integration

SCHEMA = {"v": "int64", "tag": "string", "s": "int8"}
PARTITIONS = 3
BATCH = 40
#: Seconds between the appender's batches: records keep coming, and tiering keeps moving
#: them, under every scan. Back to back, the appender wrote as fast as the gateway took
#: them, and every later scan read all of it (most of the module's CPU).
APPEND_EVERY_S = 0.01

#: (hot tier, warehouse) of each lake gateway.
LAKES = [("disk", "local"), ("disk", "s3"), ("redis", "local"), ("redis", "s3")]


@dataclass
class Lake:
    gateway: GatewayProcess
    #: The local warehouse's folder (None on S3).
    warehouse: str | None


def _tiering_env() -> dict[str, str]:
    return {
        "TIDEGATE_TIERING__ENABLED": "true",
        "TIDEGATE_TIERING__INTERVAL_S": "1",
        # The sweep visits every table each pass, not only those marked for it.
        "TIDEGATE_TIERING__SWEEP_INTERVAL_S": "1",
    }


@pytest.fixture(scope="module", params=LAKES, ids=["-".join(p) for p in LAKES])
def lake(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Lake]:
    hot, where = request.param
    tmp = tmp_path_factory.mktemp(f"lake-{hot}-{where}")
    env = {**gateway_env(hot, redis_server), **_tiering_env()}
    warehouse: str | None = str(tmp / "warehouse")
    if where == "s3":
        moto: MotoServer = request.getfixturevalue("moto_server")
        bucket = moto.create_bucket(f"lake-{uuid.uuid4().hex[:10]}")
        env.update(moto.gateway_env(f"s3://{bucket}/warehouse"))
        warehouse = None
    gw = GatewayProcess(tmp, env).start()
    try:
        yield Lake(gw, warehouse)
    finally:
        gw.stop()


@pytest.fixture(params=["sync", "aio"])
def sdk(request: pytest.FixtureRequest, lake: Lake) -> Iterator[Any]:
    """A client of the lake in each flavour. On a local warehouse the sync client is given
    the warehouse folder (it reads the files there); the asyncio one is not (it reads
    them through the gateway's links), so both ways are run on both hot tiers."""
    if request.param == "sync":
        with lake.gateway.client(warehouse=lake.warehouse) as c:
            yield c
        return
    lt = LoopThread()
    try:
        with synced_client(lake.gateway.async_client, lt) as c:
            yield c
    finally:
        lt.close()


def _row(v: int) -> dict[str, Any]:
    return {"v": v, "tag": f"r{v}" if v % 3 else None, "s": v % 100}


def _metrics(gw: GatewayProcess) -> dict[str, float]:
    """What the gateway served through its data plane: records read, scans answered."""
    text = httpx.get(f"{gw.http_url}/metrics", timeout=10).text

    def total(pattern: str) -> float:
        return sum(float(v) for v in re.findall(pattern, text, re.M))

    return {
        "read_records": total(r"^tidegate_read_records_total ([0-9.e+]+)$"),
        "grpc_scans": total(
            r'^tidegate_grpc_requests_total\{[^}]*method="Scan"[^}]*\} ([0-9.e+]+)$'
        ),
        "flight_scans": total(r'^tidegate_flight_sent_total\{kind="scan"[^}]*\} ([0-9.e+]+)$'),
    }


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


def _hot_records(client: Any, table: str) -> int:
    plan = client.plan_read(table)
    return sum(r.to_offset - r.from_offset for r in plan.hot_ranges)


def _by_offset(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.to_pylist(), key=lambda r: (r["_partition"], r["_offset"]))


class Appender:
    """Appends batches of ``BATCH`` rows in a thread until stopped, counting what was
    acknowledged."""

    def __init__(self, gw: GatewayProcess, table: str) -> None:
        self.gw, self.table = gw, table
        self.acked = 0
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.gw.client() as c:
                while not self.stopped.wait(APPEND_EVERY_S):
                    start = self.acked
                    c.append(self.table, [_row(v) for v in range(start, start + BATCH)])
                    self.acked += BATCH
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def __enter__(self) -> Appender:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(60)
        assert self.error is None, self.error


def _check_view(t: pa.Table, at_least: int, at_most: int) -> None:
    """``t`` is one pinned view of what ``Appender`` wrote: per partition offsets
    ``0..n-1`` each once, every row as appended, between ``at_least`` and ``at_most``
    records."""
    rows = t.to_pylist()
    assert at_least <= len(rows) <= at_most, (len(rows), at_least, at_most)
    by_part: dict[int, list[int]] = {}
    for r in rows:
        by_part.setdefault(r["_partition"], []).append(r["_offset"])
        assert {k: r[k] for k in SCHEMA} == _row(r["v"]), r
    for p, offsets in by_part.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {p}: gap or repeat"
    assert sorted(r["v"] for r in rows) == list(range(len(rows)))


def test_sdk_scans_read_the_files_and_equal_the_gateways_scan(lake: Lake, sdk: Any) -> None:
    table = f"ns{uuid.uuid4().hex[:8]}.t"
    sdk.create_table(table, SCHEMA, partitions=PARTITIONS)
    gw = lake.gateway
    with Appender(gw, table) as appender:
        # Scans while records are appended and tiered under them: one view each. Five at
        # least, and on until a tiering commit came between them (the embedded schedule's
        # first pass may come after five fast scans).
        tiered_seen = False
        rounds, deadline = 0, time.monotonic() + 60
        while rounds < 5 or (not tiered_seen and time.monotonic() < deadline):
            rounds += 1
            before = appender.acked
            got = sdk.scan(table, mode="client")
            _check_view(got, before, appender.acked + BATCH)
            info = sdk.describe_table(table)
            tiered_seen = tiered_seen or any(p.tiered_watermark > 0 for p in info.partition_info)
            batches = list(sdk.scan_batches(table, mode="client", filter="v >= 0"))
            streamed = pa.Table.from_batches(batches, got.schema) if batches else got.slice(0, 0)
            _check_view(streamed, got.num_rows, appender.acked + BATCH)
        assert tiered_seen, "tiering never ran under the scans"

    # Appends stopped, tiering still runs: the same rows as the gateway's own scan.
    cases: list[dict[str, Any]] = [
        {},
        {"columns": ["v", "_partition", "_offset"], "filter": "v >= 100 and tag is not null"},
        {"columns": ["tag", "s", "_partition", "_offset"], "filter": "s in (1, 2, 3)"},
        {"filter": "_partition = 1 and _offset < 30"},
    ]
    for case in cases:
        mine = sdk.scan(table, mode="client", **case)
        theirs = sdk.scan(table, mode="server", **case)
        assert mine.schema == theirs.schema, case
        assert _by_offset(mine) == _by_offset(theirs), case
        assert mine.num_rows > 0, case
    total = appender.acked
    limited = sdk.scan(table, mode="client", limit=57, columns=["v"])
    assert limited.num_rows == 57 and len(set(limited.column("v").to_pylist())) == 57
    assert sdk.scan(table, mode="client", limit=0).num_rows == 0
    assert sdk.scan(table, mode="client", limit=total + 10).num_rows == total

    # Counted: the files are read by the client, the gateway serves only hot ranges.
    hot_before = _hot_records(sdk, table)
    seen = _metrics(gw)
    got = sdk.scan(table)  # auto: these files are within reach
    served = _delta(seen, _metrics(gw))
    hot_after = _hot_records(sdk, table)
    assert got.num_rows == total
    assert served["grpc_scans"] == 0 and served["flight_scans"] == 0, served
    # The scan's hot ranges lie between the plans made before and after it (tiering
    # only raises T(p); nothing is appended now).
    assert hot_after <= served["read_records"] <= hot_before, (served, hot_before, hot_after)
    assert served["read_records"] < total
    # And the gateway's own scan is counted so: the check above could fail.
    seen = _metrics(gw)
    sdk.scan(table, mode="server")
    served = _delta(seen, _metrics(gw))
    assert served["grpc_scans"] + served["flight_scans"] >= 1
    assert served["read_records"] == total


def test_scan_modes_check_their_input(lake: Lake) -> None:
    table = f"ns{uuid.uuid4().hex[:8]}.t"
    with lake.gateway.client(warehouse=lake.warehouse) as c:
        c.create_table(table, SCHEMA, partitions=1)
        c.append(table, [_row(v) for v in range(5)])
        with pytest.raises(ValueError, match="mode must be 'auto', 'client' or 'server'"):
            c.scan(table, mode="local")  # type: ignore[arg-type]
        for mode in ("client", "server"):
            with pytest.raises(InvalidRequest, match=r"unknown column\(s\) \['nope'\]"):
                c.scan(table, mode=mode, columns=["v", "nope"])  # type: ignore[arg-type]
            with pytest.raises(InvalidRequest, match="cannot parse filter"):
                c.scan(table, mode=mode, filter="v >>> 1")  # type: ignore[arg-type]
            with pytest.raises(InvalidRequest, match="limit must be an integer"):
                c.scan(table, mode=mode, limit=-1)  # type: ignore[arg-type]


def test_files_written_before_a_schema_change_read_as_the_gateway_reads_them(lake: Lake) -> None:
    """A column added after files were tiered reads as nulls from them, and a widened
    column in its new type, whole files and filtered ones alike."""
    table = f"ns{uuid.uuid4().hex[:8]}.t"
    with lake.gateway.client(warehouse=lake.warehouse) as c:
        c.create_table(table, {"v": "int64", "w": "int32"}, partitions=1)
        c.append(table, [{"v": v, "w": v} for v in range(50)])
        _wait_tiered(c, table, 50)
        c.alter_schema(
            table,
            [
                {"op": "add_column", "column": "note", "type": "string"},
                {"op": "update_type", "column": "w", "type": "int64"},
            ],
        )
        c.append(table, [{"v": v, "w": v, "note": f"n{v}"} for v in range(50, 60)])
        for case in ({}, {"filter": "note is null or v > 55"}, {"columns": ["note", "w"]}):
            mine = c.scan(table, mode="client", **case)
            theirs = c.scan(table, mode="server", **case)
            assert mine.schema == theirs.schema, case
            key = mine.schema.names
            assert sorted(mine.to_pylist(), key=lambda r: [str(r[k]) for k in key]) == sorted(
                theirs.to_pylist(), key=lambda r: [str(r[k]) for k in key]
            ), case
        whole = c.scan(table, mode="client")
        assert whole.schema.field("w").type == pa.int64()
        assert sum(n is None for n in whole.column("note").to_pylist()) == 50


# The fallback ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def unlinked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway on a local warehouse whose file links name an HTTP address nothing
    listens on (a proxy address this client cannot reach)."""
    tmp: Path = tmp_path_factory.mktemp("lake-unlinked")
    env = {
        **gateway_env("disk", None),
        **_tiering_env(),
        "TIDEGATE_SERVER__HTTP_ADVERTISE": f"http://127.0.0.1:{free_port()}",
    }
    gw = GatewayProcess(tmp, env).start()
    try:
        yield gw
    finally:
        gw.stop()


def test_a_client_that_cannot_reach_the_files_scans_on_the_gateway(
    unlinked: GatewayProcess,
) -> None:
    table = f"ns{uuid.uuid4().hex[:8]}.t"
    with unlinked.client() as c:
        c.create_table(table, SCHEMA, partitions=2)
        for start in range(0, 200, BATCH):
            c.append(table, [_row(v) for v in range(start, start + BATCH)])
        _wait_tiered(c, table, 200)
        assert c.plan_read(table).files, "nothing tiered: the fallback would not be tested"

        seen = _metrics(unlinked)
        auto = c.scan(table)
        served = _delta(seen, _metrics(unlinked))
        assert served["grpc_scans"] + served["flight_scans"] == 1, served
        assert served["read_records"] == 200
        _check_view(auto, 200, 200)
        streamed = pa.Table.from_batches(list(c.scan_batches(table)))
        assert _by_offset(streamed) == _by_offset(auto)

        with pytest.raises(Unavailable, match="scan with mode='server'") as err:
            c.scan(table, mode="client")
        assert table in str(err.value)

    # Given the warehouse folder, the same client reads the files there.
    with unlinked.client(warehouse=str(unlinked.data_dir / "warehouse")) as c:
        seen = _metrics(unlinked)
        mine = c.scan(table, mode="client")
        served = _delta(seen, _metrics(unlinked))
        assert served == {"read_records": 0.0, "grpc_scans": 0.0, "flight_scans": 0.0}
        assert _by_offset(mine) == _by_offset(auto)

    # The command line's scan is the SDK's: the same three ways.
    def cli_rows(*args: str) -> list[tuple[int, int, int]]:
        out = tidegate(
            unlinked, "scan", table, "-c", "v", "-c", "_partition", "-c", "_offset", *args
        )
        rows = [json.loads(line) for line in out.stdout.splitlines()]
        return sorted((r["_partition"], r["_offset"], r["v"]) for r in rows)

    expected = sorted((r["_partition"], r["_offset"], r["v"]) for r in auto.to_pylist())
    seen = _metrics(unlinked)
    assert cli_rows() == expected  # auto: the links are out of reach, the gateway scans
    assert _delta(seen, _metrics(unlinked))["read_records"] == 200
    seen = _metrics(unlinked)
    folder = str(unlinked.data_dir / "warehouse")
    assert cli_rows("--mode", "client", "--warehouse", folder) == expected
    assert _delta(seen, _metrics(unlinked))["read_records"] == 0
    refused = tidegate(unlinked, "scan", table, "--mode", "client", ok=False)
    assert refused.returncode != 0 and "mode='server'" in refused.stderr, refused.stderr


def _wait_tiered(c: Client, table: str, records: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = c.describe_table(table)
        if sum(p.tiered_watermark for p in info.partition_info) >= records:
            return
        time.sleep(0.1)
    raise AssertionError(f"{table} was not tiered to {records} records in 60 s")
