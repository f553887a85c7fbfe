"""The pass-through baseline (issue 43, item 1): Tidegate's gRPC edge (a grpc.aio server
of the same service, answered by the same client stubs) with no Tidegate logic behind it.

No auth, no validation, no routing, no metadata store: an ``Append`` counts the rows of
the client's Arrow IPC body (a log must give offsets) and stores the body as it came, a
``Read`` answers the stored bodies as ``hot_batches`` (what the gateway sends with
``raw_hot``), so the client decodes the same bytes on both sides; its Flight edge's
``DoGet`` answers the same bodies decoded, cut at the range's edges, as one table that
Arrow's C++ sends (:meth:`PassThrough.hot_read`). The raw stores are the
hot tiers': a Redis stream per partition (``MULTI`` of ``INCRBY`` for the offsets and
``XADD``, one round trip; ``XRANGE`` to read) or a file per partition (``os.write``,
then an fsync before the answer, as the disk hot tier's default ``fsync="batch"`` does
before it acknowledges: one fsync in flight per partition on a thread, appends written
meanwhile made durable together by the next one, a group commit; ``os.pread`` to read).
Offsets map to entries in this process's memory. A benchmark row of Tidegate divided
by this row is what Tidegate's own code costs; this row divided by the raw store's is
what the edge (grpcio's Python layer, protobuf, the event loop) costs.

Run as a process of its own, as the gateway is: ``python -m benchmarks.passthrough
--store redis --redis-url URL --dir DIR --grpc-port N``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.dataset as ds  # loaded at start, as the gateway has them: not in a first read
import pyarrow.parquet as pq

from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc

#: The gateway's own message bounds (``gateway/server/grpc_server.py``), so a body the
#: gateway takes is taken here.
_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]
_SYSTEM = [
    pa.field("_partition", pa.int32(), nullable=False),
    pa.field("_offset", pa.int64(), nullable=False),
    pa.field("_timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
]
#: Records per Read answer when the request says 0 (the gateway's default is alike).
_DEFAULT_RECORDS = 10_000


def _rows(body: bytes) -> int:
    return sum(b.num_rows for b in pa.ipc.open_stream(pa.py_buffer(body)))


@dataclass
class _Partition:
    """Where each stored body of one partition is: its first offset, rows, append time
    and locator (a Redis entry id, or a file position and length)."""

    bases: list[int] = field(default_factory=list)
    entries: list[tuple[int, int, Any]] = field(default_factory=list)  # (rows, ts_us, loc)
    end: int = 0  # the first offset not stored contiguously from 0
    grew: asyncio.Event = field(default_factory=asyncio.Event)
    fd: int = -1
    #: Bytes written to ``fd``, and how many of them are fsynced (the disk store's).
    written: int = 0
    durable: int = 0
    tail: int = 0  # the next offset the disk store assigns
    flush: asyncio.Future[None] | None = None

    async def sync(self, upto: int) -> None:
        """Return once the first ``upto`` bytes of the file are fsynced: one fsync in
        flight at a time, each covering every write made before it started."""
        while self.durable < upto:
            if self.flush is None:
                self.flush = asyncio.ensure_future(self._fsync())
            await asyncio.shield(self.flush)

    async def _fsync(self) -> None:
        end = self.written
        try:
            await asyncio.to_thread(os.fsync, self.fd)
            self.durable = max(self.durable, end)
        finally:
            self.flush = None

    def add(self, base: int, rows: int, ts_us: int, loc: Any) -> None:
        i = bisect.bisect_left(self.bases, base)
        self.bases.insert(i, base)
        self.entries.insert(i, (rows, ts_us, loc))
        # Answers may complete out of order: serve only the contiguous prefix.
        j = bisect.bisect_left(self.bases, self.end)
        while j < len(self.bases) and self.bases[j] == self.end:
            self.end += self.entries[j][0]
            j += 1
        self.grew.set()
        self.grew = asyncio.Event()

    def span(self, offset: int, max_records: int) -> tuple[int, int]:
        """The entries ``[i, j)`` holding ``max_records`` rows from ``offset``."""
        i = max(0, bisect.bisect_right(self.bases, offset) - 1)
        if i < len(self.bases) and self.bases[i] + self.entries[i][0] <= offset:
            i += 1  # the entry before ends below ``offset``
        j, n = i, 0
        while j < len(self.bases) and self.bases[j] < self.end and n < max_records:
            n += self.bases[j] + self.entries[j][0] - max(offset, self.bases[j])
            j += 1
        return i, j


@dataclass
class _Table:
    schema_ipc: bytes
    partitions: list[_Partition]
    key: str


#: Tables of Parquet files (the cold reads' store), by (namespace, name): each file's
#: first and last ``_offset`` and path, registered by the benchmark (``register`` action
#: of the Flight edge), shared by both edges.
COLD: dict[tuple[str, str], list[tuple[int, int, str]]] = {}


def cold_read(files: list[tuple[int, int, str]], start: int, end: int) -> pa.Table:
    """Records ``[start, end)`` of a cold table, pyarrow on just the files holding them
    (what the benchmark's own pyarrow baseline does)."""
    parts = [
        pq.read_table(path, filters=[("_offset", ">=", start), ("_offset", "<", end)])
        for lo, hi, path in files
        if lo < end and hi >= start
    ]
    return pa.concat_tables(parts) if parts else pa.table({})


def cold_scan(files: list[tuple[int, int, str]]) -> pa.Table:
    return ds.dataset([f[2] for f in files]).to_table()


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


class PassThrough(pb_grpc.TidegateServicer):  # type: ignore[misc]
    """The gRPC service's data calls over a raw store, and the table calls the benchmark
    clients make around them (kept in memory)."""

    def __init__(self, store: str, redis_url: str, folder: Path) -> None:
        self.store = store
        self.folder = folder
        self.tables: dict[tuple[str, str], _Table] = {}
        self.redis: Any = None
        self.redis_url = redis_url
        #: The Flight edge's client (its calls run on Flight's threads, not the loop).
        self._sync_redis: Any = None
        if store == "redis":
            import redis.asyncio as aioredis

            self.redis = aioredis.from_url(redis_url, max_connections=256)

    # Tables ------------------------------------------------------------------------------
    def _info(self, ref: pb.TableRef, t: _Table) -> pb.TableInfo:
        return pb.TableInfo(
            table=ref,
            partitions=len(t.partitions),
            partition_info=[
                pb.PartitionInfo(partition=i, high_watermark=p.end)
                for i, p in enumerate(t.partitions)
            ],
        )

    async def CreateTable(self, request: Any, context: Any) -> pb.TableInfo:
        user = [pa.field(f.name, pa.type_for_alias(f.type), f.nullable) for f in request.fields]
        sink = pa.BufferOutputStream()
        pa.ipc.new_stream(sink, pa.schema(user + _SYSTEM)).close()
        key = f"pt:{request.table.namespace}.{request.table.name}"
        t = _Table(sink.getvalue().to_pybytes(), [], key)
        for i in range(max(1, request.partitions)):
            p = _Partition()
            if self.store == "disk":
                self.folder.mkdir(parents=True, exist_ok=True)
                path = self.folder / f"{key}-{i}.log"
                p.fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_APPEND | os.O_TRUNC, 0o644)
            t.partitions.append(p)
        self.tables[(request.table.namespace, request.table.name)] = t
        return self._info(request.table, t)

    async def DescribeTable(self, request: Any, context: Any) -> pb.TableInfo:
        return self._info(request.table, self.tables[(request.table.namespace, request.table.name)])

    async def DropTable(self, request: Any, context: Any) -> pb.DropTableResponse:
        t = self.tables.pop((request.table.namespace, request.table.name), None)
        if t is not None:
            for p in t.partitions:
                if p.fd >= 0:
                    os.close(p.fd)
            if self.redis is not None:
                keys = [f"{t.key}:{i}" for i in range(len(t.partitions))]
                await self.redis.delete(*keys, *(f"{k}:n" for k in keys))
        return pb.DropTableResponse()

    # Data ----------------------------------------------------------------------------------
    async def Append(self, request: Any, context: Any) -> pb.AppendResponse:
        t = self.tables[(request.table.namespace, request.table.name)]
        partition = request.partition if request.HasField("partition") else 0
        p = t.partitions[partition]
        body = request.arrow_ipc
        rows = _rows(body)
        ts_us = time.time_ns() // 1000
        if self.redis is not None:
            key = f"{t.key}:{partition}"
            async with self.redis.pipeline(transaction=True) as tx:
                tx.incrby(f"{key}:n", rows)
                tx.xadd(key, {"d": body})
                end, entry_id = await tx.execute()
            base, loc = end - rows, entry_id
        else:
            # The offsets are taken before the wait, so that appends awaiting the same
            # fsync take the next ones; readers see them once durable, as the gateway's.
            base, p.tail = p.tail, p.tail + rows
            loc = (p.written, len(body))
            os.write(p.fd, body)
            p.written += len(body)
            await p.sync(p.written)
        p.add(base, rows, ts_us, loc)
        return pb.AppendResponse(
            ranges=[pb.AppendRange(partition=partition, base_offset=base, count=rows)]
        )

    def hot_read(self, namespace: str, name: str, partition: int, offset: int,
                 max_records: int) -> pa.Table:  # fmt: skip
        """The Flight edge's read of a hot table, on its own thread: the stored bodies
        holding ``max_records`` rows from ``offset``, read from the raw store, decoded
        and cut at the range's edges (the columns as stored: no system columns)."""
        t = self.tables[(namespace, name)]
        p = t.partitions[partition]
        i, j = p.span(offset, max_records)
        bodies: list[bytes] = []
        if self.store == "redis" and i < j:
            if self._sync_redis is None:
                import redis

                self._sync_redis = redis.Redis.from_url(self.redis_url)
            first = p.entries[i][2]
            got = self._sync_redis.xrange(f"{t.key}:{partition}", min=first, count=j - i)
            bodies = [fields[b"d"] for _, fields in got]
        elif self.store == "disk":
            bodies = [os.pread(p.fd, n, pos) for _, _, (pos, n) in p.entries[i:j]]
        parts, want = [], max_records
        for k, body in zip(range(i, j), bodies, strict=True):
            base, rows = p.bases[k], p.entries[k][0]
            skip = max(0, offset - base)
            count = min(rows - skip, want)
            parts.append(pa.ipc.open_stream(pa.py_buffer(body)).read_all().slice(skip, count))
            offset, want = base + skip + count, want - count
        if not parts:  # at the end: no rows, in the table's columns
            stored = pa.ipc.open_stream(pa.py_buffer(t.schema_ipc)).schema
            return pa.schema([f for f in stored if f not in _SYSTEM]).empty_table()
        return pa.concat_tables(parts)

    async def _bodies(self, t: _Table, partition: int, i: int, j: int) -> list[bytes]:
        p = t.partitions[partition]
        if self.redis is not None:
            first = p.entries[i][2]
            got = await self.redis.xrange(f"{t.key}:{partition}", min=first, count=j - i)
            return [fields[b"d"] for _, fields in got]
        return [os.pread(p.fd, n, pos) for _, _, (pos, n) in p.entries[i:j]]

    async def Scan(self, request: Any, context: Any) -> AsyncIterator[pb.ScanResponse]:
        """A cold table's files read whole on a thread, sent in IPC chunks of about
        4 MiB (the gateway's gRPC scan chunk)."""
        files = COLD[(request.table.namespace, request.table.name)]
        table = await asyncio.to_thread(cold_scan, files)
        rows = max(1, (4 << 20) * max(1, table.num_rows) // max(1, table.nbytes))
        for at in range(0, max(1, table.num_rows), rows):
            yield pb.ScanResponse(arrow_ipc=await asyncio.to_thread(_ipc, table.slice(at, rows)))

    async def Read(self, request: Any, context: Any) -> AsyncIterator[pb.ReadResponse]:
        files = COLD.get((request.table.namespace, request.table.name))
        if files is not None:  # a cold table: pyarrow on its files, encoded as the gateway does
            end = request.offset + (request.max_records or _DEFAULT_RECORDS)
            table = await asyncio.to_thread(cold_read, files, request.offset, end)
            body = await asyncio.to_thread(_ipc, table)
            yield pb.ReadResponse(arrow_ipc=body, next_offset=request.offset + table.num_rows)
            return
        t = self.tables[(request.table.namespace, request.table.name)]
        p = t.partitions[request.partition]
        offset = request.offset
        limit = request.max_records or (0 if request.follow else _DEFAULT_RECORDS)
        while True:
            want = limit or _DEFAULT_RECORDS
            i, j = p.span(offset, want)
            if i == j:
                if not request.follow:
                    yield pb.ReadResponse(next_offset=offset, high_watermark=p.end)
                    return
                await p.grew.wait()
                continue
            bodies = await self._bodies(t, request.partition, i, j)
            if not request.raw_hot:
                # The bodies as stored, one answer each (whole: no slicing, no system
                # columns); what a follower of the append workloads reads.
                for body in bodies:
                    yield pb.ReadResponse(arrow_ipc=body, high_watermark=p.end)
                offset = p.bases[j - 1] + p.entries[j - 1][0]
                if request.follow:
                    continue
                return
            hot = []
            for k, body in zip(range(i, j), bodies, strict=True):
                base, (rows, ts_us, _) = p.bases[k], p.entries[k]
                skip = max(0, offset - base)
                count = min(rows - skip, want)
                hot.append(
                    pb.HotBatch(
                        arrow_ipc=body, base_offset=base, timestamp_us=ts_us, skip=skip,
                        count=count,
                    )
                )  # fmt: skip
                offset, want = base + skip + count, want - count
            yield pb.ReadResponse(
                arrow_ipc=t.schema_ipc, next_offset=offset, high_watermark=p.end, hot_batches=hot
            )
            if not request.follow:
                return
            if limit:
                limit -= sum(h.count for h in hot)
                if limit <= 0:
                    return


def flight_server(port: int, hot: PassThrough | None = None) -> Any:
    """Tidegate's Flight edge with no Tidegate logic: ``DoGet`` of the gateway's JSON
    tickets (``read``, ``scan``) over a cold table's files, or a ``read`` of a hot
    table of ``hot`` (:meth:`PassThrough.hot_read`), handed to Flight as whole tables
    (Arrow's C++ sends them); the ``register`` action names a table's files."""
    import json

    import pyarrow.flight as fl

    class Edge(fl.FlightServerBase):  # type: ignore[misc]
        def do_action(self, context: Any, action: Any) -> list[Any]:
            doc = json.loads(action.body.to_pybytes())
            COLD[(doc["namespace"], doc["name"])] = [tuple(f) for f in doc["files"]]
            return []

        def do_get(self, context: Any, ticket: Any) -> Any:
            doc = json.loads(ticket.ticket)
            if "scan" in doc:
                where = doc["scan"]
                table = cold_scan(COLD[(where["namespace"], where["name"])])
            else:
                where = doc["read"]
                start = where["offset"]
                records = where.get("max_records") or _DEFAULT_RECORDS
                ref = (where["namespace"], where["name"])
                if ref not in COLD and hot is not None:
                    table = hot.hot_read(*ref, where.get("partition", 0), start, records)
                else:
                    table = cold_read(COLD[ref], start, start + records)
            return fl.RecordBatchStream(table)

    return Edge(f"grpc+tcp://127.0.0.1:{port}")


async def serve(service: PassThrough, port: int) -> None:
    server = grpc.aio.server(options=_OPTIONS)
    pb_grpc.add_TidegateServicer_to_server(service, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)


class PassThroughProcess:
    """``python -m benchmarks.passthrough`` as a process of its own, on a free port."""

    def __init__(self, store: str, folder: Path, redis_url: str = "") -> None:
        from tests.services import free_port

        self.store, self.folder, self.redis_url = store, folder, redis_url
        self.grpc_port = free_port()
        self.flight_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> PassThroughProcess:
        from tests.services import REPO_ROOT, wait_for_port

        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "passthrough.log", "ab") as log:  # the child keeps its copy
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "benchmarks.passthrough", "--store", self.store,
                    "--redis-url", self.redis_url, "--dir", str(self.folder),
                    "--grpc-port", str(self.grpc_port), "--flight-port", str(self.flight_port),
                ],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
            )  # fmt: skip
        wait_for_port(self.grpc_port, proc=self.proc)
        wait_for_port(self.flight_port, proc=self.proc)
        return self

    def register(self, ref: Any, files: list[tuple[int, int, str]]) -> None:
        """Name the Parquet files (first and last offset, path) of the cold table ``ref``."""
        import json

        import pyarrow.flight as fl

        body = {"namespace": ref.namespace, "name": ref.name, "files": files}
        with fl.connect(f"grpc+tcp://127.0.0.1:{self.flight_port}") as client:
            list(client.do_action(fl.Action("register", json.dumps(body).encode())))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.passthrough", description=__doc__)
    parser.add_argument("--store", choices=["redis", "disk"], required=True)
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--flight-port", type=int, default=0)
    ns = parser.parse_args()
    service = PassThrough(ns.store, ns.redis_url, ns.dir)
    if ns.flight_port:
        import threading

        edge = flight_server(ns.flight_port, service)
        threading.Thread(target=edge.serve, name="flight", daemon=True).start()
    asyncio.run(serve(service, ns.grpc_port))


if __name__ == "__main__":
    main()
