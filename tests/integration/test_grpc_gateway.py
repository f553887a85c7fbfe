"""The gateway process over gRPC, on both hot tiers: tables, appends, reads, follow."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import grpc
import pyarrow as pa
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gateway.client import Client
from gateway.wire.errors import TableAlreadyExists, TableNotFound
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration


def test_health_and_reflection(gateway: GatewayProcess) -> None:
    with grpc.insecure_channel(gateway.grpc_target) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "tidegate.v1.Tidegate"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        answers = list(
            refl.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            )
        )
        names = {s.name for s in answers[0].list_services_response.service}
        assert {"tidegate.v1.Tidegate", "grpc.health.v1.Health"} <= names


def test_table_lifecycle(client: Client, namespace: str) -> None:
    info = client.create_table(
        f"{namespace}.orders",
        [
            {"name": "id", "type": "int64", "nullable": False},
            {"name": "item", "type": "string"},
        ],
        partitions=3,
        key_columns=["id"],
    )
    assert info.partitions == 3
    assert [(f.name, f.type, f.nullable) for f in info.fields] == [
        ("id", "int64", False),
        ("item", "string", True),
    ]
    assert [p.high_watermark for p in info.partition_info] == [0, 0, 0]
    with pytest.raises(TableAlreadyExists):
        client.create_table(f"{namespace}.orders", {"id": "int64"})
    assert [t.table.name for t in client.list_tables(namespace)] == ["orders"]
    client.drop_table(f"{namespace}.orders")
    assert client.list_tables(namespace) == []
    with pytest.raises(TableNotFound):
        client.describe_table(f"{namespace}.orders")


def test_recreated_table_starts_empty(client: Client, namespace: str) -> None:
    table = f"{namespace}.again"
    client.create_table(table, {"v": "int64"})
    client.append(table, [{"v": 1}, {"v": 2}])
    client.drop_table(table)
    client.create_table(table, {"v": "int64"})
    assert client.describe_table(table).partition_info[0].high_watermark == 0
    assert client.read(table, partition=0, offset=0).num_rows == 0


def test_key_routing_is_stable_and_system_columns_added(client: Client, namespace: str) -> None:
    table = f"{namespace}.keyed"
    client.create_table(table, {"user": "string", "n": "int64"}, partitions=4, key_columns=["user"])
    users = [f"u{i}" for i in range(40)]
    client.append(table, [{"user": u, "n": i} for i, u in enumerate(users)])
    client.append(table, [{"user": u, "n": 100 + i} for i, u in enumerate(users)])
    where: dict[str, set[int]] = defaultdict(set)
    total = 0
    for p in range(4):
        t = client.read(table, partition=p, offset=0)
        total += t.num_rows
        rows = t.to_pylist()
        assert [r["_offset"] for r in rows] == list(range(len(rows)))
        assert all(r["_partition"] == p for r in rows)
        assert all(r["_timestamp"] is not None for r in rows)
        for r in rows:
            where[r["user"]].add(p)
    assert total == 80
    assert all(len(ps) == 1 for ps in where.values()), "a key must always map to one partition"
    assert len({next(iter(ps)) for ps in where.values()}) > 1, "keys must spread"


def test_keyless_batches_round_robin_and_stay_contiguous(client: Client, namespace: str) -> None:
    table = f"{namespace}.rr"
    client.create_table(table, {"n": "int64"}, partitions=3)
    ranges = [client.append(table, [{"n": i}, {"n": i}])[0] for i in range(6)]
    assert all(r.count == 2 for r in ranges)
    assert sorted(r.partition for r in ranges) == [0, 0, 1, 1, 2, 2]


def test_eight_concurrent_writers_dense_offsets(
    client: Client, gateway: GatewayProcess, namespace: str
) -> None:
    table = f"{namespace}.concurrent"
    client.create_table(table, {"writer": "int32", "seq": "int64"}, partitions=2)
    per_writer = 40
    acks: list[tuple[int, int, int, int, int]] = []  # partition, base, count, writer, seq
    lock = threading.Lock()
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            with gateway.client() as c:
                for s in range(per_writer):
                    n = 1 + (w + s) % 5
                    rows = pa.table(
                        {
                            "writer": pa.array([w] * n, pa.int32()),
                            "seq": pa.array([s] * n, pa.int64()),
                        }
                    )
                    (r,) = c.append(table, rows, partition=(w + s) % 2)
                    with lock:
                        acks.append((r.partition, r.base_offset, r.count, w, s))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for p in (0, 1):
        mine = sorted((a for a in acks if a[0] == p), key=lambda a: a[1])
        expected = 0
        for _, base, count, _, _ in mine:
            assert base == expected, "offsets must be dense, without gap or overlap"
            expected += count
        data = client.read(table, partition=p, offset=0, max_records=100_000).to_pylist()
        assert [r["_offset"] for r in data] == list(range(expected))
        for _, base, count, w, s in mine:
            assert {(r["writer"], r["seq"]) for r in data[base : base + count]} == {(w, s)}
        assert client.describe_table(table).partition_info[p].high_watermark == expected


def test_read_limits_and_offsets(client: Client, namespace: str) -> None:
    table = f"{namespace}.limits"
    client.create_table(table, {"v": "int64"})
    for i in range(10):
        client.append(table, [{"v": i * 10 + j} for j in range(10)])
    t = client.read(table, partition=0, offset=35, max_records=20)
    assert t.column("v").to_pylist() == list(range(35, 55))
    assert t.column("_offset").to_pylist() == list(range(35, 55))
    assert client.read(table, partition=0, offset=100).num_rows == 0
    everything = client.read(table, partition=0, offset=0, max_records=1000, max_bytes=1)
    assert everything.column("v").to_pylist() == list(range(100))


def test_follow_receives_rows_appended_after_start(
    client: Client, gateway: GatewayProcess, namespace: str
) -> None:
    table = f"{namespace}.follow"
    client.create_table(table, {"v": "int64"})
    client.append(table, [{"v": 0}])
    got: list[int] = []
    started = threading.Event()

    def follower() -> None:
        with gateway.client() as c:
            started.set()
            for batches, _, _ in c.read_batches(
                table, partition=0, offset=0, max_records=31, follow=True, timeout=60
            ):
                for b in batches:
                    got.extend(b.column("v").to_pylist())

    th = threading.Thread(target=follower)
    th.start()
    started.wait()
    time.sleep(0.3)  # let the follower reach the end of the log and wait there
    for i in range(1, 31):
        client.append(table, [{"v": i}])
    th.join(60)
    assert not th.is_alive()
    assert got == list(range(31))


def test_append_stream_pipelines_in_order(
    client: Client, gateway: GatewayProcess, namespace: str
) -> None:
    from gateway.client._sync import _ipc
    from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
    from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc

    table = f"{namespace}.pipelined"
    client.create_table(table, {"v": "int64"})
    ref = pb.TableRef(namespace=namespace, name="pipelined")
    good = _ipc([{"v": 1}, {"v": 2}])
    bad = _ipc([{"w": 1}])
    requests = [
        pb.AppendStreamRequest(
            request_id=i,
            append=pb.AppendRequest(table=ref, arrow_ipc=bad if i == 3 else good, partition=0),
        )
        for i in range(6)
    ]
    with gateway.channel() as ch:
        responses = list(pb_grpc.TidegateStub(ch).AppendStream(iter(requests), timeout=30))
    assert [r.request_id for r in responses] == list(range(6))
    assert responses[3].WhichOneof("result") == "error"
    assert responses[3].error.reason == "SCHEMA_MISMATCH"
    oks = [r.ok.ranges[0] for r in responses if r.WhichOneof("result") == "ok"]
    assert [r.base_offset for r in oks] == [0, 2, 4, 6, 8]
    assert client.describe_table(table).partition_info[0].high_watermark == 10
