"""``/v1/groups/{group}/tables/{namespace}/{name}/offsets``: consumer-group offsets."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse

from gateway.server.calls import DataCalls
from gateway.server.http.deps import Caller, CallerRoute, Name, Namespace
from gateway.server.http.models import ERRORS, CommitOffsetsRequest, GroupList, GroupOffsets
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


def groups_router(calls: DataCalls) -> APIRouter:
    router = APIRouter(prefix="/v1/groups", tags=["groups"], route_class=CallerRoute)
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
        responses=ERRORS,
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
        await service.commit_offsets(caller.tenant, group, namespace, name, offsets)
        got = await service.fetch_offsets(caller.tenant, group, namespace, name)
        return _offsets(group, namespace, name, got)

    return router
