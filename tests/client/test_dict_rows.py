"""The producer's fast path for dict rows: checked in Python at ``send``, converted to Arrow
once per request, routed exactly like the gateway routes.

The pure checks compare the Python check and routing with the Arrow way they replace; the
rest runs both SDK flavours against a real gateway process.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.client import RecordMetadata, SchemaMismatch, TableInfo, TableRef
from gateway.client._arrow import decode
from gateway.client._batching import Accumulator, Delivery, Finished, ProducerConfig
from gateway.client._producer import ProducerCore
from gateway.client._rows import RowPlan, values_to_batch
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.jsonrows import python_rows_to_batch
from gateway.wire.routing import partition_for_key, route_by_key
from gateway.wire.schema import conform_batch
from tests.integration.flavours import flavoured_client, result
from tests.services import GatewayProcess

UTC = dt.UTC


def info(schema: pa.Schema, partitions: int = 1, keys: tuple[str, ...] = ()) -> TableInfo:
    return TableInfo(TableRef("ns", "t"), schema, partitions, keys)


def arrow_way(row: dict[str, Any], schema: pa.Schema) -> pa.RecordBatch:
    """What ``send`` does with a dict the fast path cannot vouch for: the conversion every
    interface shares (raises on refusal)."""
    return conform_batch(python_rows_to_batch([row], schema), schema)


# --------------------------------------------------------------------------------------
# The Python check against Arrow's own conversion
# --------------------------------------------------------------------------------------
TYPES = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.float32(),
    pa.float64(),
    pa.bool_(),
    pa.string(),
    pa.binary(),
    pa.timestamp("us"),
    pa.timestamp("us", tz="UTC"),
    pa.date32(),
    pa.time64("us"),
    pa.decimal128(10, 2),
    pa.decimal128(38, 0),
    pa.list_(pa.int32()),
    pa.struct([pa.field("a", pa.int32())]),
]

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([-(2**63), 2**63 - 1, 2**63, -129, 128, 2**24, 2**24 + 1, 2**53, 2**53 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["\ud800", "1", "2024-01-01", "Zoë"]),
    st.binary(max_size=8),
    st.datetimes(timezones=st.sampled_from([None, UTC, dt.timezone(dt.timedelta(hours=-5))])),
    st.dates(),
    st.times(),
    st.decimals(allow_nan=True, allow_infinity=False, places=2),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.sampled_from([decimal.Decimal("1.230"), decimal.Decimal("1E+3"), decimal.Decimal("-0")]),
    st.lists(st.integers(-5, 5), max_size=3),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(bytearray, st.binary(max_size=4)),
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=st.sampled_from(TYPES), nullable=st.booleans(), value=VALUES)
def test_the_check_agrees_with_arrow(t: pa.DataType, nullable: bool, value: Any) -> None:
    schema = pa.schema([pa.field("v", t, nullable=nullable)])
    row = {"v": value}
    try:
        expected = arrow_way(row, schema)
    except Exception:
        expected = None
    plan = RowPlan(schema)
    try:
        checked = plan.check(row)
    except SchemaMismatch:
        assert expected is None, f"refused {value!r} for {t}, which Arrow stores"
        return
    if checked is None:
        return  # unsure: the Arrow way decides, exactly as before
    assert expected is not None, f"let {value!r} through for {t}, which Arrow refuses"
    values, nbytes = checked
    assert nbytes >= 0
    # repr: NaN is not equal to itself, its repr is.
    assert repr(values_to_batch([values], schema).to_pylist()) == repr(expected.to_pylist())


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    types=st.lists(st.sampled_from(TYPES), min_size=1, max_size=3),
    nullable=st.booleans(),
    values=st.lists(VALUES, min_size=3, max_size=3),
)
def test_the_fill_vouches_only_for_what_the_check_passes(
    types: list[pa.DataType], nullable: bool, values: list[Any]
) -> None:
    """The one-dict fast path appends a row only when the full check passes it, with the
    same values and byte estimate; else it appends nothing."""
    schema = pa.schema([pa.field(f"c{i}", t, nullable=nullable) for i, t in enumerate(types)])
    row = {f"c{i}": v for i, v in enumerate(values[: len(types)])}
    plan = RowPlan(schema)
    columns: list[list[Any]] = [[] for _ in types]
    size = plan.fill(row, columns)
    if size < 0:
        assert columns == [[] for _ in types]
        return
    checked = plan.check(row)
    assert checked is not None, f"filled {row!r}, which the check does not pass"
    assert tuple(c[0] for c in columns) == checked[0] and size == checked[1]
    # Extra or missing columns are never filled.
    assert plan.fill({**row, "other": 1}, [[] for _ in types]) < 0
    assert plan.fill(dict(list(row.items())[1:]), [[] for _ in types]) < 0


def test_the_fill_takes_any_column_name_and_leaves_other_mappings_alone() -> None:
    names = ["a'b", 'c"d', "x\\y", "é", "def", "1 2"]
    schema = pa.schema([pa.field(n, pa.int64()) for n in names])
    plan = RowPlan(schema)
    columns: list[list[Any]] = [[] for _ in names]
    assert plan.fill({n: i for i, n in enumerate(names)}, columns) == 8 * len(names)
    assert columns == [[i] for i in range(len(names))]
    # Mappings other than a dict take the careful path, which never calls __missing__.
    core = ProducerCore(info(pa.schema([("n", pa.int64()), ("m", pa.int64())])), ProducerConfig())
    row: defaultdict[str, Any] = defaultdict(int, {"n": 1, "x": 2})
    with pytest.raises(SchemaMismatch):
        core.add(row, None, Future())
    assert dict(row) == {"n": 1, "x": 2} and core.unfinished == 0


def test_columns_are_checked_by_name() -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("note", pa.string())])
    plan = RowPlan(schema)
    assert plan.check({"id": 1, "note": None}) == ((1, None), 8)  # null is given, not left out
    assert plan.check({"note": "x", "id": 2}) == ((2, "x"), 13)  # any order
    bad_rows = [{"id": 1, "extra": 2}, {"note": "x"}, {"id": None}, {}, {"id": 1, 7: 2}, {"id": 1}]
    for bad in bad_rows:
        with pytest.raises(SchemaMismatch):
            plan.check(bad)
    # Values only Arrow can judge: the columns are still checked (from_pylist would drop
    # an unknown key silently).
    acc = Accumulator(info(schema), ProducerConfig())
    for bad in [{"id": np.int64(1), "extra": 2}, {"note": np.str_("x")}]:
        with pytest.raises(SchemaMismatch):
            acc.add(bad, None)
        with pytest.raises(SchemaMismatch):
            acc.add([{"id": 1, "note": None}, bad], None)
    assert acc.buffered == 0 and acc.drain(time.monotonic(), force=True) == []


# --------------------------------------------------------------------------------------
# Routing parity, and what a request carries
# --------------------------------------------------------------------------------------
KEY_TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "i": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "s": (pa.string(), st.text(max_size=6)),
    "b": (pa.binary(), st.binary(max_size=6)),
    "f": (pa.float64(), st.one_of(st.floats(), st.integers(-(2**53), 2**53))),
    "f32": (pa.float32(), st.floats(width=32)),
    "ok": (pa.bool_(), st.booleans()),
    "day": (pa.date32(), st.dates()),
    "ts": (
        pa.timestamp("us", tz="UTC"),
        st.datetimes(timezones=st.sampled_from([None, UTC, dt.timezone(dt.timedelta(hours=3))])),
    ),
    "naive": (pa.timestamp("us"), st.datetimes()),
    "d": (pa.decimal128(12, 3), st.decimals(places=2, min_value=-(10**6), max_value=10**6)),
}


@st.composite
def keyed_rows(draw: st.DrawFn) -> tuple[pa.Schema, tuple[str, ...], list[dict[str, Any]]]:
    keys = tuple(
        draw(st.lists(st.sampled_from(sorted(KEY_TYPES)), min_size=1, max_size=3, unique=True))
    )
    schema = pa.schema([(k, KEY_TYPES[k][0]) for k in keys] + [("n", pa.int64())])
    row = st.fixed_dictionaries({k: st.one_of(st.none(), KEY_TYPES[k][1]) for k in keys})
    rows = draw(st.lists(row, min_size=1, max_size=20))
    return schema, keys, [{**r, "n": i} for i, r in enumerate(rows)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=keyed_rows(), partitions=st.integers(1, 9), one_by_one=st.booleans())
def test_dict_rows_route_like_the_arrow_path(
    case: tuple[pa.Schema, tuple[str, ...], list[dict[str, Any]]], partitions: int, one_by_one: bool
) -> None:
    schema, keys, rows = case
    acc = Accumulator(info(schema, partitions, keys), ProducerConfig(batch_records=7, linger=60))
    sends = [acc.add(r, None) for r in rows] if one_by_one else [acc.add(rows, None)]
    for batch in acc.drain(time.monotonic(), force=True):
        batch.seal(schema, "none")
        batch.complete(0)
    got = [md.partition for d in sends for md in _mds(d)]
    expected = route_by_key(pa.RecordBatch.from_pylist(rows, schema=schema), keys, partitions)
    want = [0] * len(rows)
    for p, idx in expected.items():
        for i in idx.to_pylist():
            want[i] = p
    assert got == want


def _mds(d: Delivery) -> list[RecordMetadata]:
    out = d.result()
    return [out] if isinstance(out, RecordMetadata) else out


def test_a_request_carries_one_record_batch_in_send_order() -> None:
    schema = pa.schema([("n", pa.int64()), ("s", pa.string())])
    acc = Accumulator(info(schema), ProducerConfig(batch_records=100, linger=60))
    acc.add({"n": 0, "s": "a"}, None)
    acc.add([{"n": 1, "s": "b"}, {"n": 2, "s": None}], None)
    acc.add(pa.table({"n": [3, 4], "s": ["c", "d"]}), None)
    acc.add({"n": np.int64(5), "s": "e"}, None)  # the check is unsure: the Arrow way
    acc.add({"n": 6, "s": None}, None)
    acc.add(pa.record_batch({"s": ["f"], "n": pa.array([7], pa.int32())}), None)
    (batch,) = acc.drain(time.monotonic(), force=True)
    batch.seal(schema, "zstd")
    (decoded,) = decode(batch.payload)
    assert decoded.schema == schema
    assert decoded.column("n").to_pylist() == list(range(8))
    assert decoded.column("s").to_pylist() == ["a", "b", None, "c", "d", "e", None, "f"]


def test_a_bad_dict_amid_buffered_sends_is_refused_at_send_alone() -> None:
    """One-dict sends with futures (the fast path): a bad value between good ones raises
    at ``send`` with one sentence naming the column and value, nothing of it is buffered,
    and the good rows around it go in one request that names its partition and carries
    exactly the table's schema."""
    schema = pa.schema(
        [
            pa.field("n", pa.int64(), nullable=False),
            pa.field("small", pa.int8()),
            pa.field("s", pa.string()),
        ]
    )
    core = ProducerCore(info(schema, partitions=3), ProducerConfig(linger=60))
    futures: list[Future[Any]] = []
    for i in range(6):
        fut: Future[Any] = Future()
        assert core.add({"n": i, "small": i, "s": f"r{i}"}, 2, fut) is None
        futures.append(fut)
        if i == 2:
            for bad, column, shown in [
                ({"n": "3", "small": 1, "s": "x"}, "n", "'3'"),
                ({"n": 3, "small": 300, "s": "x"}, "small", "300"),
                ({"n": 3, "small": 1, "s": 1.5}, "s", "1.5"),
            ]:
                with pytest.raises(SchemaMismatch) as refused:
                    core.add(bad, 2, Future())
                message = refused.value.message
                assert f"column {column!r}" in message and shown in message, message
                assert "\n" not in message
    assert core.unfinished == 6
    core.stream_opened()
    (request,) = core.outgoing(time.monotonic(), force=True)
    assert request.append.partition == 2
    (decoded,) = decode(request.append.arrow_ipc)
    assert decoded.schema == schema  # column order, types and nullability
    assert decoded.column("n").to_pylist() == list(range(6))
    (response,) = [pb.AppendStreamResponse(request_id=request.request_id)]
    response.ok.ranges.add(partition=2, base_offset=40, count=6)
    core.on_response(core.stream_gen, response).resolve()
    assert [f.result() for f in futures] == [RecordMetadata(2, 40 + i) for i in range(6)]
    assert core.idle()


def test_dict_sends_cut_by_bytes_keep_their_order() -> None:
    schema = pa.schema([("n", pa.int64()), ("s", pa.string())])
    core = ProducerCore(info(schema), ProducerConfig(batch_bytes=200, linger=60))
    futures: list[Future[Any]] = []
    for i in range(50):
        fut: Future[Any] = Future()
        core.add({"n": i, "s": "x" * (i % 13)}, None, fut)
        futures.append(fut)
    batches = core.acc.drain(time.monotonic(), force=True)
    assert len(batches) > 1 and sum(b.records for b in batches) == 50
    assert all(b.nbytes <= 200 for b in batches)
    seen = []
    base = 0
    for b in batches:
        b.seal(schema, "none")
        (decoded,) = decode(b.payload)
        seen.extend(decoded.column("n").to_pylist())
        done = Finished()
        done.acked(b, base)
        done.resolve()
        base += b.records
    assert seen == list(range(50))
    assert [f.result().offset for f in futures] == list(range(50))


def test_sticky_sends_cut_by_bytes_keep_other_open_batches() -> None:
    """Unkeyed sends moving on to the next partition when a batch is full by bytes join the
    batch already open there: every row is in exactly one request, in send order."""
    schema = pa.schema([("n", pa.int64()), ("s", pa.string())])
    core = ProducerCore(info(schema, partitions=3), ProducerConfig(batch_bytes=200, linger=60))
    futures: dict[int, Future[Any]] = {}
    n = 0
    for part in (0, 1, 2, None, None):
        for _ in range(2 if part is not None else 30):
            futures[n] = Future()
            assert core.add({"n": n, "s": "x" * (n % 11)}, part, futures[n]) is None
            n += 1
    batches = core.acc.drain(time.monotonic(), force=True)
    assert sum(b.records for b in batches) == n == core.unfinished
    next_offset = [0, 0, 0]
    stored: dict[int, tuple[int, int]] = {}
    for b in batches:
        b.seal(schema, "none")
        (decoded,) = decode(b.payload)
        ids = decoded.column("n").to_pylist()
        assert ids == sorted(ids)
        for k, i in enumerate(ids):
            stored[i] = (b.partition, next_offset[b.partition] + k)
        done = Finished()
        done.acked(b, next_offset[b.partition])
        done.resolve()
        next_offset[b.partition] += b.records
    assert sorted(stored) == list(range(n))
    assert {i: tuple(f.result()) for i, f in futures.items()} == stored


def test_a_cancelled_future_does_not_stop_the_others() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        schema = pa.schema([("n", pa.int64())])
        core = ProducerCore(info(schema), ProducerConfig(linger=60))
        futures = [loop.create_future() for _ in range(4)]
        for i, fut in enumerate(futures):
            core.add({"n": i}, 0, fut)
        futures[1].cancel()
        (batch,) = core.acc.drain(time.monotonic(), force=True)
        done = Finished()
        done.acked(batch, 7)
        done.resolve()
        assert futures[1].cancelled()
        assert [futures[i].result() for i in (0, 2, 3)] == [
            RecordMetadata(0, 7),
            RecordMetadata(0, 9),
            RecordMetadata(0, 10),
        ]

    asyncio.run(run())


def test_a_batch_arrow_refuses_at_seal_fails_alone() -> None:
    """The safety net behind the check: rows it let through that Arrow still refuses fail
    their own batch's sends with SchemaMismatch; other batches go on."""
    schema = pa.schema([("n", pa.int64())])
    core = ProducerCore(info(schema, partitions=2), ProducerConfig(linger=60))
    good = core.add({"n": 1}, 0)
    doomed = core.add({"n": 2}, 1)
    assert good is not None and doomed is not None
    single: Future[Any] = Future()
    assert core.add({"n": 3}, 1, single) is None  # the future stands for the send
    core.acc.open[1].columns[0].append("not a number")  # what the check never passes
    core.acc.open[1].records += 1
    core.unfinished += 1
    assert core.outgoing(time.monotonic(), force=True) == []  # no stream open yet
    failed = core.take_rejected()
    assert failed.deliveries == [doomed] and isinstance(doomed.error, SchemaMismatch)
    failed.resolve()
    err = single.exception()
    assert isinstance(err, SchemaMismatch) and err is doomed.error
    assert "'n'" in err.message and "'not a number'" in err.message, err.message
    assert good.error is None and [b.partition for b in core.queues[0].waiting] == [0]
    assert core.unfinished == 1 and not core.queues[1].waiting


# --------------------------------------------------------------------------------------
# Against a real gateway
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(
        Path(tmp_path_factory.mktemp("gw-dict-rows")),
        {"TIDEGATE_HOT__TYPE": "disk", "TIDEGATE_HOT__FSYNC": "batch"},
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(params=["sync", "aio"])
def sdk(request: pytest.FixtureRequest, gateway: GatewayProcess) -> Iterator[Any]:
    """A client of either flavour with the sync calling convention."""
    with flavoured_client(request.param, gateway) as client:
        yield client


@pytest.fixture
def table() -> str:
    return f"ns{uuid.uuid4().hex[:10]}.rows"


def stored(sdk: Any, table: str, partition: int = 0) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = sdk.read(
        table, partition=partition, offset=0, max_records=1_000_000
    ).to_pylist()
    return rows


@pytest.mark.integration
def test_single_dict_sends_land_in_order_with_their_offsets(sdk: Any, table: str) -> None:
    sdk.create_table(
        table,
        [
            {"name": "n", "type": "int64", "nullable": False},
            {"name": "s", "type": "string"},
            {"name": "raw", "type": "binary"},
            {"name": "x", "type": "double"},
            {"name": "ok", "type": "bool"},
            {"name": "at", "type": "timestamp[us, tz=UTC]"},
            {"name": "day", "type": "date32"},
            {"name": "price", "type": "decimal128(10, 2)"},
        ],
    )
    t0 = dt.datetime(2024, 5, 1, tzinfo=UTC)

    def row(i: int) -> dict[str, Any]:
        return {
            "n": i,
            "s": None if i % 7 == 0 else f"s{i}é",
            "raw": bytes([i % 256]) * (i % 5),
            "x": i / 4 if i % 2 else i,  # ints in a double column too
            "ok": i % 3 == 0,
            "at": t0 + dt.timedelta(microseconds=i),
            "day": dt.date(2024, 1, 1) + dt.timedelta(days=i % 365),
            "price": decimal.Decimal(i) / 100,
        }

    with sdk.producer(table, batch_records=64, linger=30) as p:
        futures = [p.send(row(i)) for i in range(1000)]
        p.flush()
    assert [result(f) for f in futures] == [RecordMetadata(0, i) for i in range(1000)]
    got = stored(sdk, table)
    assert [r["_offset"] for r in got] == list(range(1000))
    for i, r in enumerate(got):
        want = row(i)
        assert {k: r[k] for k in want} == {**want, "x": float(want["x"])}


@pytest.mark.integration
def test_bad_dicts_fail_at_send_and_nothing_of_them_is_stored(sdk: Any, table: str) -> None:
    sdk.create_table(
        table,
        [
            {"name": "n", "type": "int64", "nullable": False},
            {"name": "small", "type": "int8"},
            {"name": "s", "type": "string"},
        ],
        partitions=2,
    )
    bad = [
        {"n": "1", "small": 1, "s": "wrong type"},
        {"small": 1, "s": "missing n"},
        {"n": 1, "small": 1, "s": "extra", "other": 1},
        {"n": 1, "small": 300, "s": "out of range"},
        {"n": None, "small": 1, "s": "null in a non-nullable column"},
        {"n": 1, "small": np.int8(5), "s": "numpy: the Arrow way decides (and stores)"},
    ]
    sent = []
    with sdk.producer(table, batch_records=3, linger=30) as p:
        for i, b in enumerate(bad[:-1]):
            sent.append(p.send({"n": i, "small": i, "s": "good"}, partition=i % 2))
            with pytest.raises(SchemaMismatch):
                p.send(b)
            with pytest.raises(SchemaMismatch):  # one bad row refuses the whole list
                p.send([{"n": 100, "small": 0, "s": "list"}, b])
        odd = p.send(bad[-1], partition=0)
        sent.append(p.send({"n": 99, "small": 9, "s": "last"}, partition=0))
        p.flush()
    rows = stored(sdk, table, 0) + stored(sdk, table, 1)
    assert sorted(r["n"] for r in rows) == [0, 1, 1, 2, 3, 4, 99]
    assert {r["s"] for r in rows} == {"good", "last", bad[-1]["s"]}
    assert result(odd).partition == 0
    for f in sent:
        md = result(f)
        assert stored(sdk, table, md.partition)[md.offset]["s"] in ("good", "last")


@pytest.mark.integration
def test_mixed_dict_and_arrow_sends_keep_order(sdk: Any, table: str) -> None:
    sdk.create_table(table, {"n": "int64", "tag": "string"}, partitions=3)
    expected: list[int] = []
    futures = []
    with sdk.producer(table, batch_records=10, linger=30) as p:
        n = 0
        for round_ in range(12):
            kind = round_ % 4
            if kind == 0:
                sends: Any = {"n": n, "tag": "dict"}
                size = 1
            elif kind == 1:
                size = 3
                sends = [{"n": n + k, "tag": "list"} for k in range(size)]
            elif kind == 2:
                size = 4
                sends = pa.table({"n": range(n, n + size), "tag": ["table"] * size})
            else:
                size = 1
                sends = {"n": np.int64(n), "tag": "numpy"}  # the Arrow way, one row
            futures.append(p.send(sends, partition=1))
            expected.extend(range(n, n + size))
            n += size
        p.flush()
    offsets = []
    for f in futures:
        out = result(f)
        offsets.extend(m.offset for m in ([out] if isinstance(out, RecordMetadata) else out))
    assert offsets == list(range(len(expected)))
    assert [r["n"] for r in stored(sdk, table, 1)] == expected


@pytest.mark.integration
def test_keyed_dict_rows_go_where_the_gateway_routes(sdk: Any, table: str) -> None:
    sdk.create_table(
        table,
        {"user": "string", "at": "timestamp[us, tz=UTC]", "price": "decimal128(8, 2)"},
        partitions=5,
        key_columns=["user", "at", "price"],
    )
    t0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
    rows = [
        {
            "user": f"u{i % 7}",
            "at": t0 + dt.timedelta(seconds=i % 3),
            "price": decimal.Decimal(i % 4) / 2,
        }
        for i in range(40)
    ]
    with sdk.producer(table, batch_records=8, linger=30) as p:
        futures = [p.send(r) for r in rows]
        p.flush()
    # The gateway's own routing of a plain append of the same rows.
    sdk.append(table, pa.Table.from_pylist(rows, schema=sdk.table_info(table).schema))
    mine = [result(f).partition for f in futures]
    placed: dict[tuple[Any, ...], set[int]] = {}
    for part in range(5):
        for r in stored(sdk, table, part):
            placed.setdefault((r["user"], r["at"], r["price"]), set()).add(part)
    for r, part in zip(rows, mine, strict=True):
        assert placed[(r["user"], r["at"], r["price"])] == {part}
    assert mine == [
        partition_for_key(
            [
                r["user"],
                r["at"].astimezone(UTC),
                decimal.Decimal(r["price"]).quantize(decimal.Decimal("0.01")),
            ],
            5,
        )
        for r in rows
    ]
