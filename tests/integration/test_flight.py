"""The Arrow Flight edge of a real gateway process, on both hot tiers: SDK scans over it
answer what gRPC and HTTP answer, a generic Flight client reads with the documented
tickets, and keys, tenant isolation, errors and metering are the other edges'."""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from gateway.client import Client
from gateway.client._flight import error_from_flight
from gateway.wire.errors import (
    InvalidRequest,
    OffsetOutOfRange,
    TableNotFound,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from tests.integration.test_scan_edges import append, make_table
from tests.services import REPO_ROOT, GatewayProcess

pytestmark = pytest.mark.integration


def _rows(table: pa.Table) -> list[dict[str, object]]:
    return sorted(table.to_pylist(), key=lambda r: (r["_partition"], r["_offset"]))


def _flight(gw: GatewayProcess) -> fl.FlightClient:
    return fl.connect(f"grpc+tcp://127.0.0.1:{gw.flight_port}")


def _options(key: str | None) -> fl.FlightCallOptions:
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    return fl.FlightCallOptions(headers=headers, timeout=30)


def _ticket(kind: str, **body: object) -> fl.Ticket:
    return fl.Ticket(json.dumps({kind: body}).encode())


def test_sdk_scans_over_flight_answer_what_grpc_and_http_answer(
    gateway: GatewayProcess, client: Client, http: httpx.Client, namespace: str
) -> None:
    name = make_table(http, namespace)
    for p in (0, 1):
        append(http, namespace, name, 0, 40, p)
    table = f"{namespace}.{name}"
    assert client.flight_location() == f"grpc+tcp://127.0.0.1:{gateway.flight_port}"
    with gateway.client(flight=False) as plain:
        assert plain.flight_location() is None
        for kwargs in (
            {},
            {"columns": ["v", "_partition", "_offset"], "filter": "v < 10 and tag is not null"},
            {"filter": "v >= 35"},
        ):
            by_flight = client.scan(table, **kwargs)  # type: ignore[arg-type]
            by_grpc = plain.scan(table, **kwargs)  # type: ignore[arg-type]
            assert by_flight.schema == by_grpc.schema
            assert _rows(by_flight) == _rows(by_grpc) and by_flight.num_rows > 0
            batches = list(client.scan_batches(table, **kwargs))  # type: ignore[arg-type]
            assert _rows(pa.Table.from_batches(batches, by_grpc.schema)) == _rows(by_grpc)
        assert client.scan(table, limit=7).num_rows == 7
        assert client.scan(table, limit=0).num_rows == 0
    whole = http.post(f"/v1/tables/{namespace}/{name}/scan", json={}).json()["rows"]
    assert len(whole) == 80 and client.scan(table).num_rows == 80

    async def by_async() -> tuple[str | None, pa.Table, int]:
        async with gateway.async_client() as ac:
            where = await ac.flight_location()
            whole = await ac.scan(table)
            n = 0
            async for b in ac.scan_batches(table, filter="v < 5"):
                n += b.num_rows
            return where, whole, n

    where, whole_async, small = asyncio.run(by_async())
    assert where is not None and small == 10
    assert _rows(whole_async) == _rows(client.scan(table))


def test_a_generic_flight_client_scans_and_reads_with_the_documented_tickets(
    gateway: GatewayProcess, http: httpx.Client, namespace: str
) -> None:
    name = make_table(http, namespace, partitions=1)
    for i in range(3):
        append(http, namespace, name, i * 50, 50, 0)
    flight, opts = _flight(gateway), _options(gateway.api_key)
    info = flight.get_flight_info(fl.FlightDescriptor.for_path(namespace, name), opts)
    scanned = flight.do_get(info.endpoints[0].ticket, opts).read_all()
    assert [r["_offset"] for r in _rows(scanned)] == list(range(150))

    command = json.dumps({"scan": {"namespace": namespace, "name": name, "limit": 5}})
    info = flight.get_flight_info(fl.FlightDescriptor.for_command(command), opts)
    assert flight.do_get(info.endpoints[0].ticket, opts).read_all().num_rows == 5

    # A stream read: offsets in order from 60, its metadata says where it ended.
    reader = flight.do_get(
        _ticket("read", namespace=namespace, name=name, partition=0, offset=60, max_records=70),
        opts,
    )
    offsets: list[int] = []
    last: dict[str, int] = {}
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        offsets += chunk.data.column("_offset").to_pylist()
        if chunk.app_metadata is not None:
            last = json.loads(chunk.app_metadata.to_pybytes())
    assert offsets == list(range(60, 130))
    assert last == {"next_offset": 130, "high_watermark": 150, "tiered_watermark": 0}
    # At the high watermark: no rows, and the metadata still says where the log ends.
    at_end = flight.do_get(
        _ticket("read", namespace=namespace, name=name, partition=0, offset=150), opts
    ).read_all()
    assert at_end.num_rows == 0 and at_end.schema.names[-3:] == [
        "_partition",
        "_offset",
        "_timestamp",
    ]
    flight.close()


def test_read_range_reads_a_range_over_flight_and_over_grpc(
    gateway: GatewayProcess, client: Client, http: httpx.Client, namespace: str
) -> None:
    name = make_table(http, namespace, partitions=1)
    for i in range(4):
        append(http, namespace, name, i * 30, 30, 0)
    table = f"{namespace}.{name}"

    def offsets(chunks: list[list[pa.RecordBatch]]) -> list[int]:
        return [o for chunk in chunks for b in chunk for o in b.column("_offset").to_pylist()]

    over_flight = list(client.read_range(table, partition=0, start=10, end=95))
    with gateway.client(flight=False) as plain:
        over_grpc = list(plain.read_range(table, partition=0, start=10, end=95))
        with pytest.raises(OffsetOutOfRange, match="before 200"):
            list(plain.read_range(table, partition=0, start=100, end=200))
    assert offsets(over_flight) == offsets(over_grpc) == list(range(10, 95))
    with pytest.raises(OffsetOutOfRange, match="before 200"):
        list(client.read_range(table, partition=0, start=100, end=200))

    async def by_async() -> list[list[pa.RecordBatch]]:
        async with gateway.async_client() as ac:
            return [c async for c in ac.read_range(table, partition=0, start=0, end=120)]

    assert offsets(asyncio.run(by_async())) == list(range(120))


def test_flight_errors_are_the_gateways_errors(
    gateway: GatewayProcess, http: httpx.Client, namespace: str
) -> None:
    name = make_table(http, namespace, partitions=1)
    append(http, namespace, name, 0, 10, 0)
    flight = _flight(gateway)

    def failure(ticket: fl.Ticket, key: str | None = gateway.api_key) -> Exception:
        with pytest.raises(fl.FlightError) as caught:
            flight.do_get(ticket, _options(key)).read_all()
        return error_from_flight(caught.value)

    scan = _ticket("scan", namespace=namespace, name=name)
    assert isinstance(failure(scan, key=None), Unauthenticated)
    assert isinstance(failure(scan, key="tg_not_a_key"), Unauthenticated)
    missing = failure(_ticket("scan", namespace=namespace, name="missing"))
    assert isinstance(missing, TableNotFound) and "missing" in str(missing)
    past = failure(_ticket("read", namespace=namespace, name=name, partition=0, offset=99))
    assert isinstance(past, OffsetOutOfRange) and past.details["latest"] == 10
    for raw, words in (
        (b"not json", "not JSON"),
        (b'{"delete": {}}', '{"scan": {...}}'),
        (json.dumps({"read": {"namespace": namespace, "name": name}}).encode(), "'partition'"),
        (
            json.dumps({"read": {"namespace": namespace, "name": name, "partition": "0"}}).encode(),
            "'partition' of the Flight ticket must be an integer",
        ),
        (json.dumps({"scan": {"namespace": namespace, "nam": name}}).encode(), "nam"),
        (
            json.dumps(
                {"scan": {"namespace": namespace, "name": name, "filter": "v >>> 1"}}
            ).encode(),
            "cannot parse filter",
        ),
    ):
        err = failure(fl.Ticket(raw))
        assert isinstance(err, InvalidRequest) and words in str(err), (raw, err)
        assert "Traceback" not in str(err) and "\n" not in str(err)
    flight.close()
    # The SDK raises the same typed errors.
    with gateway.client() as c, pytest.raises(InvalidRequest, match="cannot parse filter"):
        c.scan(f"{namespace}.{name}", filter="v >>> 1")


def test_methods_flight_does_not_serve_answer_one_sentence(
    gateway: GatewayProcess, http: httpx.Client, namespace: str
) -> None:
    """Issue 33.10: DoExchange, DoAction and ListFlights answer what the edge serves
    instead, in one sentence (before: pyarrow's Python traceback); a stranger is refused
    first; ListActions lists none; GetSchema is served (and DoPut: test_flight_put.py)."""
    flight = _flight(gateway)
    opts = _options(gateway.api_key)
    where = fl.FlightDescriptor.for_path("a", "b")
    calls = {
        "DoExchange": lambda: flight.do_exchange(where, opts)[0].close(),
        "DoAction": lambda: list(flight.do_action(fl.Action("drop", b""), opts)),
        "ListFlights": lambda: list(flight.list_flights(options=opts)),
    }
    for method, call in calls.items():
        with pytest.raises(fl.FlightError) as caught:
            call()
        err = error_from_flight(caught.value)
        assert isinstance(err, Unimplemented), (method, caught.value)
        assert f"does not serve {method}" in err.message and "DoGet" in err.message
        assert "DoPut (appends)" in err.message
        assert "Traceback" not in str(caught.value) and "\n" not in err.message
    assert flight.list_actions(opts) == []
    # GetSchema is served: the schema DoGet would stream. pyarrow sends its errors with a
    # traceback whatever the handler raises; that traceback names no file of the server.
    name = make_table(http, namespace)
    got = flight.get_schema(fl.FlightDescriptor.for_path(namespace, name), opts).schema
    assert got.names[-3:] == ["_partition", "_offset", "_timestamp"]
    scan = json.dumps({"scan": {"namespace": namespace, "name": name, "columns": ["v"]}})
    assert flight.get_schema(fl.FlightDescriptor.for_command(scan), opts).schema.names == ["v"]
    with pytest.raises(pa.ArrowException) as caught:
        flight.get_schema(fl.FlightDescriptor.for_path(namespace, "nope"), opts)
    assert f"table {namespace}.nope not found" in str(caught.value)
    assert "gateway/" not in str(caught.value) and str(REPO_ROOT) not in str(caught.value)
    stranger = _failure(
        lambda: flight.do_put(where, pa.schema([("v", pa.int64())]), _options(None))[0].close()
    )
    assert isinstance(error_from_flight(stranger), Unauthenticated)
    flight.close()


def _failure(call: Any) -> fl.FlightError:
    with pytest.raises(fl.FlightError) as caught:
        call()
    return caught.value


def test_flight_keeps_tenants_apart_and_meters_their_reads(
    gateway: GatewayProcess, namespace: str
) -> None:
    keys = {}
    with gateway.admin() as admin:
        for who in ("a", "b"):
            tenant = f"fl{who}{secrets.token_hex(4)}"
            admin.create_tenant(tenant)
            keys[who] = (tenant, admin.issue_key(tenant)[1])
    for who in ("a", "b"):
        with gateway.client(api_key=keys[who][1]) as c:
            c.create_table(f"{namespace}.t", {"v": "int64"}, partitions=1)
            c.append(f"{namespace}.t", [{"v": i} for i in range(25 if who == "a" else 3)])
    with gateway.client(api_key=keys["b"][1]) as b:
        # B's table of the same name is B's: A's rows are never seen.
        assert b.flight_location() is not None
        assert b.scan(f"{namespace}.t").column("v").to_pylist() == [0, 1, 2]
    with gateway.client(api_key=keys["a"][1]) as a:
        assert a.scan(f"{namespace}.t").num_rows == 25
    with gateway.admin() as admin:
        usage_a = admin.usage(keys["a"][0])
        usage_b = admin.usage(keys["b"][0])
    assert sum(r["read_records"] for r in usage_a) == 25
    assert sum(r["read_records"] for r in usage_b) == 3
    assert sum(r["read_bytes"] for r in usage_a) > 0


def test_a_gateway_without_flight_is_scanned_over_grpc(tmp_path: Path) -> None:
    gw = GatewayProcess(
        tmp_path / "gw",
        {"TIDEGATE_SERVER__FLIGHT_PORT": "0", "TIDEGATE_TIERING__ENABLED": "false"},
    ).start()
    try:
        with gw.client() as c:
            table = f"ns{uuid.uuid4().hex[:6]}.t"
            c.create_table(table, {"v": "int64"}, partitions=1)
            c.append(table, [{"v": i} for i in range(12)])
            assert c.flight_location() is None
            assert c.scan(table).column("v").to_pylist() == list(range(12))
        # Told to use a Flight edge that is not there: the error names it.
        nowhere = f"grpc+tcp://127.0.0.1:{gw.flight_port or 1}"
        with gw.client(flight=nowhere) as c, pytest.raises(Unavailable, match="Flight"):
            c.scan(table)
    finally:
        gw.stop()
