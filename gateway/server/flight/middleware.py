"""Who is calling a Flight call: every call's key resolved to its tenant before the call
runs, as the gRPC interceptor does."""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow.flight as fl

from gateway.tenancy import Gate

__all__ = ["Auth", "Caller", "LoopEdge"]


class LoopEdge(Protocol):
    """What the middleware needs of the edge: its gate, and a way to run the gate's
    coroutines on the gateway's loop."""

    gate: Gate

    def on_loop(self, coro: Any) -> Any: ...


class Caller(fl.ServerMiddleware):  # type: ignore[misc]
    def __init__(self, tenant: str, authorization: str | None) -> None:
        self.tenant = tenant
        self.authorization = authorization


class Auth(fl.ServerMiddlewareFactory):  # type: ignore[misc]
    """Resolves every call's key to its tenant (and counts the request) before the call
    runs, as the gRPC interceptor does."""

    def __init__(self, edge: LoopEdge) -> None:
        super().__init__()
        self.edge = edge

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> Caller:
        values = headers.get("authorization") or [None]
        raw = values[0]
        authorization = raw.decode() if isinstance(raw, bytes) else raw
        tenant = self.edge.on_loop(self.edge.gate.tenant_of(authorization))
        return Caller(tenant, authorization)
