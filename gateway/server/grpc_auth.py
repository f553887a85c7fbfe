"""Authentication and fair admission on the gRPC edge, in one interceptor.

Every call of ``tidegate.v1.Tidegate`` must carry ``authorization: Bearer <tenant key>``
metadata: the interceptor resolves the tenant (charging its requests/s), holds one of the
tenant's in-flight slots on this gateway for the call, and exposes the tenant to the
servicer through a context variable. Calls of ``tidegate.v1.Admin`` need the operator key.
Health and reflection stay open.

Follow reads live long by design: they hold a slot of their own bounded pool
(``quota.max_follows``) instead. Append streams hold no slot; each append of a stream is
still charged against the tenant's quotas.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc

from gateway.tenancy import Tenancy
from gateway.wire._proto.tidegate.v1 import admin_pb2
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb

__all__ = ["ADMIN_SERVICE_NAME", "AuthInterceptor", "current_tenant"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Tidegate"].full_name
ADMIN_SERVICE_NAME = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name

_TENANT: ContextVar[str | None] = ContextVar("tidegate_tenant", default=None)


def current_tenant() -> str | None:
    """The tenant of the gRPC call being served (None outside an authenticated call)."""
    return _TENANT.get()


def _authorization(context: Any) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return str(value)
    return None


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None:
            return handler
        tenancy = self.tenancy
        if method.startswith(f"/{ADMIN_SERVICE_NAME}/"):
            inner_admin = handler.unary_unary

            async def admin(request: Any, context: Any) -> Any:
                await tenancy.operator(_authorization(context))
                return await inner_admin(request, context)

            return grpc.unary_unary_rpc_method_handler(
                admin, handler.request_deserializer, handler.response_serializer
            )
        if not method.startswith(f"/{SERVICE_NAME}/"):
            return handler

        if handler.unary_unary:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: Any) -> Any:
                tenant = await tenancy.tenant_of(_authorization(context))
                _TENANT.set(tenant)
                async with tenancy.admit(tenant):
                    return await inner_uu(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, handler.request_deserializer, handler.response_serializer
            )

        if handler.unary_stream:
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                tenant = await tenancy.tenant_of(_authorization(context))
                _TENANT.set(tenant)
                async with tenancy.admit(tenant, follow=bool(getattr(request, "follow", False))):
                    async for item in inner_us(request, context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, handler.request_deserializer, handler.response_serializer
            )

        inner_ss = handler.stream_stream

        async def stream_stream(request_iterator: Any, context: Any) -> AsyncIterator[Any]:
            tenant = await tenancy.tenant_of(_authorization(context))
            _TENANT.set(tenant)
            async for item in inner_ss(request_iterator, context):
                yield item

        return grpc.stream_stream_rpc_method_handler(
            stream_stream, handler.request_deserializer, handler.response_serializer
        )
