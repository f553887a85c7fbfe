"""The gRPC edge's cross-cutting work, in one interceptor: who is calling, admission, and
the translation of every escaping error into a rich status.

Every call of ``tidegate.v1.Tidegate`` must carry ``authorization: Bearer <tenant key>``
metadata: the interceptor resolves the tenant through the :class:`~gateway.tenancy.Gate`
(charging its requests/s), holds one of the tenant's in-flight slots on this gateway for
the call (follow reads hold one of their own bounded pool; append streams hold none, each
append being charged on its own), and exposes the caller to the servicer through
:func:`current_call`. Calls of ``tidegate.v1.Admin`` need the operator key. Health and
reflection stay open.

An error becomes its gRPC status with a ``google.rpc.Status`` in the
``grpc-status-details-bin`` trailer (``ErrorInfo``, and ``RetryInfo`` for retryable
errors); anything unexpected is logged and answered INTERNAL
(:func:`gateway.server.calls.wire_error`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc

from gateway import metrics
from gateway.server.calls import wire_error
from gateway.tenancy import Gate, Tenancy
from gateway.wire._proto.tidegate.v1 import admin_pb2
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import PermissionDenied, TidegateError
from gateway.wire.status import STATUS_DETAILS_KEY, error_to_status

__all__ = ["ADMIN_SERVICE_NAME", "SERVICE_NAME", "CallInterceptor", "Caller", "current_call"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Tidegate"].full_name
ADMIN_SERVICE_NAME = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a data-plane call comes from: its tenant and the credential it presented."""

    tenant: str
    authorization: str | None


_CALL: ContextVar[Caller | None] = ContextVar("tidegate_call", default=None)


def current_call() -> Caller:
    """The caller of the gRPC call being served (set by :class:`CallInterceptor`)."""
    caller = _CALL.get()
    if caller is None:  # pragma: no cover - every data-plane call passes the interceptor
        raise RuntimeError("no authenticated call in this context")
    return caller


def _authorization(context: Any) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return str(value)
    return None


async def _abort(context: grpc.aio.ServicerContext[Any, Any], err: TidegateError) -> None:
    await context.abort(
        err.grpc_code,
        err.message,
        trailing_metadata=((STATUS_DETAILS_KEY, error_to_status(err).SerializeToString()),),
    )


def _code_of(context: Any) -> str:
    """The status an aborted call ended with (``UNKNOWN`` when the context cannot say)."""
    try:
        code = context.code()
    except Exception:  # an aborted context that no longer answers
        return "UNKNOWN"
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


class CallInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    async def _enter(self, context: Any, admin: bool) -> Caller | None:
        authorization = _authorization(context)
        if admin:
            if not isinstance(self.gate, Tenancy):  # pragma: no cover - not registered then
                raise PermissionDenied("this gateway has no admin API")
            await self.gate.operator(authorization)
            return None
        caller = Caller(await self.gate.tenant_of(authorization), authorization)
        _CALL.set(caller)
        return caller

    def _slot(
        self, caller: Caller | None, follow: bool
    ) -> contextlib.AbstractAsyncContextManager[None]:
        if caller is None:
            return contextlib.nullcontext()
        return self.gate.admit(caller.tenant, follow=follow)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        admin = method.startswith(f"/{ADMIN_SERVICE_NAME}/")
        name = method.rsplit("/", 1)[-1]
        if handler is None or not (admin or method.startswith(f"/{SERVICE_NAME}/")):
            return handler

        if handler.unary_unary:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: Any) -> Any:
                started, code = time.perf_counter(), "OK"
                try:
                    caller = await self._enter(context, admin)
                    async with self._slot(caller, follow=False):
                        return await inner_uu(request, context)
                except (grpc.aio.AbortError, grpc.aio.UsageError):
                    code = _code_of(context)
                    raise
                except Exception as exc:
                    err = wire_error(exc, method)
                    code = err.grpc_code.name
                    await _abort(context, err)
                finally:
                    metrics.observe_grpc_request(name, code, time.perf_counter() - started)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, handler.request_deserializer, handler.response_serializer
            )

        inner_stream = handler.unary_stream or handler.stream_stream
        takes_slot = handler.unary_stream is not None

        async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
            started, code = time.perf_counter(), "OK"
            try:
                caller = await self._enter(context, admin)
                slot = (
                    self._slot(caller, follow=bool(getattr(request, "follow", False)))
                    if takes_slot
                    else contextlib.nullcontext()
                )
                async with slot:
                    async for item in inner_stream(request, context):
                        yield item
            except (grpc.aio.AbortError, grpc.aio.UsageError):
                code = _code_of(context)
                raise
            except Exception as exc:
                err = wire_error(exc, method)
                code = err.grpc_code.name
                await _abort(context, err)
            finally:
                metrics.observe_grpc_request(name, code, time.perf_counter() - started)

        make = (
            grpc.unary_stream_rpc_method_handler
            if handler.unary_stream
            else grpc.stream_stream_rpc_method_handler
        )
        return make(streaming, handler.request_deserializer, handler.response_serializer)
