"""Flight answers that Arrow's C++ sends: a scan of tiered data is read by pyarrow's
dataset scanner and handed to Flight as readers over whole tables, so no batch of it
passes through Python (asserted by the gateway's own count of what it sent, not by
timing); it answers what gRPC answers, row for row and in the same order, and is metered
by its rows."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import httpx
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.integration.iceberg_catalog import tier
from tests.services import GatewayProcess, RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gw(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    # Tiered by `tidegate tier` beside it when a test says so (hence the Redis hot tier,
    # which a job may share), never by a schedule under it.
    proc = GatewayProcess(
        tmp_path_factory.mktemp("gw-arrow"),
        {
            "TIDEGATE_TIERING__ENABLED": "false",
            "TIDEGATE_HOT__TYPE": "redis",
            "TIDEGATE_HOT__URL": redis_server.url,
        },
    ).start()
    yield proc
    proc.stop()


def _sent(gw: GatewayProcess) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{gw.http_url}/metrics", timeout=10).text
    found = re.findall(
        r'^tidegate_flight_sent_total\{kind="(\w+)",path="(\w+)"\} ([0-9.e+]+)$', text, re.M
    )
    return {(k, p): float(v) for k, p, v in found}


def _delta(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(before) | set(after)}


def _flight_scan(gw: GatewayProcess, table: str, **body: object) -> pa.Table:
    ns, name = table.split(".")
    client = fl.connect(f"grpc+tcp://127.0.0.1:{gw.flight_port}")
    opts = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {gw.api_key}".encode())])
    ticket = fl.Ticket(json.dumps({"scan": {"namespace": ns, "name": name, **body}}).encode())
    try:
        return client.do_get(ticket, opts).read_all()
    finally:
        client.close()


def _tiered(gw: GatewayProcess, table: str) -> int:
    ns, name = table.split(".")
    client = fl.connect(f"grpc+tcp://127.0.0.1:{gw.flight_port}")
    opts = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {gw.api_key}".encode())])
    body = {"namespace": ns, "name": name, "partition": 0, "offset": 0, "max_records": 1}
    try:
        reader = client.do_get(fl.Ticket(json.dumps({"read": body}).encode()), opts)
        meta = reader.read_chunk().app_metadata
        return int(json.loads(meta.to_pybytes())["tiered_watermark"])
    finally:
        client.close()


def test_a_scan_of_tiered_data_is_sent_by_arrow_alone(gw: GatewayProcess) -> None:
    table = f"ns{uuid.uuid4().hex[:8]}.t"
    with gw.client(flight=False) as c:
        c.create_table(table, {"v": "int64", "tag": "string"}, partitions=2)
        for p in (0, 1):
            for start in range(0, 3000, 1000):
                rows = [
                    {"v": i, "tag": f"r{i}" if i % 3 else None} for i in range(start, start + 1000)
                ]
                c.append(table, rows, partition=p)
    tier(gw)
    with gw.client(flight=False) as plain:
        assert _tiered(gw, table) == 3000  # every row is cold
        cases: list[dict[str, object]] = [
            {},
            {"columns": ["v", "_offset"], "filter": "v >= 2500 and tag is not null"},
            {"filter": "v < 0"},
        ]
        for body in cases:
            before = _sent(gw)
            got = _flight_scan(gw, table, **body)
            sent = _delta(before, _sent(gw))
            kwargs = {k: body[k] for k in body}
            want = plain.scan(table, **kwargs)  # type: ignore[arg-type]
            # The same rows in the same order (cold: partition by partition, then by offset).
            assert got.schema == want.schema
            assert got.to_pylist() == want.to_pylist()
            assert sent.get(("scan", "python"), 0) == 0, sent
            assert sent.get(("scan", "arrow"), 0) >= (1 if want.num_rows else 0), sent
        assert _flight_scan(gw, table).num_rows == 6000

        # Hot rows on top: read in Python from the hot tier, still sent as whole tables.
        with gw.client(flight=False) as c:
            c.append(table, [{"v": 10_000 + i, "tag": None} for i in range(50)], partition=1)
        before = _sent(gw)
        got = _flight_scan(gw, table)
        sent = _delta(before, _sent(gw))
        assert got.to_pylist() == plain.scan(table).to_pylist()
        assert got.num_rows == 6050 and got.column("v").to_pylist()[-1] == 10_049
        assert sent.get(("scan", "python"), 0) == 0 and sent[("scan", "arrow")] >= 2, sent

        # A limit reads batch by batch as before.
        before = _sent(gw)
        assert _flight_scan(gw, table, limit=10).column("v").to_pylist() == list(range(10))
        assert _delta(before, _sent(gw))[("scan", "python")] >= 1


def test_arrow_scans_are_metered_once_per_part_by_their_rows(gw: GatewayProcess) -> None:
    tenant = f"arw{uuid.uuid4().hex[:6]}"
    with gw.admin() as admin:
        admin.create_tenant(tenant)
        key = admin.issue_key(tenant)[1]
    table = f"ns{uuid.uuid4().hex[:8]}.m"
    with gw.client(api_key=key, flight=False) as c:
        c.create_table(table, {"v": "int64"}, partitions=1)
        c.append(table, [{"v": i} for i in range(400)])
    tier(gw)
    with gw.client(api_key=key, flight=False) as c:
        c.append(table, [{"v": i} for i in range(400, 410)])
    with gw.client(api_key=key) as c:
        assert c.flight_location() is not None
        # The gateway's own Flight scan (mode="server"): a client-side scan reads the tiered
        # files itself and the gateway meters only the hot rows it serves.
        assert c.scan(table, filter="v >= 390", mode="server").column("v").to_pylist() == list(
            range(390, 410)
        )
    with gw.admin() as admin:
        usage = admin.usage(tenant)
    assert sum(r["read_records"] for r in usage) == 20
    assert sum(r["read_bytes"] for r in usage) > 0
