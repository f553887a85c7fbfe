"""Kafka's classic group membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) and
DescribeGroups / ListGroups, over :class:`~gateway.server.kafka.classic.ClassicGroups`:
the client's own assignor decides who reads what; the gateway gathers the members, hands
the leader their metadata and every member the leader's assignment."""

from __future__ import annotations

from typing import Any

from gateway.core.names import check_group
from gateway.server.kafka.base import ApisBase
from gateway.server.kafka.classic import ClassicGroups
from gateway.server.kafka.consumer_groups import ConsumerGroups
from gateway.server.kafka.protocol import ErrorCode, Request, build, response_class
from gateway.wire.errors import InvalidRequest

#: Session timeouts a classic member may ask (Kafka's group.min/max.session.timeout.ms).
MIN_SESSION_MS, MAX_SESSION_MS = 1_000, 1_800_000


def _valid_group(group_id: str) -> bool:
    try:
        check_group(group_id)
    except InvalidRequest:
        return False
    return True


class GroupApis(ApisBase):
    """JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups and ListGroups."""

    groups: ClassicGroups
    consumer_groups: ConsumerGroups

    async def join_group(self, request: Request) -> Any:
        body = request.body
        cls = response_class(request)
        session_ms = body.session_timeout.total_seconds() * 1000
        if not _valid_group(body.group_id):
            return build(cls, {"error_code": ErrorCode.invalid_group_id, "member_id": ""})
        if self._elsewhere(body.group_id):
            return build(
                cls, {"error_code": ErrorCode.not_coordinator, "member_id": body.member_id}
            )
        if not MIN_SESSION_MS <= session_ms <= MAX_SESSION_MS:
            return build(cls, {"error_code": ErrorCode.invalid_session_timeout, "member_id": ""})
        if self.consumer_groups.find(self.tenant, body.group_id) is not None:
            # A KIP-848 group with live members: its protocol is not the classic one.
            return build(
                cls, {"error_code": ErrorCode.inconsistent_group_protocol, "member_id": ""}
            )
        rebalance = getattr(body, "rebalance_timeout", None)
        joined = await self.groups.join(
            self.tenant,
            body.group_id,
            body.member_id,
            request.client_id or "",
            body.protocol_type,
            {p.name: p.metadata for p in body.protocols},
            session_ms / 1000,
            (rebalance.total_seconds() if rebalance else session_ms / 1000),
        )
        return build(
            cls,
            {
                "error_code": joined.error,
                "generation_id": joined.generation,
                "protocol_type": body.protocol_type,
                "protocol_name": joined.protocol,
                "leader": joined.leader,
                "member_id": joined.member_id or body.member_id,
                "members": [{"member_id": m, "metadata": meta} for m, meta in joined.members],
            },
        )

    async def sync_group(self, request: Request) -> Any:
        body = request.body
        if self._elsewhere(body.group_id):
            return build(response_class(request), {"error_code": ErrorCode.not_coordinator})
        code, assignment = await self.groups.sync(
            self.tenant,
            body.group_id,
            body.member_id,
            body.generation_id,
            {a.member_id: a.assignment for a in body.assignments},
        )
        group = self.groups.find(self.tenant, body.group_id)
        return build(
            response_class(request),
            {
                "error_code": code,
                "assignment": assignment,
                "protocol_type": group.protocol_type if group else None,
                "protocol_name": group.protocol if group else None,
            },
        )

    async def heartbeat(self, request: Request) -> Any:
        body = request.body
        if self._elsewhere(body.group_id):
            return build(response_class(request), {"error_code": ErrorCode.not_coordinator})
        group = self.groups.find(self.tenant, body.group_id)
        code = (
            ErrorCode.unknown_member_id
            if group is None
            else group.check(body.member_id, body.generation_id)
        )
        return build(response_class(request), {"error_code": code})

    async def leave_group(self, request: Request) -> Any:
        body = request.body
        ids = [m.member_id for m in body.members] if request.api_version >= 3 else [body.member_id]
        if self._elsewhere(body.group_id):
            return build(
                response_class(request), {"error_code": ErrorCode.not_coordinator, "members": []}
            )
        group = self.groups.find(self.tenant, body.group_id)
        members = [
            {
                "member_id": m,
                "error_code": ErrorCode.none
                if group is not None and group.leave(m)
                else ErrorCode.unknown_member_id,
            }
            for m in ids
        ]
        code = ErrorCode.none
        if request.api_version < 3 and members[0]["error_code"] != ErrorCode.none:
            code = ErrorCode.unknown_member_id
        return build(response_class(request), {"error_code": code, "members": members})

    async def describe_groups(self, request: Request) -> Any:
        described = []
        for group_id in request.body.groups:
            if self._elsewhere(group_id):
                described.append({"group_id": group_id, "error_code": ErrorCode.not_coordinator})
                continue
            group = self.groups.find(self.tenant, group_id)
            if group is None and self.consumer_groups.find(self.tenant, group_id) is not None:
                # As Kafka answers a consumer group (KIP-848): ConsumerGroupDescribe tells.
                described.append(
                    {
                        "group_id": group_id,
                        "group_state": "Dead",
                        "error_code": ErrorCode.group_id_not_found,
                        "error_message": f"group {group_id!r} is not a classic group: it "
                        "is a consumer group (group.protocol=consumer), described by "
                        "ConsumerGroupDescribe",
                    }
                )
                continue
            if group is None:
                # Kafka answers a group it does not know as Dead, with no member.
                described.append({"group_id": group_id, "group_state": "Dead"})
                continue
            described.append(
                {
                    "group_id": group_id,
                    "group_state": group.state,
                    "protocol_type": group.protocol_type,
                    "protocol_data": group.protocol,
                    "members": [
                        {
                            "member_id": m.member_id,
                            "client_id": m.client_id,
                            "client_host": "",
                            "member_metadata": m.protocols.get(group.protocol, b""),
                            "member_assignment": m.assignment,
                        }
                        for m in group.members.values()
                    ],
                    "authorized_operations": -2147483648,
                }
            )
        return build(response_class(request), {"groups": described})

    async def list_groups(self, request: Request) -> Any:
        wanted = set(getattr(request.body, "states_filter", ()) or ())
        types = {t.lower() for t in getattr(request.body, "types_filter", ()) or ()}
        listed = [
            {
                "group_id": g.group_id,
                "protocol_type": g.protocol_type,
                "group_state": g.state,
                "group_type": "classic",
            }
            for g in self.groups.of_tenant(self.tenant)
            if (not wanted or g.state in wanted)
            and (not types or "classic" in types)
            # A group this replica no longer coordinates (its members moved) is not its.
            and not self._elsewhere(g.group_id)
        ]
        listed += [
            {
                "group_id": g.group_id,
                "protocol_type": "consumer",
                "group_state": g.state,
                "group_type": "consumer",
            }
            for g in self.consumer_groups.of_tenant(self.tenant)
            if (not wanted or g.state in wanted)
            and (not types or "consumer" in types)
            and not self._elsewhere(g.group_id)
        ]
        return build(response_class(request), {"groups": listed})
