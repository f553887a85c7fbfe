"""Tenant administration over gRPC (``tidegate.v1.Admin``), with the operator key."""

from __future__ import annotations

import time
from typing import Any, cast

import grpc

from gateway.client._auth import authorized_channel
from gateway.client._channel import (
    DEFAULT_CONNECT_TIMEOUT,
    Reach,
    channel_options,
    normalise_target,
)
from gateway.wire._proto.tidegate.v1 import admin_pb2 as apb
from gateway.wire._proto.tidegate.v1 import admin_pb2_grpc as apb_grpc
from gateway.wire.status import error_from_rpc
from gateway.wire.types import QUOTA_FIELDS, USAGE_FIELDS

__all__ = ["AdminClient"]


class AdminClient:
    """Tenants, keys, quotas, usage and hot-tier placements. Every call needs the operator
    key.

    Example::

        with AdminClient("127.0.0.1:50051", operator_key=op) as admin:
            admin.create_tenant("acme")
            key = admin.issue_key("acme")  # shown once
    """

    def __init__(
        self,
        target: str,
        *,
        operator_key: str,
        timeout: float = 30.0,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self.timeout = timeout
        target, _ = normalise_target(target)
        self.reach = Reach(target, connect_timeout)
        self._channel = grpc.insecure_channel(target, options=channel_options())
        self._stub = apb_grpc.AdminStub(authorized_channel(self._channel, operator_key))

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: Any) -> Any:
        """One call, sent again only while it never left (no connection to a gateway not
        yet reached, within the connect deadline), as the data client's calls are."""
        started = time.monotonic()
        failures = 0
        while True:
            try:
                answer = getattr(self._stub, method)(request, timeout=self.timeout)
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                failures += 1
                delay = self.reach.unsent_delay(err, failures, started)
                if delay is None:
                    raise self.reach.explain(err) from None
                time.sleep(delay)
            else:
                self.reach.ok()
                return answer

    @staticmethod
    def _tenant(info: Any) -> dict[str, Any]:
        return {"name": info.name, "status": info.status, "created_at_ms": info.created_at_ms}

    def create_tenant(self, name: str) -> dict[str, Any]:
        return self._tenant(self._call("CreateTenant", apb.CreateTenantRequest(name=name)))

    def list_tenants(self, *, name_contains: str = "") -> list[dict[str, Any]]:
        """Every tenant by name (whose name holds ``name_contains`` when given): page
        after page."""
        tenants: list[dict[str, Any]] = []
        token = ""
        while True:
            page, token = self.list_tenants_page(page_token=token, name_contains=name_contains)
            tenants.extend(page)
            if not token:
                return tenants

    def list_tenants_page(
        self, *, page_size: int = 0, page_token: str = "", name_contains: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        """One page of tenants by name (``page_size`` 0: the gateway's default, 1,000 at
        most) and the token of the next page ("" after the last)."""
        request = apb.ListTenantsRequest(
            page_size=page_size, page_token=page_token, name_contains=name_contains
        )
        response = self._call("ListTenants", request)
        return [self._tenant(t) for t in response.tenants], response.next_page_token

    def get_tenant(self, name: str) -> dict[str, Any]:
        return self._tenant(self._call("GetTenant", apb.TenantRequest(name=name)))

    def suspend_tenant(self, name: str) -> dict[str, Any]:
        return self._tenant(self._call("SuspendTenant", apb.TenantRequest(name=name)))

    def resume_tenant(self, name: str) -> dict[str, Any]:
        return self._tenant(self._call("ResumeTenant", apb.TenantRequest(name=name)))

    def delete_tenant(self, name: str) -> None:
        self._call("DeleteTenant", apb.TenantRequest(name=name))

    def issue_key(self, tenant: str) -> tuple[str, str]:
        """``(key_id, api_key)``; the full key is never shown again."""
        resp = self._call("IssueKey", apb.TenantRequest(name=tenant))
        return str(resp.key.key_id), str(resp.api_key)

    def revoke_key(self, key_id: str) -> None:
        self._call("RevokeKey", apb.RevokeKeyRequest(key_id=key_id))

    def list_keys(self, tenant: str) -> list[dict[str, Any]]:
        resp = self._call("ListKeys", apb.TenantRequest(name=tenant))
        return [
            {"key_id": k.key_id, "created_at_ms": k.created_at_ms, "revoked": k.revoked}
            for k in resp.keys
        ]

    def set_quota(self, tenant: str, **values: int) -> dict[str, int | None]:
        """Set quotas (``append_bytes_per_s=...``); a negative value means unlimited."""
        unknown = set(values) - set(QUOTA_FIELDS)
        if unknown:
            raise ValueError(f"unknown quota fields {sorted(unknown)}")
        resp = self._call("SetQuota", apb.SetQuotaRequest(tenant=tenant, quota=apb.Quota(**values)))
        return self._quota(resp)

    def get_quota(self, tenant: str) -> dict[str, int | None]:
        """The tenant's own quotas; None: the gateway's configured default."""
        return self._quota(self._call("GetQuota", apb.TenantRequest(name=tenant)))

    @staticmethod
    def _quota(q: Any) -> dict[str, int | None]:
        return {f: (int(getattr(q, f)) if q.HasField(f) else None) for f in QUOTA_FIELDS}

    def usage(self, tenant: str, since_ms: int = 0, until_ms: int = 0) -> list[dict[str, int]]:
        """Usage per minute: ``{"minute_ms", "append_bytes", ...}`` rows, oldest first."""
        resp = self._call(
            "GetUsage", apb.GetUsageRequest(tenant=tenant, since_ms=since_ms, until_ms=until_ms)
        )
        return [
            {"minute_ms": r.minute_ms, **{f: int(getattr(r, f)) for f in USAGE_FIELDS}}
            for r in cast(Any, resp).usage
        ]

    # Hot-tier placement -------------------------------------------------------------------
    def placements(self, tenant: str | None = None) -> dict[str, Any]:
        """``{"shards", "pins" (shard -> tenant), "placements"}``: every partition's chain
        of segments (of one tenant), epoch and move under way."""
        resp = self._call("ListPlacements", apb.ListPlacementsRequest(tenant=tenant or ""))
        return self._placements(resp)

    def move_partition(
        self, tenant: str, table: str, partition: int, target: str
    ) -> dict[str, Any]:
        """Move one partition's appends to shard ``target`` without copying; the move's
        record (``state`` "done", ``source``, ``start`` offset, ``seconds``)."""
        request = apb.MovePartitionRequest(
            tenant=tenant, table=table, partition=partition, target=target
        )
        return self._move(self._call("MovePartition", request))

    def moves(self) -> list[dict[str, Any]]:
        """Moves under way (``pending``: started by anyone, not finished) and the answering
        gateway's recent moves with their outcome (``running``, ``done``, ``failed``)."""
        return [self._move(m) for m in self._call("ListMoves", apb.ListMovesRequest()).moves]

    def pin_shards(self, tenant: str, shards: list[str]) -> dict[str, Any]:
        """Reserve ``shards`` for ``tenant``; answers as :meth:`placements` (the tenant's)."""
        request = apb.PinShardsRequest(tenant=tenant, shards=shards)
        return self._placements(self._call("PinShards", request))

    def unpin_shards(self, tenant: str, shards: list[str] | None = None) -> dict[str, Any]:
        """Release ``tenant``'s reserved ``shards`` (every one when None or empty)."""
        request = apb.PinShardsRequest(tenant=tenant, shards=shards or [])
        return self._placements(self._call("UnpinShards", request))

    @staticmethod
    def _move(m: Any) -> dict[str, Any]:
        return {
            f: getattr(m, f)
            for f in (
                "id", "tenant", "table", "partition", "source", "target", "state", "start",
                "started_at_ms", "seconds", "error",
            )
        }  # fmt: skip

    @staticmethod
    def _placements(resp: Any) -> dict[str, Any]:
        return {
            "shards": list(resp.shards),
            "pins": dict(resp.pins),
            "placements": [
                {
                    "tenant": p.tenant,
                    "table": p.table,
                    "partition": p.partition,
                    "shard": p.shard,
                    "epoch": p.epoch,
                    "move_target": p.move_target or None,
                    "segments": [
                        {
                            "shard": s.shard,
                            "start": s.start,
                            "end": s.end if s.HasField("end") else None,
                        }
                        for s in p.segments
                    ],
                }
                for p in resp.placements
            ],
        }
