"""What each Kafka request does, for one authenticated connection, through the same
:class:`~gateway.server.calls.DataCalls` and :class:`~gateway.tenancy.Gate` as every
other edge: :class:`KafkaApis` is made of one part per family of APIs (``topics``,
``produce``, ``fetch``, ``offsets``, ``groups``, ``admin``) over ``base``. Topics are tables named
``namespace.name``; partitions and offsets are the table's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.server.kafka.admin import AdminApis
from gateway.server.kafka.base import LONGEST_MUTE_S, Broker, held_while_throttled
from gateway.server.kafka.classic import ClassicGroups
from gateway.server.kafka.consumer_apis import ConsumerGroupApis
from gateway.server.kafka.consumer_groups import ConsumerGroups
from gateway.server.kafka.fetch import FetchApis, fetch_waits
from gateway.server.kafka.groups import GroupApis
from gateway.server.kafka.offsets import OffsetApis
from gateway.server.kafka.produce import ProduceApis
from gateway.server.kafka.producers import ProducerApis, ProducerEpochs
from gateway.server.kafka.protocol import (
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    DESCRIBE_CLUSTER,
    DESCRIBE_CONFIGS,
    DESCRIBE_GROUPS,
    FETCH,
    FIND_COORDINATOR,
    HEARTBEAT,
    INCREMENTAL_ALTER_CONFIGS,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    LIST_OFFSETS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    PRODUCE,
    SYNC_GROUP,
    Request,
)
from gateway.server.kafka.topics import TopicApis

__all__ = ["LONGEST_MUTE_S", "Broker", "KafkaApis", "held_while_throttled"]


class KafkaApis(
    TopicApis,
    ProduceApis,
    ProducerApis,
    FetchApis,
    OffsetApis,
    GroupApis,
    ConsumerGroupApis,
    AdminApis,
):
    """The requests of one connection once it authenticated as ``tenant``."""

    def __init__(
        self,
        *args: Any,
        groups: ClassicGroups,
        consumer_groups: ConsumerGroups,
        producers: ProducerEpochs,
    ) -> None:
        super().__init__(*args)
        #: The listener's classic groups and KIP-848 consumer groups, shared by its
        #: connections.
        self.groups = groups
        self.consumer_groups = consumer_groups
        #: The newest epoch of each idempotent producer, shared likewise.
        self.producers = producers

    async def handle(self, request: Request) -> Any | None:
        """The answer to ``request`` (None: a Produce with acks=0, answered with nothing).

        Raises:
            Unauthenticated, TenantSuspended: the connection's key no longer stands.
        """
        handler = self._handlers[request.api_key]
        # Counted, its key checked again (cached), held by one of the tenant's slots, as
        # a request of any edge; muted for a while when over the tenant's requests/s.
        self.muted_ms = 0
        await self._muted(lambda: self.gate.tenant_of(self.authorization))
        waits = request.api_key == FETCH and fetch_waits(request.body)
        async with contextlib.AsyncExitStack() as held:
            # No free slot is a throttle too: held and tried again.
            await self._muted(
                lambda: held.enter_async_context(self.gate.admit(self.tenant, follow=waits))
            )
            answer = await handler(self, request)
        if answer is not None and self.muted_ms and hasattr(answer, "throttle_time"):
            # Kafka's quota answer: how long the request was held for the tenant's quota.
            muted = dt.timedelta(milliseconds=self.muted_ms)
            answer = dataclasses.replace(answer, throttle_time=muted)
        return answer

    _handlers: dict[int, Callable[[KafkaApis, Request], Awaitable[Any]]] = {
        METADATA: TopicApis.metadata,
        PRODUCE: ProduceApis.produce,
        INIT_PRODUCER_ID: ProducerApis.init_producer_id,
        FETCH: FetchApis.fetch,
        LIST_OFFSETS: FetchApis.list_offsets,
        FIND_COORDINATOR: OffsetApis.find_coordinator,
        OFFSET_COMMIT: OffsetApis.offset_commit,
        OFFSET_FETCH: OffsetApis.offset_fetch,
        CREATE_TOPICS: TopicApis.create_topics,
        DELETE_TOPICS: TopicApis.delete_topics,
        JOIN_GROUP: GroupApis.join_group,
        SYNC_GROUP: GroupApis.sync_group,
        HEARTBEAT: GroupApis.heartbeat,
        LEAVE_GROUP: GroupApis.leave_group,
        DESCRIBE_GROUPS: GroupApis.describe_groups,
        LIST_GROUPS: GroupApis.list_groups,
        CONSUMER_GROUP_HEARTBEAT: ConsumerGroupApis.consumer_group_heartbeat,
        CONSUMER_GROUP_DESCRIBE: ConsumerGroupApis.consumer_group_describe,
        DESCRIBE_CONFIGS: AdminApis.describe_configs,
        INCREMENTAL_ALTER_CONFIGS: AdminApis.incremental_alter_configs,
        CREATE_PARTITIONS: AdminApis.create_partitions,
        DESCRIBE_CLUSTER: AdminApis.describe_cluster,
        OFFSET_DELETE: AdminApis.offset_delete,
    }
