"""The ``tidegate.v1.Admin`` gRPC service: tenants, keys, quotas, usage and hot-tier
placements (partitions' segments, moves, reserved shards).

The auth interceptor lets only the operator key through; errors are translated by the
same error interceptor as the data plane.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gateway.tenancy import KeyInfo, Tenancy, TenantInfo
from gateway.wire._proto.tidegate.v1 import admin_pb2 as apb
from gateway.wire._proto.tidegate.v1 import admin_pb2_grpc as apb_grpc
from gateway.wire.types import QUOTA_FIELDS

__all__ = ["AdminServicer"]


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def _tenant(info: TenantInfo) -> apb.TenantInfo:
    return apb.TenantInfo(name=info.name, status=info.status, created_at_ms=_ms(info.created_at))


def _key(info: KeyInfo) -> apb.KeyInfo:
    return apb.KeyInfo(
        key_id=info.key_id,
        tenant=info.tenant,
        created_at_ms=_ms(info.created_at),
        revoked=info.revoked,
    )


def _quota(values: dict[str, int | None]) -> apb.Quota:
    return apb.Quota(**{k: v for k, v in values.items() if v is not None})


class AdminServicer(apb_grpc.AdminServicer):  # type: ignore[misc]
    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy

    async def CreateTenant(self, request: apb.CreateTenantRequest, context: Any) -> apb.TenantInfo:
        return _tenant(await self.tenancy.admin.create_tenant(request.name))

    async def ListTenants(
        self, request: apb.ListTenantsRequest, context: Any
    ) -> apb.ListTenantsResponse:
        page = await self.tenancy.admin.list_tenants_page(
            request.page_size, request.page_token, request.name_contains
        )
        return apb.ListTenantsResponse(
            tenants=[_tenant(t) for t in page.items], next_page_token=page.next_page_token
        )

    async def GetTenant(self, request: apb.TenantRequest, context: Any) -> apb.TenantInfo:
        return _tenant(await self.tenancy.admin.get_tenant(request.name))

    async def SuspendTenant(self, request: apb.TenantRequest, context: Any) -> apb.TenantInfo:
        return _tenant(await self.tenancy.admin.suspend(request.name))

    async def ResumeTenant(self, request: apb.TenantRequest, context: Any) -> apb.TenantInfo:
        return _tenant(await self.tenancy.admin.resume(request.name))

    async def DeleteTenant(
        self, request: apb.TenantRequest, context: Any
    ) -> apb.DeleteTenantResponse:
        await self.tenancy.admin.delete_tenant(request.name)
        return apb.DeleteTenantResponse()

    async def IssueKey(self, request: apb.TenantRequest, context: Any) -> apb.IssueKeyResponse:
        info, key = await self.tenancy.admin.issue_key(request.name)
        return apb.IssueKeyResponse(key=_key(info), api_key=key)

    async def RevokeKey(self, request: apb.RevokeKeyRequest, context: Any) -> apb.RevokeKeyResponse:
        await self.tenancy.admin.revoke_key(request.key_id)
        return apb.RevokeKeyResponse()

    async def ListKeys(self, request: apb.TenantRequest, context: Any) -> apb.ListKeysResponse:
        keys = await self.tenancy.admin.list_keys(request.name)
        return apb.ListKeysResponse(keys=[_key(k) for k in keys])

    async def SetQuota(self, request: apb.SetQuotaRequest, context: Any) -> apb.Quota:
        values: dict[str, int | None] = {}
        for f in QUOTA_FIELDS:
            if request.quota.HasField(f):
                values[f] = int(getattr(request.quota, f))
        return _quota(await self.tenancy.admin.set_quota(request.tenant, values))

    async def GetQuota(self, request: apb.TenantRequest, context: Any) -> apb.Quota:
        return _quota(await self.tenancy.admin.get_quota(request.name))

    async def GetUsage(self, request: apb.GetUsageRequest, context: Any) -> apb.GetUsageResponse:
        rows = await self.tenancy.admin.usage(request.tenant, request.since_ms, request.until_ms)
        return apb.GetUsageResponse(
            tenant=request.tenant,
            usage=[apb.UsageRecord(minute_ms=_ms(r.minute), **r.counters) for r in rows],
        )

    # Hot-tier placement ------------------------------------------------------------------
    async def ListPlacements(
        self, request: apb.ListPlacementsRequest, context: Any
    ) -> apb.ListPlacementsResponse:
        return _placements(await self.tenancy.admin.placements(request.tenant or None))

    async def MovePartition(self, request: apb.MovePartitionRequest, context: Any) -> apb.MoveInfo:
        moved = await self.tenancy.admin.move_partition(
            request.tenant, request.table, request.partition, request.target
        )
        return apb.MoveInfo(**moved["move"])

    async def ListMoves(self, request: apb.ListMovesRequest, context: Any) -> apb.ListMovesResponse:
        return apb.ListMovesResponse(
            moves=[apb.MoveInfo(**m) for m in await self.tenancy.admin.moves()]
        )

    async def PinShards(
        self, request: apb.PinShardsRequest, context: Any
    ) -> apb.ListPlacementsResponse:
        return _placements(
            await self.tenancy.admin.pin_shards(request.tenant, list(request.shards))
        )

    async def UnpinShards(
        self, request: apb.PinShardsRequest, context: Any
    ) -> apb.ListPlacementsResponse:
        return _placements(
            await self.tenancy.admin.unpin_shards(request.tenant, list(request.shards))
        )


def _placements(listing: dict[str, Any]) -> apb.ListPlacementsResponse:
    return apb.ListPlacementsResponse(
        shards=listing["shards"],
        pins=listing["pins"],
        placements=[
            apb.Placement(
                tenant=p["tenant"],
                table=p["table"],
                partition=p["partition"],
                shard=p["shard"],
                epoch=p["epoch"],
                move_target=p["move_target"] or "",
                segments=[
                    apb.Segment(**{k: v for k, v in s.items() if v is not None})
                    for s in p["segments"]
                ],
            )
            for p in listing["placements"]
        ],
    )
