"""Run one behaviour suite over both SDK flavours.

:class:`Synced` drives an asyncio SDK object from synchronous test code: it runs every
coroutine on an event loop of its own thread, turns asyncio futures into
``concurrent.futures`` ones and async iterators into plain iterators. The suite then calls
the sync client and the asyncio client the same way, and both must behave the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from gateway.client import AsyncClient, AsyncConsumer, AsyncProducer

if TYPE_CHECKING:
    from tests.services import GatewayProcess

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        async def wrap() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Synced:
    """A synchronous face on an asyncio SDK object."""

    def __init__(self, obj: Any, lt: LoopThread) -> None:
        self._obj = obj
        self._lt = lt

    def _wrap(self, value: Any) -> Any:
        if inspect.iscoroutine(value):
            return self._wrap(self._lt.run(value))
        if isinstance(value, asyncio.Future):
            fut = value

            async def wait() -> Any:
                return await fut

            return asyncio.run_coroutine_threadsafe(wait(), self._lt.loop)
        if isinstance(value, AsyncClient | AsyncProducer | AsyncConsumer):
            return Synced(value, self._lt)
        if hasattr(value, "__anext__"):
            return self._iterate(value)
        return value

    def _iterate(self, it: Any) -> Iterator[Any]:
        while True:
            try:
                yield self._lt.run(it.__anext__())
            except StopAsyncIteration:
                return

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._obj, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._wrap(attr(*args, **kwargs))

        return call

    def __enter__(self) -> Synced:
        self._lt.run(self._obj.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self._lt.run(self._obj.__aexit__(None, None, None))

    def __iter__(self) -> Iterator[Any]:
        return self._iterate(self._obj.__aiter__())


def synced_client(make: Callable[[], AsyncClient], lt: LoopThread) -> Synced:
    """An asyncio client built inside ``lt``'s loop (grpc.aio channels bind to it)."""

    async def build() -> AsyncClient:
        return make()

    return Synced(lt.run(build()), lt)


@contextlib.contextmanager
def flavoured_client(flavour: str, gateway: GatewayProcess) -> Iterator[Any]:
    """A client of ``gateway`` in ``flavour`` ("sync" or "aio") with the sync calling
    convention: what a suite run over both flavours parametrizes its fixture with."""
    if flavour == "sync":
        with gateway.client() as c:
            yield c
        return
    lt = LoopThread()
    try:
        with synced_client(gateway.async_client, lt) as client:
            yield client
    finally:
        lt.close()


def result(value: Any, timeout: float = 60) -> Any:
    """The value of a send's future in either flavour."""
    assert isinstance(value, Future)
    return value.result(timeout)
