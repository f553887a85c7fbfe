"""Kafka's FindCoordinator, OffsetCommit and OffsetFetch over the committed offsets of the
gateway's consumer groups (the same the SDK, HTTP and the console show)."""

from __future__ import annotations

from typing import Any

from gateway.server.calls import wire_error
from gateway.server.kafka.base import ApisBase, split_topic, topic_id
from gateway.server.kafka.classic import ClassicGroups
from gateway.server.kafka.consumer_groups import ConsumerGroup, ConsumerGroups
from gateway.server.kafka.protocol import ErrorCode, Request, build, error_code, response_class
from gateway.wire.errors import TableNotFound


class OffsetApis(ApisBase):
    """FindCoordinator, OffsetCommit and OffsetFetch."""

    groups: ClassicGroups
    consumer_groups: ConsumerGroups

    async def find_coordinator(self, request: Request) -> Any:
        """A group's coordinator is the live replica its tenant and id hash to
        (:meth:`~gateway.server.kafka.cluster.Cluster.coordinator`), where its members
        meet; transactions have no coordinator yet."""
        body = request.body
        keys = list(body.coordinator_keys) if request.api_version >= 4 else [body.key]
        group = getattr(body, "key_type", 0) == 0
        coordinators = [self.cluster.coordinator(self.tenant, key) for key in keys]
        answers = [
            {
                "key": key,
                "node_id": coordinator.node_id if group else -1,
                "host": coordinator.host if group else "",
                "port": coordinator.port if group else -1,
                # Transactions: an error clients stop on, with why (not one they retry
                # until their timeout, as COORDINATOR_NOT_AVAILABLE would be).
                "error_code": ErrorCode.none
                if group
                else ErrorCode.transactional_id_authorization_failed,
                "error_message": None
                if group
                else "transactions are not served by Tidegate's Kafka listener yet; produce "
                "without transactional.id (enable.idempotence=true is served)",
            }
            for key, coordinator in zip(keys, coordinators, strict=True)
        ]
        if request.api_version >= 4:
            return build(response_class(request), {"coordinators": answers})
        return build(response_class(request), answers[0])

    async def offset_commit(self, request: Request) -> Any:
        """A group's committed offsets, the same the SDK, HTTP and the console show. A
        consumer outside the group protocol (generation -1) commits as a client outside
        the group does: only while the group has no live member. A classic group's member
        is fenced by this listener's coordinator (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
        REBALANCE_IN_PROGRESS, as Kafka's), a member of a KIP-848 consumer group likewise
        (UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH: another epoch than its own, or a partition
        it does not hold)."""
        body = request.body
        generation = member_epoch = body.generation_id_or_member_epoch
        member = body.member_id if generation >= 0 else ""
        fenced = ErrorCode.none
        if self._elsewhere(body.group_id):
            elsewhere = ErrorCode.not_coordinator
            topics = [
                {
                    "name": t.name,
                    "partitions": [
                        {"partition_index": p.partition_index, "error_code": elsewhere}
                        for p in t.partitions
                    ],
                }
                for t in body.topics
            ]
            return build(response_class(request), {"topics": topics})
        classic = self.groups.find(self.tenant, body.group_id)
        consumer = self.consumer_groups.find(self.tenant, body.group_id)
        if classic is not None and classic.members:
            # A member of a classic group this listener coordinates: fenced here, then
            # committed as from outside the core's group (which has no member of it).
            fenced = classic.check(member, generation) if member else ErrorCode.unknown_member_id
            member, generation = "", 0
        elif consumer is not None:
            # A member of a consumer group: the same, per topic (the partitions it holds).
            member, generation = "", 0
        topics = []
        for t in body.topics:
            offsets = {p.partition_index: p.committed_offset for p in t.partitions}
            code = fenced
            if consumer is not None:
                code = await self._consumer_fenced(
                    consumer, body.member_id, member_epoch, t.name, offsets
                )
            parts = split_topic(t.name)
            try:
                if parts is None:
                    raise TableNotFound(f"no table {t.name!r}")
                if code == ErrorCode.none:
                    await self.service.commit_offsets(
                        self.tenant,
                        body.group_id,
                        *parts,
                        offsets,
                        member_id=member,
                        generation=max(0, generation),
                    )
            except Exception as exc:
                code = error_code(wire_error(exc, "a Kafka offset commit"))
            topics.append(
                {
                    "name": t.name,
                    "partitions": [{"partition_index": p, "error_code": code} for p in offsets],
                }
            )
        return build(response_class(request), {"topics": topics})

    async def _consumer_fenced(
        self,
        group: ConsumerGroup,
        member_id: str,
        epoch: int,
        topic: str,
        offsets: dict[int, int],
    ) -> ErrorCode:
        """Whether a commit to a consumer group of a topic's ``offsets`` is refused."""
        if epoch < 0 or not member_id:
            return ErrorCode.unknown_member_id  # from outside a group with live members
        table = await self._table(topic)
        if table is None:
            return ErrorCode.unknown_topic_or_partition
        return group.check_commit(member_id, epoch, {topic_id(table): frozenset(offsets)})

    async def offset_fetch(self, request: Request) -> Any:
        """A group's committed offsets; from v8 several groups', and from v9 a member of a
        KIP-848 group names itself and its epoch (UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH
        otherwise, as Kafka checks them)."""
        body = request.body
        cls = response_class(request)
        if request.api_version < 8:
            if self._elsewhere(body.group_id):
                return build(cls, {"topics": [], "error_code": ErrorCode.not_coordinator})
            answers, code = await self._fetch_group(body.group_id, body.topics)
            return build(cls, {"topics": answers, "error_code": code})
        groups = []
        for g in body.groups:
            code = self._fetch_fenced(g)
            answers = []
            if code == ErrorCode.none:
                answers, code = await self._fetch_group(g.group_id, g.topics)
            groups.append({"group_id": g.group_id, "topics": answers, "error_code": code})
        return build(cls, {"groups": groups})

    def _fetch_fenced(self, asked: Any) -> ErrorCode:
        """Whether a fetch of one group of an OffsetFetch v8+ is refused: another replica
        coordinates the group, or a KIP-848 member's id or epoch is not the group's."""
        if self._elsewhere(asked.group_id):
            return ErrorCode.not_coordinator
        member_id = getattr(asked, "member_id", None)
        group = self.consumer_groups.find(self.tenant, asked.group_id)
        if member_id is None or group is None:
            return ErrorCode.none
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if asked.member_epoch != member.epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    async def _fetch_group(self, group: str, topics: Any) -> tuple[list[dict[str, Any]], ErrorCode]:
        """One group's committed offsets of ``topics`` (None: every table it committed
        for), and the group's error."""
        answers: list[dict[str, Any]] = []
        try:
            if topics is None:  # every table the group committed for
                wanted: list[tuple[str, list[int] | None]] = [
                    (f"{ns}.{name}", None)
                    for g, ns, name in await self.service.list_groups(self.tenant)
                    if g == group
                ]
            else:
                wanted = [(t.name, list(t.partition_indexes)) for t in topics]
            for topic, partitions in wanted:
                answers.append(await self._committed(group, topic, partitions))
        except Exception as exc:
            return answers, error_code(wire_error(exc, "a Kafka offset fetch"))
        return answers, ErrorCode.none

    async def _committed(
        self, group: str, topic: str, partitions: list[int] | None
    ) -> dict[str, Any]:
        table = await self._table(topic)
        if table is None:
            codes = dict.fromkeys(partitions or [], ErrorCode.unknown_topic_or_partition)
            return {
                "name": topic,
                "partitions": [
                    {"partition_index": p, "committed_offset": -1, "error_code": c}
                    for p, c in codes.items()
                ],
            }
        d = table.definition
        wanted = partitions if partitions is not None else list(range(d.partitions))
        known = [p for p in wanted if 0 <= p < d.partitions]
        got = await self.service.fetch_offsets(self.tenant, group, d.namespace, d.name, known)
        return {
            "name": topic,
            "partitions": [
                {
                    "partition_index": p,
                    # -1: nothing committed, as Kafka answers it.
                    "committed_offset": got.get(p, -1),
                    "metadata": "",
                    "error_code": ErrorCode.none
                    if p in known
                    else ErrorCode.unknown_topic_or_partition,
                }
                for p in wanted
            ],
        }
