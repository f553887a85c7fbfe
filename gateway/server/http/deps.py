"""How an HTTP route learns who is calling: one dependency, :data:`Caller`.

It asks the app's ``tenant_of`` resolver (by default the :class:`~gateway.tenancy.Gate`:
the tenant of the ``authorization: Bearer <key>`` header, charged one request), then holds
one of the tenant's in-flight slots on this gateway until the route returns (long polls hold
one of their own pool).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Request

from gateway.tenancy import Gate

__all__ = ["Caller", "CallerInfo", "Name", "Namespace", "TenantOf", "gate_tenant_of"]

#: A request's tenant from the request (the app's resolver).
TenantOf = Callable[[Request], str | Awaitable[str]]


@dataclass(frozen=True, slots=True)
class CallerInfo:
    tenant: str
    authorization: str | None


def gate_tenant_of(gate: Gate) -> TenantOf:
    """The resolver of a gateway: the tenant the gate finds for the request's key."""

    async def tenant_of(request: Request) -> str:
        return await gate.tenant_of(request.headers.get("authorization"))

    return tenant_of


async def _caller(request: Request) -> AsyncIterator[CallerInfo]:
    resolver: TenantOf = request.app.state.tenant_of
    found = resolver(request)
    tenant = await found if inspect.isawaitable(found) else found
    gate: Gate = request.app.state.gate
    follow = request.query_params.get("follow", "").lower() in ("true", "1", "yes", "on")
    async with gate.admit(tenant, follow=follow):
        yield CallerInfo(tenant, request.headers.get("authorization"))


# Annotated parameter types shared by the routes (module level, so FastAPI resolves them).
Caller = Annotated[CallerInfo, Depends(_caller)]
Namespace = Annotated[str, Path(description="Namespace of the table.")]
Name = Annotated[str, Path(description="Table name.")]
