"""The servicer's consumer-group methods: committed offsets, membership and a group's
description."""

from __future__ import annotations

from typing import Any

from gateway.core import GroupView
from gateway.server.grpc.calls import current_call
from gateway.server.grpc.service.base import ServicerBase, partition_offsets
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb

__all__ = ["GroupMethods", "group_info"]


def group_info(view: GroupView) -> pb.DescribeGroupResponse:
    return pb.DescribeGroupResponse(
        group=view.group,
        table=pb.TableRef(namespace=view.namespace, name=view.name),
        generation=view.generation,
        state=view.state,
        members=[
            pb.GroupMemberInfo(
                member_id=m.member_id,
                client_id=m.client_id,
                generation=m.generation,
                assigned=m.assigned,
                revoking=m.revoking,
                pending=m.pending,
                session_timeout_ms=m.session_timeout_ms,
                joined_at_ms=m.joined_ms,
                last_heartbeat_ms=m.last_heartbeat_ms,
                protocol=m.protocol,
            )
            for m in view.members
        ],
        partitions=[
            pb.GroupPartitionInfo(
                partition=p.partition,
                member_id=p.member_id or "",
                committed=p.committed,
                high_watermark=p.high_watermark,
                lag=p.lag,
            )
            for p in view.partitions
        ],
        lag=view.lag,
    )


class GroupMethods(ServicerBase):
    async def CommitOffsets(
        self, request: pb.CommitOffsetsRequest, context: Any
    ) -> pb.CommitOffsetsResponse:
        await self.service.commit_offsets(
            current_call().tenant,
            request.group,
            request.table.namespace,
            request.table.name,
            {o.partition: o.offset for o in request.offsets},
            member_id=request.member_id,
            generation=request.generation,
        )
        return pb.CommitOffsetsResponse()

    async def FetchOffsets(
        self, request: pb.FetchOffsetsRequest, context: Any
    ) -> pb.FetchOffsetsResponse:
        found = await self.service.fetch_offsets(
            current_call().tenant,
            request.group,
            request.table.namespace,
            request.table.name,
            list(request.partitions),
        )
        return pb.FetchOffsetsResponse(offsets=partition_offsets(found))

    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: Any
    ) -> pb.ListGroupsResponse:
        ref = request.table if request.HasField("table") else None
        found = await self.service.list_groups(
            current_call().tenant, ref.namespace if ref else None, ref.name if ref else None
        )
        return pb.ListGroupsResponse(
            groups=[
                pb.GroupTable(group=g, table=pb.TableRef(namespace=ns, name=n))
                for g, ns, n in found
            ]
        )

    async def GroupHeartbeat(
        self, request: pb.GroupHeartbeatRequest, context: Any
    ) -> pb.GroupHeartbeatResponse:
        answer = await self.service.group_heartbeat(
            current_call().tenant,
            request.group,
            request.table.namespace,
            request.table.name,
            member_id=request.member_id,
            generation=request.generation,
            owned=list(request.owned),
            session_timeout_ms=request.session_timeout_ms,
            client_id=request.client_id,
            leave=request.leave,
        )
        return pb.GroupHeartbeatResponse(
            member_id=answer.member_id,
            generation=answer.generation,
            assigned=answer.assigned,
            pending=answer.pending,
            settling=answer.settling,
        )

    async def DescribeGroup(
        self, request: pb.DescribeGroupRequest, context: Any
    ) -> pb.DescribeGroupResponse:
        view = await self.service.describe_group(
            current_call().tenant, request.group, request.table.namespace, request.table.name
        )
        return group_info(view)
