"""What every part of :class:`~gateway.server.kafka.apis.KafkaApis` stands on: the
connection's tenant and key, the cluster of brokers it is told of, tables by topic name, and
holding a throttled request (Kafka mutes an over-quota client's channel)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.core import TableView
from gateway.server.calls import DataCalls
from gateway.server.kafka.cluster import Broker, Cluster
from gateway.wire.errors import InvalidRequest, TableNotFound, Throttled, TidegateError

__all__ = [
    "LONGEST_MUTE_S",
    "ApisBase",
    "Broker",
    "Cluster",
    "held_while_throttled",
    "message",
    "split_topic",
    "topic_id",
]

T = TypeVar("T")

#: Longest a throttled request is held before it fails (the connection is muted
#: meanwhile, as Kafka mutes an over-quota client's channel).
LONGEST_MUTE_S = 5.0


def topic_id(table: TableView) -> uuid.UUID:
    """A stable Kafka topic id for a table (from its table id, which is never reused)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"tidegate:{table.definition.table_id}")


def split_topic(topic: str) -> tuple[str, str] | None:
    """``namespace.name`` as its two parts; None for a name that is not one (namespaces
    and table names hold no dot)."""
    namespace, dot, name = topic.partition(".")
    if not dot or not namespace or not name or "." in name:
        return None
    return namespace, name


def message(err: TidegateError, topic: str) -> str:
    return f"{topic}: {err.message}"[:1000]


class ApisBase:
    """The requests of one connection once it authenticated as ``tenant``."""

    def __init__(self, calls: DataCalls, cluster: Cluster, tenant: str, authorization: str) -> None:
        self.calls = calls
        self.gate = calls.gate
        self.service = calls.service
        #: The live brokers; :attr:`broker` is this replica among them.
        self.cluster = cluster
        self.broker = cluster.me
        self.tenant = tenant
        self.authorization = authorization
        #: Milliseconds the request being served was held for the tenant's quota.
        self.muted_ms = 0

    def _elsewhere(self, group: str) -> bool:
        """Whether another replica coordinates the tenant's ``group`` (its requests here
        are answered NOT_COORDINATOR, and the client finds the coordinator again)."""
        return not self.cluster.coordinates(self.tenant, group)

    async def _muted(self, call: Callable[[], Awaitable[T]], deadline: float | None = None) -> T:
        """``call()``, held while it is throttled (:func:`held_while_throttled`) until
        ``deadline`` (monotonic) or :data:`LONGEST_MUTE_S`; the time held is told in the
        answer's ``throttle_time_ms``."""
        until = deadline if deadline is not None else time.monotonic() + LONGEST_MUTE_S
        result, held_ms = await held_while_throttled(call, until)
        self.muted_ms += held_ms
        return result

    async def _table(self, topic: str, *, fresh: bool = False) -> TableView | None:
        """The tenant's table named ``topic``, or None (no such table, or not a table
        name); ``fresh`` reads its settings from the metadata store rather than the
        moment's cache (another replica may have changed them)."""
        parts = split_topic(topic)
        if parts is None:
            return None
        try:
            return await self.service.table(self.tenant, *parts, fresh=fresh)
        except (TableNotFound, InvalidRequest):
            return None


async def held_while_throttled(call: Callable[[], Awaitable[T]], until: float) -> tuple[T, int]:
    """``call()`` and the milliseconds it was held: while it is throttled, the connection
    waits the time it is told and tries again (Kafka mutes an over-quota client's channel
    the same way) until ``until`` (monotonic).

    Raises:
        Throttled: still throttled at ``until``.
    """
    held = 0
    while True:
        try:
            return await call(), held
        except Throttled as err:
            pause = (err.retry_after_ms or 100) / 1000
            if time.monotonic() + pause > until:
                raise
            await asyncio.sleep(pause)
            held += int(pause * 1000)
