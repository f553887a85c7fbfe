"""Appends over Flight's DoPut (issue 29.2), on both hot tiers: each batch one request,
answered in order by a PutResult carrying the AppendStreamResponse gRPC's AppendStream
answers; idempotent producers deduplicate retries, a refused batch is answered in place, and
a gateway killed mid-stream loses and doubles nothing the client resends."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from gateway.client._flight import error_from_flight
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import InvalidRequest, Unauthenticated
from tests.integration.conftest import gateway_env
from tests.integration.test_scan_edges import make_table
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([pa.field("v", pa.int64(), nullable=False), pa.field("tag", pa.string())])


def _options(key: str | None) -> fl.FlightCallOptions:
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    return fl.FlightCallOptions(headers=headers, timeout=30)


def _meta(request_id: int, **append: Any) -> pa.Buffer:
    msg = pb.AppendStreamRequest(request_id=request_id, append=pb.AppendRequest(**append))
    return pa.py_buffer(msg.SerializeToString())


def _batch(values: range) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array(list(values), pa.int64()), pa.array([f"r{v}" for v in values])], schema=SCHEMA
    )


class Put:
    """One DoPut call: write a batch, read its answer."""

    def __init__(self, gw: GatewayProcess, namespace: str, name: str) -> None:
        self.flight = fl.connect(f"grpc+tcp://127.0.0.1:{gw.flight_port}")
        where = fl.FlightDescriptor.for_path(namespace, name)
        self.writer, self.reader = self.flight.do_put(where, SCHEMA, _options(gw.api_key))

    def send(self, batch: pa.RecordBatch, meta: pa.Buffer | None) -> pb.AppendStreamResponse:
        if meta is None:
            self.writer.write_batch(batch)
        else:
            self.writer.write_with_metadata(batch, meta)
        answer = self.reader.read()
        if answer is None:
            raise RuntimeError("the DoPut call ended without an answer")
        return pb.AppendStreamResponse.FromString(answer.to_pybytes())

    def close(self) -> None:
        self.writer.done_writing()
        self.writer.close()
        self.flight.close()


def test_doput_appends_deduplicates_retries_and_answers_refusals_in_place(
    gateway: GatewayProcess, http: httpx.Client, namespace: str
) -> None:
    name = make_table(http, namespace)
    put = Put(gateway, namespace, name)
    try:
        first = put.send(_batch(range(5)), _meta(1, partition=1, producer_id="p", sequence=0))
        assert first.request_id == 1 and first.WhichOneof("result") == "ok"
        assert [(r.partition, r.base_offset, r.count, r.duplicate) for r in first.ok.ranges] == [
            (1, 0, 5, False)
        ]
        second = put.send(_batch(range(5, 8)), _meta(2, partition=1, producer_id="p", sequence=1))
        assert [(r.base_offset, r.count) for r in second.ok.ranges] == [(5, 3)]
        # A retry of sequence 0 is answered with its original offsets, stored once.
        again = put.send(_batch(range(5)), _meta(3, partition=1, producer_id="p", sequence=0))
        assert [(r.base_offset, r.count, r.duplicate) for r in again.ok.ranges] == [(0, 5, True)]
        # A gap in the sequences is refused in place; the call goes on.
        gap = put.send(_batch(range(9, 10)), _meta(4, partition=1, producer_id="p", sequence=5))
        assert gap.request_id == 4 and gap.error.reason == "OUT_OF_ORDER_SEQUENCE"
        # No metadata: routed like an append without a partition, with no idempotence.
        plain = put.send(_batch(range(100, 110)), None)
        assert sum(r.count for r in plain.ok.ranges) == 10
    finally:
        put.close()
    # A call whose rows break the table's schema: each batch refused in one sentence
    # naming the column.
    flight = fl.connect(f"grpc+tcp://127.0.0.1:{gateway.flight_port}")
    try:
        wrong = pa.record_batch({"v": pa.array(["x"]), "tag": pa.array(["y"])})
        where = fl.FlightDescriptor.for_path(namespace, name)
        writer, reader = flight.do_put(where, wrong.schema, _options(gateway.api_key))
        writer.write_with_metadata(wrong, _meta(5, partition=0))
        refused = pb.AppendStreamResponse.FromString(reader.read().to_pybytes())
        assert refused.request_id == 5 and refused.error.reason == "SCHEMA_MISMATCH"
        assert "'v'" in refused.error.message and "\n" not in refused.error.message
        writer.done_writing()
        writer.close()
    finally:
        flight.close()
    with gateway.client() as c:
        got = c.read(f"{namespace}.{name}", partition=1, offset=0).column("v").to_pylist()
        assert got[:8] == list(range(8))
        assert (
            sum(c.read(f"{namespace}.{name}", partition=p, offset=0).num_rows for p in (0, 1)) == 18
        )


def test_doput_refuses_strangers_and_bad_descriptors_in_one_sentence(
    gateway: GatewayProcess, http: httpx.Client, namespace: str
) -> None:
    name = make_table(http, namespace)
    with gateway.client() as c:  # what a client asks before it appends over Flight
        info = c.stub.GetGatewayInfo(pb.GetGatewayInfoRequest(), metadata=c.metadata)
        assert info.flight_appends and info.flight_port == gateway.flight_port
    flight = fl.connect(f"grpc+tcp://127.0.0.1:{gateway.flight_port}")
    try:
        where = fl.FlightDescriptor.for_path(namespace, name)
        with pytest.raises(fl.FlightError) as caught:
            writer, _ = flight.do_put(where, SCHEMA, _options(None))
            writer.write_batch(_batch(range(3)))
            writer.close()
        assert isinstance(error_from_flight(caught.value), Unauthenticated)
        for descriptor, says in [
            (fl.FlightDescriptor.for_path("only-one"), "[namespace, name]"),
            (fl.FlightDescriptor.for_command(b"{nope"), "not JSON"),
            (fl.FlightDescriptor.for_command(json.dumps({"scan": {}}).encode()), '"append"'),
        ]:
            with pytest.raises(fl.FlightError) as caught:
                writer, _ = flight.do_put(descriptor, SCHEMA, _options(gateway.api_key))
                writer.write_batch(_batch(range(3)))
                writer.close()
            err = error_from_flight(caught.value)
            assert isinstance(err, InvalidRequest) and says in err.message, err
        # The command form names the table as the path does.
        command = json.dumps({"append": {"namespace": namespace, "name": name}}).encode()
        writer, reader = flight.do_put(
            fl.FlightDescriptor.for_command(command), SCHEMA, _options(gateway.api_key)
        )
        writer.write_with_metadata(_batch(range(4)), _meta(9, partition=0))
        answer = pb.AppendStreamResponse.FromString(reader.read().to_pybytes())
        assert [(r.partition, r.count) for r in answer.ok.ranges] == [(0, 4)]
        writer.done_writing()
        writer.close()
    finally:
        flight.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_doput_through_kill_9_stores_every_acknowledged_batch_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A writer appends numbered batches over DoPut as an idempotent producer while the
    gateway is SIGKILLed twice; after each failure it reopens the call and resends every
    unacknowledged batch with its sequence. At the end the partition holds each batch
    exactly once, in order, and every acknowledged offset holds its batch."""
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    env = gateway_env(kind, redis)
    gw = GatewayProcess(tmp_path / "gw", env).start()
    namespace, name, batches, size = f"put{kind}", "t", 120, 25
    acked: dict[int, int] = {}
    done = threading.Event()
    failures: list[BaseException] = []

    def writer() -> None:
        seq = 0
        while seq < batches:
            try:
                put = Put(gw, namespace, name)
                try:
                    while seq < batches:
                        rows = range(seq * size, (seq + 1) * size)
                        meta = _meta(seq, partition=0, producer_id="w", sequence=seq)
                        answer = put.send(_batch(rows), meta)
                        if answer.WhichOneof("result") != "ok":
                            raise RuntimeError(answer.error.message)
                        acked[seq] = answer.ok.ranges[0].base_offset
                        seq += 1
                finally:
                    with contextlib.suppress(Exception):  # the gateway went away under it
                        put.close()
            except (fl.FlightError, pa.ArrowException, RuntimeError, OSError):
                threading.Event().wait(0.2)  # the gateway is restarting: resend from seq
            except BaseException as exc:  # pragma: no cover - reported below
                failures.append(exc)
                return
        done.set()

    try:
        with gw.client() as c:
            c.create_table(f"{namespace}.{name}", {"v": "int64", "tag": "string"}, partitions=1)
        t = threading.Thread(target=writer, daemon=True)
        t.start()
        for at in (30, 80):
            while len(acked) < at and t.is_alive():
                threading.Event().wait(0.01)
            gw.restart()
        assert done.wait(150), (len(acked), failures)
        assert not failures, failures
        with gw.client() as c:
            values = c.read(f"{namespace}.{name}", partition=0, offset=0, max_records=10_000)
            v = values.column("v").to_pylist()
        assert v == list(range(batches * size))  # each batch once, in order
        for seq, base in acked.items():
            assert v[base] == seq * size  # every acknowledged offset holds its batch
    finally:
        gw.stop()


def test_the_producer_appends_over_flight_where_offered_and_over_grpc_elsewhere(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    """The sync producer over DoPut: keyed routing, offsets in its futures, idempotent
    batches; ``transport='grpc'`` and a gateway without a Flight edge append over gRPC."""
    table = f"{namespace}.byflight"
    with gateway.client() as c:
        c.create_table(table, {"user": "string", "n": "int64"}, partitions=3, key_columns=["user"])
        users = [f"user-{i}" for i in range(90)]
        with c.producer(table, batch_records=16, linger=0.01, transport="flight") as p:
            assert p.transport == "flight"
            singles = [p.send({"user": u, "n": i}) for i, u in enumerate(users)]
            many = p.send(pa.table({"user": users, "n": list(range(100, 190))}))
            p.flush()
        with c.producer(table, transport="auto") as a:
            assert a.transport == "flight"
        with c.producer(table) as g:  # gRPC unless asked (docs/decisions/data-plane.md)
            assert g.transport == "grpc"
            g.send({"user": "last", "n": 1000}).result(30)
        # Closed, neither left a thread of its stream running (an interpreter exiting
        # under a live call can hang: a CLI append once did, after printing its result).
        for closed in (p, g):
            assert closed._stream_threads
            assert not [t.name for t in closed._stream_threads if t.is_alive()]
        offsets = {(m.partition, m.offset) for f in singles for m in [f.result(30)]}
        offsets |= {(m.partition, m.offset) for m in many.result(30)}
        rows = [r for p in range(3) for r in c.read(table, partition=p, offset=0).to_pylist()]
        assert len(rows) == 181 and len(offsets) == 180  # each row once
        by_offset = {(r["_partition"], r["_offset"]): r for r in rows}
        assert all(by_offset[o]["n"] < 1000 for o in offsets)
        assert sorted(r["n"] for r in rows) == [*range(90), *range(100, 190), 1000]
        with pytest.raises(InvalidRequest, match="unknown producer transport 'udp'"):
            c.producer(table, transport="udp")
    # A gateway with no Flight edge: 'auto' appends over gRPC, 'flight' is refused.
    plain = GatewayProcess(tmp_path / "plain", {"TIDEGATE_SERVER__FLIGHT_PORT": "0"}).start()
    try:
        with plain.client() as c:
            c.create_table("a.b", {"n": "int64"})
            with c.producer("a.b", transport="auto") as p:
                assert p.transport == "grpc"
                p.send({"n": 1}).result(30)
            with pytest.raises(InvalidRequest, match="takes no appends"):
                c.producer("a.b", transport="flight")
    finally:
        plain.stop()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_the_flight_producer_rides_through_kill_9_storing_each_row_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    gw = GatewayProcess(tmp_path / "gw", gateway_env(kind, redis)).start()
    table = f"fp{kind}.t"
    try:
        with gw.client() as c:
            c.create_table(table, {"n": "int64"}, partitions=2)
            with c.producer(table, transport="flight", batch_records=50, linger=0.005) as p:
                futures = []
                for i in range(0, 6000, 100):
                    futures.append(p.send(pa.table({"n": list(range(i, i + 100))})))
                    if i in (2000, 4000):
                        gw.restart()
                p.flush(180)
            acked = [m for f in futures for m in f.result(1)]
            rows = [
                r
                for part in (0, 1)
                for r in c.read(table, partition=part, offset=0, max_records=10_000).to_pylist()
            ]
        assert sorted(r["n"] for r in rows) == list(range(6000))  # each row once
        assert len(acked) == 6000
        where = {(r["_partition"], r["_offset"]): r["n"] for r in rows}
        assert all((m.partition, m.offset) in where for m in acked)
    finally:
        gw.stop()
