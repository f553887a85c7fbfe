"""Issue 43, item 1: the pass-through baseline answers the benchmark clients as the gateway
does (offsets, reads of the stored bodies), on both raw stores, and the report gives a
Tidegate row its ratio to the pass-through in a column of its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from benchmarks.__main__ import passthrough_system
from benchmarks.harness import compare
from benchmarks.loadgen import BatchFactory
from benchmarks.passthrough import PassThroughProcess
from benchmarks.report import write_report
from benchmarks.scenarios import CHANNEL_OPTIONS, create_table, fill, gateway_reader
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from tests.services import RedisServer


async def _append_and_read(target: str, flight_port: int) -> None:
    from benchmarks.scenarios import FlightReader

    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as ch:
        stub = pb_grpc.TidegateStub(ch)
        ref = await create_table(stub, "pt", 2, ())
        stored = await fill(stub, ref, (), records=5_000, batch_records=1_000, record_bytes=100)
        assert stored == 5_000
        one = await stub.Append(
            pb.AppendRequest(table=ref, arrow_ipc=BatchFactory(7, 100).ipc(1), partition=1)
        )
        assert [(r.partition, r.base_offset, r.count) for r in one.ranges] == [(1, 0, 7)]
        read = gateway_reader(stub, ref, ())
        # A read from inside a stored body to past the end: the rows asked for, no more.
        assert (await read(0, 1_500, 2_000))[0] == 2_000
        assert (await read(0, 4_500, 2_000))[0] == 500
        assert (await read(0, 5_000, 2_000))[0] == 0
        # The Flight edge reads the same stored bodies (decoded, cut at the edges).
        flight = FlightReader(flight_port, ref, ())
        try:
            assert (await flight.read(0, 1_500, 2_000))[0] == 2_000
            assert (await flight.read(0, 4_500, 2_000))[0] == 500
            assert (await flight.read(0, 5_000, 2_000))[0] == 0
            assert (await flight.read(1, 0, 100))[0] == 7
        finally:
            flight.close()
        info = await stub.DescribeTable(pb.DescribeTableRequest(table=ref))
        assert [p.high_watermark for p in info.partition_info] == [5_000, 7]

        # A follower gets each stored body as it is appended.
        follow = stub.Read(pb.ReadRequest(table=ref, partition=1, offset=7, follow=True))
        await stub.Append(
            pb.AppendRequest(table=ref, arrow_ipc=BatchFactory(3, 100).ipc(2), partition=1)
        )
        msg = await asyncio.wait_for(follow.read(), 10)
        assert msg.high_watermark == 10 and msg.arrow_ipc
        follow.cancel()
        await stub.DropTable(pb.DropTableRequest(table=ref))


@pytest.mark.parametrize("store", ["disk", "redis"])
def test_the_pass_through_serves_the_benchmark_clients(
    store: str, tmp_path: Path, redis_server: RedisServer
) -> None:
    edge = PassThroughProcess(store, tmp_path / "pt", redis_server.url if store == "redis" else "")
    edge.start()
    try:
        asyncio.run(_append_and_read(edge.grpc_target, edge.flight_port))
    finally:
        edge.stop()


def _row(system: str, records_per_s: float) -> dict[str, object]:
    return {
        "workload": "append-1mib",
        "system": system,
        "records_per_s": records_per_s,
        "mb_per_s": records_per_s / 1000,
        "batches_per_s": 1.0,
        "errors": 0,
        "ack_latency": None,
        "e2e_latency": None,
    }


def test_a_tidegate_row_has_its_ratio_to_the_pass_through(tmp_path: Path) -> None:
    raw = _row("redis-py XADD (baseline)", 1000.0)
    through = compare(_row(passthrough_system("redis"), 500.0), [raw])
    ours = compare(_row("tidegate (redis hot tier)", 400.0), [raw, through])
    machine = dict.fromkeys(("cpu", "cores", "memory_gib", "os", "python", "commit", "date"))
    doc = {"mode": "smoke", "machine": machine, "elapsed_s": 1, "results": [raw, through, ours]}
    write_report(doc, tmp_path)
    lines = (tmp_path / "summary.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| workload"))
    cells = {
        row.split(" | ")[1]: dict(zip(header.split(" | "), row.split(" | "), strict=True))
        for row in lines
        if row.startswith("| append-1mib")
    }
    assert cells["tidegate (redis hot tier)"]["ratio to baseline"] == "0.40x redis-py XADD"
    assert cells["tidegate (redis hot tier)"]["ratio to pass-through"] == (
        "0.80x pass-through gRPC edge, Redis XADD/XRANGE"
    )
    # The pass-through's own row: the edge's cost against the raw store.
    assert cells[passthrough_system("redis")]["ratio to baseline"] == "0.50x redis-py XADD"
    assert cells[passthrough_system("redis")]["ratio to pass-through"] == "-"


def test_the_pass_through_reads_registered_parquet_files(tmp_path: Path) -> None:
    """Cold reads and scans over both edges: pyarrow on the files named, nothing else."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.scenarios import FlightReader

    for k in range(2):
        rows = pa.array(range(k * 100, k * 100 + 100), pa.int64())
        pq.write_table(pa.table({"x": rows, "_offset": rows}), tmp_path / f"{k}.parquet")
    files = [(k * 100, k * 100 + 99, str(tmp_path / f"{k}.parquet")) for k in range(2)]
    edge = PassThroughProcess("disk", tmp_path / "pt").start()
    ref = pb.TableRef(namespace="n", name="cold")

    async def grpc_reads() -> tuple[tuple[int, int], int]:
        async with grpc.aio.insecure_channel(edge.grpc_target, options=CHANNEL_OPTIONS) as ch:
            stub = pb_grpc.TidegateStub(ch)
            read = await gateway_reader(stub, ref, ())(0, 90, 20)
            scanned = 0
            async for msg in stub.Scan(pb.ScanRequest(table=ref)):
                scanned += pa.ipc.open_stream(msg.arrow_ipc).read_all().num_rows
            return read, scanned

    try:
        edge.register(ref, files)
        (n, _), scanned = asyncio.run(grpc_reads())
        assert (n, scanned) == (20, 200)
        flight = FlightReader(edge.flight_port, ref, ())
        assert asyncio.run(flight.read(0, 150, 100))[0] == 50
        assert asyncio.run(flight.scan(0, 0))[0] == 200
        flight.close()
    finally:
        edge.stop()


async def _concurrent_appends(target: str) -> list[tuple[int, int]]:
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as ch:
        stub = pb_grpc.TidegateStub(ch)
        ref = await create_table(stub, "ptsync", 1, ())
        factory = BatchFactory(10, 100)
        answers = await asyncio.gather(
            *(
                stub.Append(pb.AppendRequest(table=ref, arrow_ipc=factory.ipc(i), partition=0))
                for i in range(40)
            )
        )
        read = gateway_reader(stub, ref, ())
        assert (await read(0, 0, 1_000))[0] == 400
        return sorted((r.base_offset, r.count) for a in answers for r in a.ranges)


def test_the_disk_pass_through_gives_appends_awaiting_one_fsync_their_own_offsets(
    tmp_path: Path,
) -> None:
    """Appends in flight together (made durable by one fsync, as the disk hot tier's group
    commit does) each get their own offsets, and every body is read back."""
    edge = PassThroughProcess("disk", tmp_path / "pt").start()
    try:
        ranges = asyncio.run(_concurrent_appends(edge.grpc_target))
    finally:
        edge.stop()
    assert ranges == [(10 * i, 10) for i in range(40)]
