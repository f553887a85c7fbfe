"""The asyncio producer: batching, linger, compression, idempotence and retries over one
append stream (its logic is :class:`gateway.client._producer.ProducerCore`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from gateway.client._batching import ProducerConfig
from gateway.client._producer import ProducerCore
from gateway.client._types import (
    RecordMetadata,
    TableRef,
)
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import InvalidRequest, Throttled, Unavailable
from gateway.wire.status import error_from_rpc

if TYPE_CHECKING:
    from gateway.client._hosts import AsyncHost

__all__ = ["AsyncProducer"]


class AsyncProducer:
    """The asyncio twin of :class:`gateway.client.Producer`.

    ``await producer.send(rows)`` buffers the rows (waiting while the buffer is full) and
    returns an awaitable (an ``asyncio.Future``) resolving to :class:`RecordMetadata`, or a
    list of them, once the gateway stored the rows. Get one with
    ``client.producer(table, ...)``, best as ``async with client.producer(...) as p``.
    """

    def __init__(
        self,
        client: AsyncHost,
        table: str | TableRef,
        *,
        max_block: float = 60.0,
        transport: str = "grpc",
        **config: Any,
    ) -> None:
        if transport not in ("auto", "grpc"):
            raise InvalidRequest(
                f"the asyncio producer appends over gRPC only (transport 'auto' or 'grpc'), "
                f"not {transport!r}; the sync Producer appends over Flight too"
            )
        self.client = client
        self._table_name = table
        self.config = ProducerConfig(**config)
        self.max_block = max_block
        self._core: ProducerCore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: What the sender awaits while idle; :meth:`_notify` resolves it.
        self._wake: asyncio.Future[None] | None = None
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
        self._loop = asyncio.get_running_loop()
        self._core = ProducerCore(self.table, self.config)
        self._task = self._loop.create_task(self._run())

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

    @property
    def transport(self) -> str:
        """What the producer appends over: always ``grpc`` for the asyncio producer."""
        return "grpc"

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _notify(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def _progressed(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    async def send(
        self, data: Any, *, partition: int | None = None
    ) -> asyncio.Future[RecordMetadata | list[RecordMetadata]]:
        """Buffer rows; returns a future resolving once the gateway stored them."""
        core = self._core
        if core is None:
            await self.start()
            core = self.core
        if self._closed:
            raise RuntimeError("the producer is closed")
        if core.unfinished >= self.config.buffer_records:
            await self._wait_for_room(core)
        assert self._loop is not None
        future: asyncio.Future[RecordMetadata | list[RecordMetadata]] = self._loop.create_future()
        delivery = core.add(data, partition, future)
        if delivery is not None:
            delivery.future = future
            if delivery.done:
                future.set_result(delivery.result())
            self._notify()
        elif core.acc.kick:  # a batch opened or filled: the sender has something new
            core.acc.kick = False
            self._notify()
        return future

    async def _wait_for_room(self, core: ProducerCore) -> None:
        """Back-pressure: wait while ``buffer_records`` records are unacknowledged."""
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
                self._core.fail_all(RuntimeError("the producer was closed")).resolve()
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
                core.on_response(gen, resp).resolve()
                self._progressed()
                self._notify()
            # The stream ended without an error status: the gateway went away cleanly.
            err = Unavailable("the append stream ended")
        except grpc.RpcError as exc:
            err = error_from_rpc(exc)
        core.on_stream_error(gen, err).resolve()
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
                    core.fail_all(exc).resolve()
                    self._progressed()
                    continue
            requests = core.outgoing(now, force)
            rejected = core.take_rejected()
            if rejected:
                rejected.resolve()
                self._progressed()
            if requests and self._requests is not None:
                for r in requests:
                    self._requests.put_nowait(r)
                continue
            wake = core.next_wakeup(now)
            core.acc.kick = False
            await self._sleep(None if wake is None else max(0.0, wake - now) + 0.0005)

    async def _sleep(self, timeout: float | None) -> None:
        """Wait for :meth:`_notify` or ``timeout`` seconds: a future and a timer, cheaper
        than ``wait_for`` (a task per wait) as the sender waits once per batch or so."""
        assert self._loop is not None
        wake = self._wake = self._loop.create_future()
        timer = None if timeout is None else self._loop.call_later(timeout, self._notify)
        try:
            await wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()
