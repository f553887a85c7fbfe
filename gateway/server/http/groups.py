"""``/v1/groups/...``: consumer groups: committed offsets, membership (heartbeats) and
describe."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse

from gateway.core import GroupView
from gateway.server.calls import DataCalls
from gateway.server.http.deps import Caller, CallerRoute, Name, Namespace
from gateway.server.http.models import (
    ERRORS,
    GROUP_ERRORS,
    CommitOffsetsRequest,
    GroupDescription,
    GroupList,
    GroupOffsets,
    HeartbeatRequest,
    HeartbeatResponse,
)
from gateway.wire.errors import InvalidRequest

__all__ = ["groups_router"]

Group = Annotated[str, Path(description="Consumer group id.")]


def _offsets(group: str, namespace: str, name: str, got: dict[int, int]) -> JSONResponse:
    return JSONResponse(
        {
            "group": group,
            "namespace": namespace,
            "name": name,
            "offsets": [{"partition": p, "offset": o} for p, o in sorted(got.items())],
        }
    )


def group_json(view: GroupView) -> dict[str, Any]:
    """A group as ``GET /v1/groups/{group}/tables/{namespace}/{name}`` answers it."""
    return {
        "group": view.group,
        "namespace": view.namespace,
        "name": view.name,
        "generation": view.generation,
        "state": view.state,
        "members": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "generation": m.generation,
                "assigned": list(m.assigned),
                "revoking": list(m.revoking),
                "pending": list(m.pending),
                "session_timeout_ms": m.session_timeout_ms,
                "joined_at_ms": m.joined_ms,
                "last_heartbeat_ms": m.last_heartbeat_ms,
                "protocol": m.protocol,
            }
            for m in view.members
        ],
        "partitions": [
            {
                "partition": p.partition,
                "member_id": p.member_id,
                "committed": p.committed,
                "high_watermark": p.high_watermark,
                "lag": p.lag,
            }
            for p in view.partitions
        ],
        "lag": view.lag,
    }


def groups_router(calls: DataCalls) -> APIRouter:
    router = APIRouter(prefix="/v1/groups", tags=["groups"], route_class=CallerRoute)
    _offset_routes(router, calls)
    _member_routes(router, calls)
    return router


def _offset_routes(router: APIRouter, calls: DataCalls) -> None:
    """The groups with committed offsets, and their offsets."""
    service = calls.service

    @router.get(
        "",
        response_model=GroupList,
        responses=ERRORS,
        summary="The consumer groups with committed offsets, per table.",
    )
    async def list_groups(
        caller: Caller,
        namespace: Annotated[str | None, Query(description="With name: one table only.")] = None,
        name: Annotated[str | None, Query(description="With namespace: one table only.")] = None,
    ) -> JSONResponse:
        found = await service.list_groups(caller.tenant, namespace, name)
        return JSONResponse(
            {"groups": [{"group": g, "namespace": ns, "name": n} for g, ns, n in found]}
        )

    @router.get(
        "/{group}/tables/{namespace}/{name}/offsets",
        response_model=GroupOffsets,
        responses=ERRORS,
        summary="A consumer group's committed offsets for a table.",
    )
    async def fetch_offsets(
        group: Group, namespace: Namespace, name: Name, caller: Caller
    ) -> JSONResponse:
        """Partitions the group never committed are absent."""
        got = await service.fetch_offsets(caller.tenant, group, namespace, name)
        return _offsets(group, namespace, name, got)

    @router.post(
        "/{group}/tables/{namespace}/{name}/offsets",
        response_model=GroupOffsets,
        responses=GROUP_ERRORS,
        summary="Commit a consumer group's offsets for a table.",
    )
    async def commit_offsets(
        group: Group,
        namespace: Namespace,
        name: Name,
        body: CommitOffsetsRequest,
        caller: Caller,
    ) -> JSONResponse:
        """Store the next offset to consume per partition; answers every committed offset."""
        offsets: dict[int, int] = {}
        for o in body.offsets:
            if o.partition in offsets:
                raise InvalidRequest(f"partition {o.partition} is committed twice")
            offsets[o.partition] = o.offset
        await service.commit_offsets(
            caller.tenant,
            group,
            namespace,
            name,
            offsets,
            member_id=body.member_id,
            generation=body.generation,
        )
        got = await service.fetch_offsets(caller.tenant, group, namespace, name)
        return _offsets(group, namespace, name, got)


def _member_routes(router: APIRouter, calls: DataCalls) -> None:
    """Membership (the heartbeat) and a group's description."""
    service = calls.service

    @router.post(
        "/{group}/tables/{namespace}/{name}/heartbeat",
        response_model=HeartbeatResponse,
        responses=GROUP_ERRORS,
        summary="Join a consumer group, stay in it, or leave it.",
    )
    async def heartbeat(
        group: Group, namespace: Namespace, name: Name, body: HeartbeatRequest, caller: Caller
    ) -> JSONResponse:
        """Join with generation 0, then heartbeat within the session timeout with the
        partitions held; the answer says what the member may read now (Kafka's KIP-848
        protocol in small). An unknown member gets 409 UNKNOWN_MEMBER_ID: rejoin."""
        answer = await service.group_heartbeat(
            caller.tenant,
            group,
            namespace,
            name,
            member_id=body.member_id,
            generation=body.generation,
            owned=body.owned,
            session_timeout_ms=body.session_timeout_ms,
            client_id=body.client_id,
            leave=body.leave,
        )
        return JSONResponse(
            {
                "member_id": answer.member_id,
                "generation": answer.generation,
                "assigned": list(answer.assigned),
                "pending": answer.pending,
                "settling": answer.settling,
            }
        )

    @router.get(
        "/{group}/tables/{namespace}/{name}",
        response_model=GroupDescription,
        responses=ERRORS,
        summary="A consumer group on a table: members, partitions, generation and lag.",
    )
    async def describe_group(
        group: Group, namespace: Namespace, name: Name, caller: Caller
    ) -> JSONResponse:
        view = await service.describe_group(caller.tenant, group, namespace, name)
        return JSONResponse(group_json(view))
