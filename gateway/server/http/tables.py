"""``/v1/tables``: create, list, describe and drop tables."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from gateway.server.calls import DataCalls
from gateway.server.http.bodies import describe
from gateway.server.http.deps import (
    Caller,
    CallerRoute,
    Name,
    NameContains,
    Namespace,
    PageSize,
    PageToken,
)
from gateway.server.http.models import (
    ERRORS,
    AlterSchemaRequest,
    AlterTableRequest,
    CreateTableRequest,
    ErrorResponse,
    SnapshotList,
    TableDescription,
    TableList,
)

__all__ = ["tables_router"]


def tables_router(calls: DataCalls) -> APIRouter:
    router = APIRouter(prefix="/v1/tables", tags=["tables"], route_class=CallerRoute)
    _table_list_routes(router, calls)
    _table_change_routes(router, calls)
    return router


def _table_list_routes(router: APIRouter, calls: DataCalls) -> None:
    """Creating, listing and describing tables."""
    service = calls.service

    @router.post(
        "",
        status_code=201,
        response_model=TableDescription,
        responses={**ERRORS, 409: {"model": ErrorResponse, "description": "Name taken"}},
        summary="Create a table.",
    )
    async def create_table(body: CreateTableRequest, caller: Caller) -> JSONResponse:
        spec: Any = (
            dict(body.schema_)
            if isinstance(body.schema_, dict)
            else [f.model_dump() for f in body.schema_]
        )
        view = await calls.create_table(
            caller.tenant,
            body.namespace,
            body.name,
            spec,
            body.partitions,
            body.key_columns,
            retention_ms=body.retention_ms,
            retention_records=body.retention_records,
            primary_key=body.primary_key,
            merge_engine=body.merge_engine,
        )
        return JSONResponse(describe(view, with_partitions=True), status_code=201)

    @router.get(
        "",
        response_model=TableList,
        responses=ERRORS,
        summary="List the tenant's tables by namespace and name, a page at a time.",
    )
    async def list_tables(
        caller: Caller,
        namespace: Annotated[str | None, Query(description="Only this namespace.")] = None,
        page_size: PageSize = None,
        page_token: PageToken = None,
        name_contains: NameContains = None,
    ) -> JSONResponse:
        page = await service.list_tables_page(
            caller.tenant, namespace, page_size, page_token, name_contains
        )
        return JSONResponse(
            {
                "tables": [describe(v, with_partitions=False) for v in page.items],
                "next_page_token": page.next_page_token,
            }
        )

    @router.get(
        "/{namespace}/{name}",
        response_model=TableDescription,
        responses=ERRORS,
        summary="Describe a table with its live per-partition offsets.",
    )
    async def describe_table(namespace: Namespace, name: Name, caller: Caller) -> JSONResponse:
        view = await service.describe_table(caller.tenant, namespace, name)
        return JSONResponse(describe(view, with_partitions=True))


def _table_change_routes(router: APIRouter, calls: DataCalls) -> None:
    """A table's options, schema, snapshots, and dropping it."""
    service = calls.service

    @router.patch(
        "/{namespace}/{name}",
        response_model=TableDescription,
        responses=ERRORS,
        summary="Change the table's options: retention_ms, retention_records.",
    )
    async def alter_table(
        body: AlterTableRequest, namespace: Namespace, name: Name, caller: Caller
    ) -> JSONResponse:
        """A field given replaces the option (0 removes that limit); a field left out
        keeps it. The retention job applies a new retention at its next run."""
        view = await service.set_retention(
            caller.tenant, namespace, name, body.retention_ms, body.retention_records
        )
        return JSONResponse(describe(view, with_partitions=True))

    @router.post(
        "/{namespace}/{name}/schema",
        response_model=TableDescription,
        responses={**ERRORS, 409: {"model": ErrorResponse, "description": "A concurrent change"}},
        summary="Evolve the table's schema: add nullable columns, widen int32 to int64 or "
        "float32 to float64, make columns optional, change column docs.",
    )
    async def alter_schema(
        body: AlterSchemaRequest, namespace: Namespace, name: Name, caller: Caller
    ) -> JSONResponse:
        """Apply the changes in order, to the Iceberg table and the gateway's metadata in
        one step; rows written before read under the new schema (an added column as
        null). Any other change (drop, rename, narrowing, another type change) is
        refused with ``SCHEMA_CHANGE_REFUSED`` and nothing changes."""
        changes = [c.model_dump(exclude_unset=True) for c in body.changes]
        view = await service.alter_schema(caller.tenant, namespace, name, changes)
        return JSONResponse(describe(view, with_partitions=True))

    @router.get(
        "/{namespace}/{name}/snapshots",
        response_model=SnapshotList,
        responses=ERRORS,
        summary="The table's Iceberg snapshots, oldest first (what as_of can name).",
    )
    async def list_snapshots(namespace: Namespace, name: Name, caller: Caller) -> JSONResponse:
        snaps = await service.list_snapshots(caller.tenant, namespace, name)
        return JSONResponse(
            {
                "snapshots": [
                    {
                        "snapshot_id": s.snapshot_id,
                        "timestamp_ms": s.timestamp_ms,
                        "operation": s.operation,
                        "summary": dict(s.summary),
                    }
                    for s in snaps
                ]
            }
        )

    @router.delete(
        "/{namespace}/{name}",
        status_code=204,
        response_class=Response,
        responses=ERRORS,
        summary="Drop a table and its hot data.",
    )
    async def drop_table(namespace: Namespace, name: Name, caller: Caller) -> Response:
        await service.drop_table(caller.tenant, namespace, name)
        return Response(status_code=204)
