"""``/v1/admin``: tenants, API keys, quotas, usage and hot-tier placements over HTTP
(operator key only).

Mirrors the ``tidegate.v1.Admin`` gRPC service. A tenant
key is refused with 403 ``PERMISSION_DENIED``, a missing or wrong key with 401
``UNAUTHENTICATED``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Security
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from gateway.server.http.deps import (
    OPERATOR_KEY,
    NameContains,
    PageSize,
    PageToken,
    operator_route,
)
from gateway.tenancy import KeyInfo, Tenancy, TenantInfo
from gateway.wire.types import QUOTA_FIELDS

__all__ = ["admin_router"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CreateTenantRequest(_Request):
    name: str = Field(description="Tenant name: a letter, then letters, digits, '_' or '-'.")


class MoveRequest(_Request):
    tenant: str = Field(description="The tenant owning the table.")
    table: str = Field(description="The table, as namespace.name.")
    partition: int = Field(ge=0, description="The partition to move.")
    target: str = Field(description="The hot-tier shard to take its appends from now on.")


class ShardsBody(_Request):
    shards: list[str] = Field(
        default_factory=list,
        description="Shard names. To release: empty releases every shard of the tenant.",
    )


class QuotaBody(_Request):
    """Quotas to set. An absent field is left as is; null returns it to the configured
    default; a negative value means unlimited."""

    append_bytes_per_s: int | None = None
    read_bytes_per_s: int | None = None
    requests_per_s: int | None = None
    max_tables: int | None = None
    max_partitions: int | None = None
    max_hot_bytes: int | None = None


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _tenant(info: TenantInfo) -> dict[str, Any]:
    return {"name": info.name, "status": info.status, "created_at": _iso(info.created_at)}


def _key(info: KeyInfo) -> dict[str, Any]:
    return {
        "key_id": info.key_id,
        "tenant": info.tenant,
        "created_at": _iso(info.created_at),
        "revoked": info.revoked,
    }


TenantName = Annotated[str, Path(description="Tenant name.")]


def admin_router(tenancy: Tenancy) -> APIRouter:
    # The route class checks the operator key before any body is read; the declared
    # security scheme only documents it.
    router = APIRouter(
        prefix="/v1/admin",
        tags=["admin"],
        route_class=operator_route(tenancy),
        dependencies=[Security(OPERATOR_KEY)],
    )
    _tenant_routes(router, tenancy)
    _key_and_quota_routes(router, tenancy)
    _placement_routes(router, tenancy)
    _usage_route(router, tenancy)
    return router


def _tenant_routes(router: APIRouter, tenancy: Tenancy) -> None:
    @router.post("/tenants", status_code=201, summary="Create a tenant.")
    async def create_tenant(body: CreateTenantRequest) -> JSONResponse:
        return JSONResponse(_tenant(await tenancy.admin.create_tenant(body.name)), status_code=201)

    @router.get("/tenants", summary="List tenants by name, a page at a time.")
    async def list_tenants(
        page_size: PageSize = None,
        page_token: PageToken = None,
        name_contains: NameContains = None,
    ) -> JSONResponse:
        page = await tenancy.admin.list_tenants_page(page_size, page_token, name_contains)
        return JSONResponse(
            {
                "tenants": [_tenant(t) for t in page.items],
                "next_page_token": page.next_page_token,
            }
        )

    @router.get("/tenants/{tenant}", summary="A tenant and its status.")
    async def get_tenant(tenant: TenantName) -> JSONResponse:
        return JSONResponse(_tenant(await tenancy.admin.get_tenant(tenant)))

    @router.post("/tenants/{tenant}/suspend", summary="Refuse every request of the tenant.")
    async def suspend(tenant: TenantName) -> JSONResponse:
        return JSONResponse(_tenant(await tenancy.admin.suspend(tenant)))

    @router.post("/tenants/{tenant}/resume", summary="Serve a suspended tenant again.")
    async def resume(tenant: TenantName) -> JSONResponse:
        return JSONResponse(_tenant(await tenancy.admin.resume(tenant)))

    @router.delete(
        "/tenants/{tenant}",
        status_code=204,
        response_class=Response,
        summary="Delete the tenant: its tables in every tier, keys, quotas, usage.",
    )
    async def delete_tenant(tenant: TenantName) -> Response:
        await tenancy.admin.delete_tenant(tenant)
        return Response(status_code=204)


def _key_and_quota_routes(router: APIRouter, tenancy: Tenancy) -> None:
    @router.post(
        "/tenants/{tenant}/keys",
        status_code=201,
        summary="Issue an API key; the full key is in this answer only.",
    )
    async def issue_key(tenant: TenantName) -> JSONResponse:
        info, key = await tenancy.admin.issue_key(tenant)
        return JSONResponse({**_key(info), "api_key": key}, status_code=201)

    @router.get("/tenants/{tenant}/keys", summary="The tenant's keys (ids only).")
    async def list_keys(tenant: TenantName) -> JSONResponse:
        return JSONResponse({"keys": [_key(k) for k in await tenancy.admin.list_keys(tenant)]})

    @router.delete(
        "/keys/{key_id}", status_code=204, response_class=Response, summary="Revoke a key."
    )
    async def revoke_key(key_id: Annotated[str, Path()]) -> Response:
        await tenancy.admin.revoke_key(key_id)
        return Response(status_code=204)

    @router.get("/tenants/{tenant}/quota", summary="The tenant's own quotas (null: default).")
    async def get_quota(tenant: TenantName) -> JSONResponse:
        return JSONResponse(await tenancy.admin.get_quota(tenant))

    @router.put("/tenants/{tenant}/quota", summary="Set some of the tenant's quotas.")
    async def set_quota(tenant: TenantName, body: QuotaBody) -> JSONResponse:
        values = {f: getattr(body, f) for f in QUOTA_FIELDS if f in body.model_fields_set}
        return JSONResponse(await tenancy.admin.set_quota(tenant, values))


def _placement_routes(router: APIRouter, tenancy: Tenancy) -> None:
    """Hot-tier placements, partition moves and reserved shards."""

    @router.get("/placements", summary="Partitions' hot-tier placements and reserved shards.")
    async def placements(
        tenant: Annotated[str | None, Query(description="Only this tenant's.")] = None,
    ) -> JSONResponse:
        return JSONResponse(await tenancy.admin.placements(tenant))

    @router.post("/placements/move", summary="Move a partition to another shard, without copying.")
    async def move(body: MoveRequest) -> JSONResponse:
        return JSONResponse(
            await tenancy.admin.move_partition(body.tenant, body.table, body.partition, body.target)
        )

    @router.get("/moves", summary="Moves under way and this gateway's recent moves.")
    async def moves() -> JSONResponse:
        return JSONResponse({"moves": await tenancy.admin.moves()})

    @router.put(
        "/tenants/{tenant}/shards",
        summary="Reserve shards for the tenant: its new partitions go only there, nobody "
        "else's do.",
    )
    async def pin_shards(tenant: TenantName, body: ShardsBody) -> JSONResponse:
        return JSONResponse(await tenancy.admin.pin_shards(tenant, body.shards))

    @router.post(
        "/tenants/{tenant}/shards/release",
        summary="Release the tenant's reserved shards (every one when none is named).",
    )
    async def unpin_shards(tenant: TenantName, body: ShardsBody) -> JSONResponse:
        return JSONResponse(await tenancy.admin.unpin_shards(tenant, body.shards))


def _usage_route(router: APIRouter, tenancy: Tenancy) -> None:
    @router.get("/tenants/{tenant}/usage", summary="The tenant's usage per minute.")
    async def usage(
        tenant: TenantName,
        since_ms: Annotated[int | None, Query(description="From this minute (ms).")] = None,
        until_ms: Annotated[int | None, Query(description="Before this minute (ms).")] = None,
    ) -> JSONResponse:
        rows = await tenancy.admin.usage(tenant, since_ms, until_ms)
        return JSONResponse(
            {
                "tenant": tenant,
                "usage": [{"minute": _iso(r.minute), **r.counters} for r in rows],
            }
        )
