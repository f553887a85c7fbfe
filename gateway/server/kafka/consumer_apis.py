"""Kafka's consumer group protocol (KIP-848) on the wire: ``ConsumerGroupHeartbeat`` and
``ConsumerGroupDescribe``, over :class:`~gateway.server.kafka.consumer_groups.ConsumerGroups`
(the coordinator assigns; the client reconciles). Subscriptions are topic names, resolved
to the connection's tenant's tables, so another tenant's table is no topic here."""

from __future__ import annotations

import time
import uuid
from typing import Any

from gateway.core import TableView
from gateway.core.names import check_group
from gateway.server.kafka.base import ApisBase, topic_id
from gateway.server.kafka.classic import ClassicGroups
from gateway.server.kafka.consumer_groups import (
    RECONCILING_INTERVAL_MS,
    Beat,
    ConsumerGroup,
    ConsumerGroups,
    Reply,
    Topic,
    TopicPartitions,
)
from gateway.server.kafka.protocol import ErrorCode, Request, build, response_class
from gateway.wire.errors import InvalidRequest

__all__ = ["ConsumerGroupApis"]

#: Longest member id a member may give, most topics it may subscribe to, longest topic
#: name (Kafka's own limit is 249 characters).
MAX_MEMBER_ID, MAX_SUBSCRIBED, MAX_TOPIC_NAME = 255, 1000, 249
#: More names than this to resolve are looked up in one listing of the tenant's tables.
MANY_NAMES = 16
#: The server-side assignors a member may ask for: both name this coordinator's one (a
#: sticky fair share per topic).
ASSIGNORS = ("uniform", "range")


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _check(request: Request) -> None:
    """Kafka's checks of a heartbeat before it reaches the group."""
    body = request.body
    try:
        check_group(body.group_id)
    except InvalidRequest as err:
        raise _Refused(ErrorCode.invalid_group_id, err.message) from None
    if not body.member_id and not (request.api_version == 0 and body.member_epoch == 0):
        raise _Refused(ErrorCode.invalid_request, "a heartbeat needs the member's id")
    if len(body.member_id) > MAX_MEMBER_ID:
        raise _Refused(
            ErrorCode.invalid_request, f"a member id holds at most {MAX_MEMBER_ID} characters"
        )
    if body.member_epoch < -2:
        raise _Refused(
            ErrorCode.invalid_request,
            f"member epoch {body.member_epoch} is none of 0 (join), -1 or -2 (leave), or "
            "the epoch the member was answered",
        )
    if body.subscribed_topic_regex:
        raise _Refused(
            ErrorCode.invalid_request,
            "subscriptions by regular expression are not served by Tidegate's Kafka "
            "listener yet: subscribe to topic names",
        )
    names = body.subscribed_topic_names
    if names is not None and (
        len(names) > MAX_SUBSCRIBED or any(len(n) > MAX_TOPIC_NAME for n in names)
    ):
        raise _Refused(
            ErrorCode.invalid_request,
            f"a subscription names at most {MAX_SUBSCRIBED} topics of at most "
            f"{MAX_TOPIC_NAME} characters each",
        )
    if body.server_assignor is not None and body.server_assignor not in ASSIGNORS:
        raise _Refused(
            ErrorCode.unsupported_assignor,
            f"server assignor {body.server_assignor[:100]!r} is not served: leave it unset, "
            f"or name one of {', '.join(ASSIGNORS)}",
        )
    if body.member_epoch == 0:
        if body.rebalance_timeout.total_seconds() < 0 or names is None:
            raise _Refused(
                ErrorCode.invalid_request,
                "a join (member epoch 0) must give the rebalance timeout and the "
                "subscribed topic names",
            )
        if body.topic_partitions:
            raise _Refused(
                ErrorCode.invalid_request,
                "a join (member epoch 0) owns no partitions: send an empty list",
            )


def _owned(body: Any) -> TopicPartitions | None:
    if body.topic_partitions is None:
        return None
    owned: dict[uuid.UUID, set[int]] = {}
    for t in body.topic_partitions:
        if t.topic_id is not None:
            owned.setdefault(t.topic_id, set()).update(t.partitions)
    return {tid: frozenset(ps) for tid, ps in owned.items()}


def _partitions(assigned: TopicPartitions, group: ConsumerGroup) -> list[dict[str, Any]]:
    return [
        {
            "topic_id": tid,
            "topic_name": group.topics[tid].name if tid in group.topics else "",
            "partitions": sorted(ps),
        }
        for tid, ps in sorted(assigned.items(), key=lambda kv: str(kv[0]))
    ]


class ConsumerGroupApis(ApisBase):
    """ConsumerGroupHeartbeat and ConsumerGroupDescribe."""

    groups: ClassicGroups
    consumer_groups: ConsumerGroups

    async def _resolve(self, names: set[str], into: dict[str, Topic | None]) -> None:
        wanted = sorted(names - set(into))
        listed: dict[str, TableView] | None = None
        if len(wanted) > MANY_NAMES:
            # One listing rather than a metadata-store read per name not found.
            listed = {
                f"{t.definition.namespace}.{t.definition.name}": t
                for t in await self.service.list_tables(self.tenant)
            }
        for name in wanted:
            table = listed.get(name) if listed is not None else await self._table(name)
            into[name] = (
                None if table is None else Topic(topic_id(table), name, table.definition.partitions)
            )

    async def consumer_group_heartbeat(self, request: Request) -> Any:
        cls = response_class(request)
        try:
            _check(request)
            if self._elsewhere(request.body.group_id):
                raise _Refused(
                    ErrorCode.not_coordinator,
                    f"another replica coordinates group {request.body.group_id!r}: find it "
                    "again (FindCoordinator)",
                )
            reply, group, member_id = await self._beat(request)
        except _Refused as refused:
            return build(
                cls,
                {"error_code": refused.code, "error_message": refused.message, "member_epoch": -1},
            )
        if reply.error != ErrorCode.none:
            return build(
                cls,
                {"error_code": reply.error, "error_message": reply.message, "member_epoch": -1},
            )
        assignment = None
        if reply.assignment is not None:
            assignment = {"topic_partitions": _partitions(reply.assignment, group)}
        return build(
            cls,
            {
                "error_code": ErrorCode.none,
                "member_id": member_id,
                "member_epoch": reply.epoch,
                "heartbeat_interval": RECONCILING_INTERVAL_MS
                if reply.reconciling
                else self.consumer_groups.heartbeat_interval_ms,
                "assignment": assignment,
            },
        )

    async def _beat(self, request: Request) -> tuple[Reply, ConsumerGroup, str]:
        body = request.body
        classic = self.groups.find(self.tenant, body.group_id)
        if classic is not None and classic.members:
            raise _Refused(
                ErrorCode.group_id_not_found,
                f"group {body.group_id!r} is a classic group with live members: its members "
                "use group.protocol=classic until it is empty",
            )
        subscribed = None
        if body.subscribed_topic_names is not None:
            subscribed = tuple(sorted(set(body.subscribed_topic_names)))
        member_id = body.member_id or str(uuid.uuid4())
        resolved: dict[str, Topic | None] = {}
        existing = self.consumer_groups.find(self.tenant, body.group_id)
        names = set(subscribed or ())
        while True:
            # Resolved with awaits; the group may have changed meanwhile, so until every
            # name its members subscribe to is known.
            await self._resolve(names, resolved)
            existing = self.consumer_groups.find(self.tenant, body.group_id)
            names = set(subscribed or ()) | (existing.subscribed_names() if existing else set())
            if names <= set(resolved):
                break
        if body.member_epoch < 0 and existing is None:
            raise _Refused(
                ErrorCode.unknown_member_id,
                f"member {member_id} is not in consumer group {body.group_id!r}",
            )
        group = self.consumer_groups.get_or_create(self.tenant, body.group_id)
        beat = Beat(
            member_id,
            body.member_epoch,
            request.client_id or "",
            int(body.rebalance_timeout.total_seconds() * 1000),
            subscribed,
            _owned(body),
        )
        reply = group.heartbeat(beat, resolved, time.monotonic())
        self.consumer_groups.forget_if_empty(self.tenant, body.group_id)
        return reply, group, member_id

    async def consumer_group_describe(self, request: Request) -> Any:
        described = []
        for group_id in request.body.group_ids:
            if self._elsewhere(group_id):
                described.append({"group_id": group_id, "error_code": ErrorCode.not_coordinator})
                continue
            group = self.consumer_groups.find(self.tenant, group_id)
            if group is None:
                described.append(
                    {
                        "group_id": group_id,
                        "error_code": ErrorCode.group_id_not_found,
                        "error_message": f"group {group_id[:300]!r} is not a consumer group "
                        "with live members",
                        "group_state": "Dead",
                    }
                )
                continue
            described.append(
                {
                    "group_id": group_id,
                    "group_state": group.state,
                    "group_epoch": group.epoch,
                    "assignment_epoch": group.epoch,
                    "assignor_name": ASSIGNORS[0],
                    "members": [
                        {
                            "member_id": m.member_id,
                            "member_epoch": m.epoch,
                            "client_id": m.client_id,
                            "client_host": "",
                            "subscribed_topic_names": list(m.subscribed),
                            "assignment": {"topic_partitions": _partitions(m.assigned, group)},
                            "target_assignment": {
                                "topic_partitions": _partitions(
                                    group.target.get(m.member_id, {}), group
                                )
                            },
                            "member_type": 1,
                        }
                        for m in group.members.values()
                    ],
                    "authorized_operations": -(2**31),
                }
            )
        return build(response_class(request), {"groups": described})
