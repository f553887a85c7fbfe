"""What a producer or consumer needs of the client that made it, as Protocols.

The clients (:class:`~gateway.client.Client`, :class:`~gateway.client.aio.AsyncClient`)
import their producers and consumers to hand them out; the producers and consumers know
their client only as one of these, so the imports run one way: client -> producer/consumer
-> this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import pyarrow as pa

    from gateway.client._channel import Reach
    from gateway.client._flight import FlightReads
    from gateway.client._types import TableInfo, TableRef
    from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
    from gateway.wire.retry import Retry

__all__ = ["AsyncHost", "SyncHost"]


class _Channel(Protocol):
    """The channel's side both hosts share: where it reaches, its policies, its stub."""

    reach: Reach
    retry: Retry
    timeout: float
    metadata: tuple[tuple[str, str], ...]

    @property
    def stub(self) -> pb_grpc.TidegateStub: ...


class SyncHost(_Channel, Protocol):
    """What a blocking producer or consumer calls on its client: a unary call
    (``_call(method, request, *, idempotent, retry, timeout)``), one bounded read of a
    partition (``fetch``, as :meth:`gateway.client.Client.fetch`) and the Flight edge."""

    def table_info(self, table: str | TableRef) -> TableInfo: ...

    @property
    def _call(self) -> Callable[..., Any]: ...

    @property
    def fetch(self) -> Callable[..., tuple[list[pa.RecordBatch], int]]: ...

    def _flight(self) -> FlightReads | None: ...


class AsyncHost(_Channel, Protocol):
    """What an asyncio producer or consumer awaits on its client: the same calls as
    :class:`SyncHost`'s, as coroutines (the Flight edge aside)."""

    async def table_info(self, table: str | TableRef) -> TableInfo: ...

    @property
    def _call(self) -> Callable[..., Awaitable[Any]]: ...

    @property
    def fetch(self) -> Callable[..., Awaitable[tuple[list[pa.RecordBatch], int]]]: ...
