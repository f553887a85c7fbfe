"""How an HTTP route learns who is calling: one dependency, :data:`Caller`.

It asks the app's ``tenant_of`` resolver (by default the :class:`~gateway.tenancy.Gate`:
the tenant of the ``authorization: Bearer <key>`` header, charged one request), then holds
one of the tenant's in-flight slots on this gateway until the answer is sent (long polls
hold one of their own pool).

FastAPI reads and validates a route's body model before any dependency runs, so the
data-plane routers use :class:`CallerRoute`, which does that work from the headers before
the body is read and then lets the route read up to ``server.max_body_bytes``
(:mod:`gateway.server.http.guard`); the dependency hands on what it found. The admin
router's :func:`operator_route` checks the operator key the same way.

The credentials are also declared as OpenAPI security schemes (:data:`TENANT_KEY`,
:data:`OPERATOR_KEY`, :data:`METRICS_TOKEN`), so the document says which routes need which key
and Swagger UI's "Authorize" sends it. The declarations check nothing (``auto_error=False``):
the gate does, with its own errors.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request, Response, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.server.http.guard import allow_body
from gateway.tenancy import Gate, Tenancy

__all__ = [
    "METRICS_TOKEN",
    "OPERATOR_KEY",
    "TENANT_KEY",
    "Caller",
    "CallerInfo",
    "CallerRoute",
    "Credential",
    "Name",
    "NameContains",
    "Namespace",
    "PageSize",
    "PageToken",
    "TenantOf",
    "gate_tenant_of",
    "operator_route",
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


#: Where :class:`CallerRoute` leaves the caller it found, for :data:`Caller`.
_CALLER = "tidegate.caller"


@contextlib.asynccontextmanager
async def _admitted(request: Request) -> AsyncIterator[CallerInfo]:
    """The request's caller, holding one of the tenant's slots on this gateway."""
    resolver: TenantOf = request.app.state.tenant_of
    found = resolver(request)
    tenant = await found if inspect.isawaitable(found) else found
    gate: Gate = request.app.state.gate
    follow = request.query_params.get("follow", "").lower() in ("true", "1", "yes", "on")
    async with gate.admit(tenant, follow=follow):
        yield CallerInfo(tenant, request.headers.get("authorization"))


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def _before_body(
    handler: Handler, enter: Callable[[Request], contextlib.AbstractAsyncContextManager[Any]]
) -> Handler:
    """``handler`` run after ``enter(request)`` (held until the answer is sent, as a
    dependency's would be), and allowed a body of ``server.max_body_bytes`` only then."""

    async def app(request: Request) -> Response:
        stack = request.scope.get("fastapi_inner_astack")
        assert isinstance(stack, AsyncExitStack), "FastAPI's request stack is missing"
        request.scope[_CALLER] = await stack.enter_async_context(enter(request))
        allow_body(request, request.app.state.max_body_bytes)
        return await handler(request)

    return app


class CallerRoute(APIRoute):
    """A data-plane route: its caller is authenticated, charged and admitted from the
    headers before FastAPI reads the body."""

    def get_route_handler(self) -> Handler:
        return _before_body(super().get_route_handler(), _admitted)


def operator_route(tenancy: Tenancy) -> type[APIRoute]:
    """The route class of the admin API: the operator key is checked from the headers
    before FastAPI reads the body."""

    @contextlib.asynccontextmanager
    async def operator(request: Request) -> AsyncIterator[None]:
        await tenancy.operator(request.headers.get("authorization"))
        yield None

    class OperatorRoute(APIRoute):
        def get_route_handler(self) -> Handler:
            return _before_body(super().get_route_handler(), operator)

    return OperatorRoute


async def _caller(
    request: Request, _key: Annotated[Credential, Security(TENANT_KEY)]
) -> AsyncIterator[CallerInfo]:
    found = request.scope.get(_CALLER)
    if isinstance(found, CallerInfo):  # a CallerRoute already did the work
        yield found
        return
    async with _admitted(request) as info:
        yield info


# Annotated parameter types shared by the routes (module level, so FastAPI resolves them).
Caller = Annotated[CallerInfo, Depends(_caller)]
Namespace = Annotated[str, Path(description="Namespace of the table.")]
Name = Annotated[str, Path(description="Table name.")]
#: The paging of a listing (gateway.core.paging): ``page_size``, ``page_token``, and a
#: search in names, as query parameters.
PageSize = Annotated[
    int | None,
    Query(description="Items in a page (default and most: 1,000).", ge=0, le=2**31 - 1),
]
PageToken = Annotated[
    str | None,
    Query(description="The next_page_token of the previous page; none for the first page."),
]
NameContains = Annotated[
    str | None, Query(description="Only items whose name holds this text (any case).")
]
