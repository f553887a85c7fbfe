"""How an HTTP route learns who is calling: one dependency, :data:`Caller`.

It asks the app's ``tenant_of`` resolver (by default the :class:`~gateway.tenancy.Gate`:
the tenant of the ``authorization: Bearer <key>`` header, charged one request), then holds
one of the tenant's in-flight slots on this gateway until the route returns (long polls hold
one of their own pool).

The credentials are also declared as OpenAPI security schemes (:data:`TENANT_KEY`,
:data:`OPERATOR_KEY`, :data:`METRICS_TOKEN`), so the document says which routes need which key
and Swagger UI's "Authorize" sends it. The declarations check nothing (``auto_error=False``):
the gate does, with its own errors.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.tenancy import Gate

__all__ = [
    "METRICS_TOKEN",
    "OPERATOR_KEY",
    "TENANT_KEY",
    "Caller",
    "CallerInfo",
    "Credential",
    "Name",
    "Namespace",
    "TenantOf",
    "gate_tenant_of",
]

TENANT_KEY = HTTPBearer(
    scheme_name="tenantKey",
    bearerFormat="tg_<key id>_<secret>",
    description="A tenant's API key (`tidegate tenant key issue <tenant>`), sent as "
    "`authorization: Bearer <key>`; every data-plane route needs one.",
    auto_error=False,
)
OPERATOR_KEY = HTTPBearer(
    scheme_name="operatorKey",
    description="The operator key (printed at first start, kept in <data_dir>/operator.key), "
    "for the /v1/admin routes only.",
    auto_error=False,
)
METRICS_TOKEN = HTTPBearer(
    scheme_name="metricsToken",
    description="server.metrics_token, when it is set, for /metrics.",
    auto_error=False,
)
#: What a route declares as its credential (the document only: the gate checks it).
Credential = HTTPAuthorizationCredentials | None

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


async def _caller(
    request: Request, _key: Annotated[Credential, Security(TENANT_KEY)]
) -> AsyncIterator[CallerInfo]:
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
