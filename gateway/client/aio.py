"""The asyncio client: the twin of :mod:`gateway.client._sync` on ``grpc.aio``.

Same methods, same producer and consumer behaviour (both drive the I/O-free modules of
the package: ``_batching``, ``_producer``, ``_reading``), with ``async`` methods, awaitable
sends and ``async for`` iteration::

    async with AsyncClient("127.0.0.1:50051") as c:
        async with c.producer("shop.events") as p:
            fut = await p.send({"kind": "view", "n": 1})
        print(await fut)  # RecordMetadata(partition=0, offset=0)
        async with c.consumer("shop.events", follow=False) as consumer:
            async for record in consumer:
                print(record)
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

import grpc
import grpc.aio
import pyarrow as pa

from gateway.client._arrow import decode, ipc
from gateway.client._batching import Delivery, ProducerConfig
from gateway.client._channel import (
    call_metadata,
    channel_credentials,
    channel_options,
    normalise_target,
)
from gateway.client._producer import ProducerCore
from gateway.client._reading import mark_consumed, scan_request, scan_table, start_positions
from gateway.client._types import (
    AppendRange,
    RecordMetadata,
    StartAt,
    TableInfo,
    TableRef,
    ranges_from_pb,
    table_fields,
    timestamp_us,
)
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.codec import Compression
from gateway.wire.errors import Throttled, TidegateError, Unavailable
from gateway.wire.retry import Retry
from gateway.wire.status import error_from_rpc

__all__ = ["AsyncClient", "AsyncConsumer", "AsyncProducer", "Client", "Consumer", "Producer"]

DEFAULT_CALL_RETRY = Retry(timeout=30.0)


class AsyncClient:
    """A connection to one gateway over ``grpc.aio``; see :class:`gateway.client.Client`
    for the arguments. Create it inside the event loop that uses it."""

    def __init__(
        self,
        endpoint: str,
        *,
        api_key: str | None = None,
        tls: bool | None = None,
        root_certificates: bytes | None = None,
        timeout: float = 30.0,
        retry: Retry = DEFAULT_CALL_RETRY,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        target, scheme_tls = normalise_target(endpoint)
        self.timeout = timeout
        self.retry = retry
        self.metadata = call_metadata(api_key)
        creds = channel_credentials(tls if tls is not None else scheme_tls, root_certificates)
        opts = channel_options(options)
        self._channel = (
            grpc.aio.insecure_channel(target, options=opts)
            if creds is None
            else grpc.aio.secure_channel(target, creds, options=opts)
        )
        self._stub = pb_grpc.TidegateStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    @property
    def stub(self) -> pb_grpc.TidegateStub:
        return self._stub

    async def _call(self, method: str, request: Any, *, idempotent: bool = False) -> Any:
        started = time.monotonic()
        failures = 0
        while True:
            try:
                return await getattr(self._stub, method)(
                    request, timeout=self.timeout, metadata=self.metadata
                )
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                failures += 1
                delay = self.retry.next_delay(err, failures, started) if idempotent else None
                if delay is None:
                    raise err from None
                await asyncio.sleep(delay)

    # Tables ----------------------------------------------------------------------------
    async def create_table(
        self,
        table: str | TableRef,
        schema: Mapping[str, str] | Sequence[Mapping[str, Any]],
        *,
        partitions: int = 1,
        key_columns: Sequence[str] = (),
    ) -> pb.TableInfo:
        request = pb.CreateTableRequest(
            table=TableRef.parse(table).pb(),
            fields=table_fields(schema),
            partitions=partitions,
            key_columns=list(key_columns),
        )
        return cast(pb.TableInfo, await self._call("CreateTable", request))

    async def describe_table(self, table: str | TableRef) -> pb.TableInfo:
        request = pb.DescribeTableRequest(table=TableRef.parse(table).pb())
        return cast(pb.TableInfo, await self._call("DescribeTable", request, idempotent=True))

    async def table_info(self, table: str | TableRef) -> TableInfo:
        return TableInfo.from_pb(await self.describe_table(table))

    async def list_tables(self, namespace: str = "") -> list[pb.TableInfo]:
        response = await self._call(
            "ListTables", pb.ListTablesRequest(namespace=namespace), idempotent=True
        )
        return list(response.tables)

    async def drop_table(self, table: str | TableRef) -> None:
        await self._call("DropTable", pb.DropTableRequest(table=TableRef.parse(table).pb()))

    # Tenants, keys and quotas arrive with the tenancy API (see the sync client).

    # Writes ----------------------------------------------------------------------------
    async def append_ipc(
        self,
        table: str | TableRef,
        arrow_ipc: bytes,
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[AppendRange]:
        request = pb.AppendRequest(
            table=TableRef.parse(table).pb(),
            arrow_ipc=arrow_ipc,
            partition=partition,
            producer_id=producer_id or "",
            sequence=sequence,
        )
        return ranges_from_pb(await self._call("Append", request))

    async def append(
        self,
        table: str | TableRef,
        rows: Any,
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
        compression: Compression = "none",
    ) -> list[AppendRange]:
        return await self.append_ipc(
            table,
            ipc(rows, compression),
            partition=partition,
            producer_id=producer_id,
            sequence=sequence,
        )

    def producer(self, table: str | TableRef, **config: Any) -> AsyncProducer:
        """An :class:`AsyncProducer` for ``table`` (it starts on ``async with`` or the first
        send)."""
        return AsyncProducer(self, table, **config)

    # Reads -----------------------------------------------------------------------------
    async def read_batches(
        self,
        table: str | TableRef,
        *,
        partition: int,
        offset: int,
        max_records: int = 0,
        max_bytes: int = 0,
        follow: bool = False,
        timeout: float | None = None,
    ) -> AsyncIterator[tuple[list[pa.RecordBatch], int, int]]:
        request = pb.ReadRequest(
            table=TableRef.parse(table).pb(),
            partition=partition,
            offset=offset,
            max_records=max_records,
            max_bytes=max_bytes,
            follow=follow,
        )
        call = self._stub.Read(
            request,
            timeout=timeout if follow else (timeout or self.timeout),
            metadata=self.metadata,
        )
        try:
            async for msg in call:
                yield decode(msg.arrow_ipc), msg.next_offset, msg.high_watermark
        except grpc.RpcError as exc:
            if follow and cast(grpc.Call, exc).code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            raise error_from_rpc(exc) from None
        finally:
            call.cancel()

    async def read(
        self,
        table: str | TableRef,
        *,
        partition: int,
        offset: int,
        max_records: int = 0,
        max_bytes: int = 0,
    ) -> pa.Table:
        batches: list[pa.RecordBatch] = []
        async for chunk, _, _ in self.read_batches(
            table, partition=partition, offset=offset, max_records=max_records, max_bytes=max_bytes
        ):
            batches.extend(chunk)
        if not batches:
            return pa.table({})
        return pa.Table.from_batches(batches)

    async def _read_once(
        self, ref: TableRef, partition: int, offset: int, max_records: int
    ) -> tuple[list[pa.RecordBatch], int]:
        started = time.monotonic()
        failures = 0
        while True:
            try:
                out: list[pa.RecordBatch] = []
                nxt = offset
                async for chunk, next_offset, _ in self.read_batches(
                    ref, partition=partition, offset=offset, max_records=max_records
                ):
                    out.extend(b for b in chunk if b.num_rows)
                    nxt = max(nxt, next_offset)
                return out, nxt
            except TidegateError as err:
                failures += 1
                delay = self.retry.next_delay(err, failures, started)
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    def consumer(self, table: str | TableRef, **options: Any) -> AsyncConsumer:
        """An :class:`AsyncConsumer` of ``table`` (it starts on ``async with`` or the first
        read)."""
        return AsyncConsumer(self, table, **options)

    # Offsets ---------------------------------------------------------------------------
    async def scan_batches(
        self,
        table: str | TableRef,
        *,
        columns: Sequence[str] = (),
        filter: str = "",
        as_of: int | str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[pa.RecordBatch]:
        """Batches of the whole table; see :meth:`gateway.client.Client.scan_batches`."""
        request = scan_request(table, columns, filter, as_of, limit)
        try:
            async for msg in self._stub.Scan(request, timeout=self.timeout, metadata=self.metadata):
                for batch in pa.ipc.open_stream(msg.arrow_ipc):
                    yield batch
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    async def scan(
        self,
        table: str | TableRef,
        *,
        columns: Sequence[str] = (),
        filter: str = "",
        as_of: int | str | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """The whole table as one ``pyarrow.Table``; see :meth:`Client.scan`."""
        request = scan_request(table, columns, filter, as_of, limit)
        try:
            messages = [
                m
                async for m in self._stub.Scan(
                    request, timeout=self.timeout, metadata=self.metadata
                )
            ]
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return scan_table(messages)

    async def plan_read(
        self, table: str | TableRef, *, filter: str = "", as_of: int | str | None = None
    ) -> pb.PlanReadResponse:
        """A read plan; see :meth:`gateway.client.Client.plan_read`."""
        request = pb.PlanReadRequest(
            table=TableRef.parse(table).pb(),
            filter=filter,
            as_of="" if as_of is None else str(as_of),
        )
        return cast(pb.PlanReadResponse, await self._call("PlanRead", request, idempotent=True))

    async def offsets_for_times(
        self,
        table: str | TableRef,
        when: dt.datetime | float,
        partitions: Sequence[int] | None = None,
    ) -> dict[int, int]:
        request = pb.OffsetsForTimesRequest(
            table=TableRef.parse(table).pb(),
            timestamp_us=timestamp_us(when),
            partitions=list(partitions or ()),
        )
        response = await self._call("OffsetsForTimes", request, idempotent=True)
        return {o.partition: o.offset for o in response.offsets}

    async def commit_offsets(
        self, group: str, table: str | TableRef, offsets: Mapping[int, int]
    ) -> None:
        request = pb.CommitOffsetsRequest(
            group=group,
            table=TableRef.parse(table).pb(),
            offsets=[pb.PartitionOffset(partition=p, offset=o) for p, o in offsets.items()],
        )
        await self._call("CommitOffsets", request, idempotent=True)

    async def fetch_offsets(
        self, group: str, table: str | TableRef, partitions: Sequence[int] | None = None
    ) -> dict[int, int]:
        request = pb.FetchOffsetsRequest(
            group=group, table=TableRef.parse(table).pb(), partitions=list(partitions or ())
        )
        response = await self._call("FetchOffsets", request, idempotent=True)
        return {o.partition: o.offset for o in response.offsets}


# --------------------------------------------------------------------------------------
# Producer
# --------------------------------------------------------------------------------------
class AsyncProducer:
    """The asyncio twin of :class:`gateway.client.Producer`.

    ``await producer.send(rows)`` buffers the rows (waiting while the buffer is full) and
    returns an awaitable (an ``asyncio.Future``) resolving to :class:`RecordMetadata`, or a
    list of them, once the gateway stored the rows. Get one with
    ``client.producer(table, ...)``, best as ``async with client.producer(...) as p``.
    """

    def __init__(
        self,
        client: AsyncClient,
        table: str | TableRef,
        *,
        max_block: float = 60.0,
        **config: Any,
    ) -> None:
        self.client = client
        self._table_name = table
        self.config = ProducerConfig(**config)
        self.max_block = max_block
        self._core: ProducerCore | None = None
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._closed = False
        self._flushing = 0
        self._task: asyncio.Task[None] | None = None
        self._call: Any = None
        self._requests: asyncio.Queue[pb.AppendStreamRequest | None] | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Look the table up and start the sender (idempotent)."""
        if self._core is not None:
            return
        self.table = await self.client.table_info(self._table_name)
        self._core = ProducerCore(self.table, self.config)
        self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def core(self) -> ProducerCore:
        if self._core is None:
            raise RuntimeError("the producer is not started")
        return self._core

    @property
    def retries(self) -> int:
        """Batches resent so far after retryable failures."""
        return self.core.retries

    @property
    def producer_id(self) -> str | None:
        return self.core.producer_id

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _notify(self) -> None:
        self._wake.set()

    def _progressed(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    async def send(
        self, data: Any, *, partition: int | None = None
    ) -> asyncio.Future[RecordMetadata | list[RecordMetadata]]:
        """Buffer rows; returns a future resolving once the gateway stored them."""
        await self.start()
        core = self.core
        if self._closed:
            raise RuntimeError("the producer is closed")
        deadline = time.monotonic() + self.max_block
        while core.unfinished >= self.config.buffer_records:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Throttled(
                    f"the producer buffer stayed full ({self.config.buffer_records} records) "
                    f"for {self.max_block}s",
                    retry_after_ms=100,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), left)
        future: asyncio.Future[RecordMetadata | list[RecordMetadata]] = (
            asyncio.get_running_loop().create_future()
        )
        delivery = core.add(data, partition)
        delivery.future = future
        if delivery.done:
            future.set_result(delivery.result())
        self._notify()
        return future

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered and wait until it is acknowledged (or failed)."""
        core = self.core
        self._flushing += 1
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not core.idle():
                self._notify()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("flush timed out")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._progress.wait(), min(left or 0.5, 0.5))
        finally:
            self._flushing -= 1

    async def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._core is not None:
                await self.flush(timeout)
        finally:
            if self._core is not None:
                _resolve(self._core.fail_all(RuntimeError("the producer was closed")))
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            await self._close_stream()

    async def _close_stream(self) -> None:
        if self._requests is not None:
            self._requests.put_nowait(None)
            self._requests = None
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
        self._reader = None
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def _open_stream(self) -> None:
        await self._close_stream()
        gen = self.core.stream_opened()
        requests: asyncio.Queue[pb.AppendStreamRequest | None] = asyncio.Queue()

        async def outgoing() -> AsyncIterator[pb.AppendStreamRequest]:
            # grpc consumes this iterator and stops by itself when the call ends, so a
            # request never races the server's final status (call.write() could, and then
            # the status, with its retry-after hint, was lost to an INTERNAL).
            while (request := await requests.get()) is not None:
                yield request

        call = self.client.stub.AppendStream(outgoing(), metadata=self.client.metadata)
        self._requests, self._call = requests, call
        self._reader = asyncio.get_running_loop().create_task(self._read_responses(call, gen))

    async def _read_responses(self, call: Any, gen: int) -> None:
        core = self.core
        err: BaseException
        try:
            async for resp in call:
                _resolve(core.on_response(gen, resp))
                self._progressed()
                self._notify()
            # The stream ended without an error status: the gateway went away cleanly.
            err = Unavailable("the append stream ended")
        except grpc.RpcError as exc:
            err = error_from_rpc(exc)
        _resolve(core.on_stream_error(gen, err))
        self._progressed()
        self._notify()

    async def _run(self) -> None:
        core = self.core
        while True:
            now = time.monotonic()
            force = self._flushing > 0 or self._closed
            if core.needs_stream(now, force):
                try:
                    await self._open_stream()
                except Exception as exc:  # pragma: no cover - channel closed under us
                    _resolve(core.fail_all(exc))
                    self._progressed()
                    continue
            requests = core.outgoing(now, force)
            rejected = core.take_rejected()
            if rejected:
                _resolve(rejected)
                self._progressed()
            if requests and self._requests is not None:
                for r in requests:
                    self._requests.put_nowait(r)
                continue
            wake = core.next_wakeup(now)
            self._wake.clear()
            timeout = None if wake is None else max(0.0, wake - now) + 0.0005
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)


def _resolve(deliveries: list[Delivery]) -> None:
    for d in deliveries:
        fut = d.future
        if fut is None or fut.done():
            continue
        if d.error is not None:
            fut.set_exception(d.error)
        else:
            fut.set_result(d.result())


# --------------------------------------------------------------------------------------
# Consumer
# --------------------------------------------------------------------------------------
class AsyncConsumer:
    """The asyncio twin of :class:`gateway.client.Consumer`: ``async for`` records, or
    ``async for`` over :meth:`batches`. Get one with ``client.consumer(table, ...)``.
    """

    def __init__(
        self,
        client: AsyncClient,
        table: str | TableRef,
        *,
        group: str | None = None,
        partitions: Sequence[int] | None = None,
        start: StartAt = "earliest",
        follow: bool = True,
        auto_commit_interval: float | None = 5.0,
        max_records: int = 10_000,
        poll_interval: float = 0.1,
    ) -> None:
        self.client = client
        self._table_name = table
        self._started = False
        self.group = group
        self._partitions = partitions
        self._start = start
        self.follow = follow
        self.auto_commit_interval = auto_commit_interval
        self.max_records = max_records
        self.poll_interval = poll_interval
        self.positions: dict[int, int] = {}
        self.consumed: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._last_commit = time.monotonic()
        self._next = 0

    async def start(self) -> None:
        """Look the table and the group's commits up (idempotent)."""
        if self._started:
            return
        self._started = True
        self.table = await self.client.table_info(self._table_name)
        self.ref = self.table.ref
        self.partitions = (
            list(range(self.table.partitions))
            if self._partitions is None
            else list(self._partitions)
        )
        committed = (
            await self.client.fetch_offsets(self.group, self.ref, self.partitions)
            if self.group
            else {}
        )
        by_time = (
            await self.client.offsets_for_times(self.ref, self._start, self.partitions)
            if isinstance(self._start, dt.datetime)
            else None
        )
        self.positions = start_positions(
            self.table, self.partitions, committed, self._start, by_time
        )
        self.consumed = dict(self.positions)
        self._committed = dict(committed)

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._started and self.group and self.auto_commit_interval is not None:
            await self.commit()

    async def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        if not self.group:
            raise ValueError("commit needs a consumer group")
        await self.start()
        wanted = dict(self.consumed if offsets is None else offsets)
        changed = {p: o for p, o in wanted.items() if self._committed.get(p) != o}
        if changed:
            await self.client.commit_offsets(self.group, self.ref, changed)
            self._committed.update(changed)
        self._last_commit = time.monotonic()

    def seek(self, partition: int, offset: int) -> None:
        self.positions[partition] = offset
        self.consumed[partition] = offset

    async def poll(self, timeout: float | None = None) -> list[pa.RecordBatch]:
        await self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            await self._maybe_auto_commit()
            out = await self._fetch_round()
            if out or (deadline is not None and time.monotonic() >= deadline):
                return out
            await asyncio.sleep(self.poll_interval)

    async def _fetch_round(self) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        n = len(self.partitions)
        for k in range(n):
            p = self.partitions[(self._next + k) % n]
            batches, nxt = await self.client._read_once(
                self.ref, p, self.positions[p], self.max_records
            )
            out.extend(batches)
            self.positions[p] = nxt
        self._next = (self._next + 1) % max(1, n)
        return out

    async def _maybe_auto_commit(self) -> None:
        if (
            self.group
            and self.auto_commit_interval is not None
            and time.monotonic() - self._last_commit >= self.auto_commit_interval
        ):
            await self.commit()

    async def batches(self) -> AsyncIterator[pa.RecordBatch]:
        await self.start()
        while True:
            await self._maybe_auto_commit()
            got = await self._fetch_round()
            if not got:
                if not self.follow:
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            for batch in got:
                mark_consumed(self.consumed, batch)
                yield batch

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        async for batch in self.batches():
            p = batch.column("_partition")[0].as_py()
            for row in batch.to_pylist():
                self.consumed[p] = row["_offset"] + 1
                yield row


#: redis-py style names: ``from gateway.client import aio; aio.Client(...)``.
Client = AsyncClient
Producer = AsyncProducer
Consumer = AsyncConsumer
