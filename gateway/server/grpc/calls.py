"""The gRPC edge's cross-cutting work, in one interceptor: who is calling, admission, and
the translation of every escaping error into a rich status.

Every call of ``tidegate.v1.Tidegate`` must carry ``authorization: Bearer <tenant key>``
metadata: the interceptor resolves the tenant through the :class:`~gateway.tenancy.Gate`
(charging its requests/s), holds one of the tenant's in-flight slots on this gateway for
the call (follow reads hold one of their own bounded pool, append streams one of theirs,
each message of which is charged as a request on its own), and exposes the caller to the
servicer through :func:`current_call`. Calls of ``tidegate.v1.Admin`` need the operator
key. Health and reflection stay open.

All of that is decided from the call's metadata, before its request is read: a call
refused then (no or a bad key, over requests/s, no free slot, appends refused for a while
after a throttle) is answered by a handler that never receives the request message, so a
stranger's or an over-quota tenant's 60 MiB append costs the gateway neither the memory of
the message nor the CPU of decoding it.

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
from gateway.wire.errors import PermissionDenied, Throttled, TidegateError
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


def _authorization(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


#: Data-plane methods whose kind of call is known before the request is read (``Read`` is
#: an ordinary call or a follow read, which its request says): the keyword arguments of
#: :meth:`Gate.refuse_early` for them.
_EARLY: dict[str, dict[str, bool]] = {
    "Append": {"append": True},
    "AppendStream": {"stream": True},
}
_LATE = frozenset({"Read"})


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


#: Longest a refusal is answered again, as it was, to the same credential's calls of a
#: method (never past the retry hint it carries).
REFUSAL_REUSE_S = 0.25
_REFUSALS_KEPT = 10_000


class CallInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        #: (credential, method) -> (until, tenant, the refusing handler): a tenant far over
        #: its quota is answered, until then, by a lookup instead of authentication,
        #: quota checks, an exception and a new status for each call.
        self._refusals: dict[tuple[str | None, str], tuple[float, str, Any]] = {}

    async def _enter(self, authorization: str | None, admin: bool) -> Caller | None:
        """The caller of a call, from its metadata alone (None for the operator)."""
        if admin:
            if not isinstance(self.gate, Tenancy):  # pragma: no cover - not registered then
                raise PermissionDenied("this gateway has no admin API")
            await self.gate.operator(authorization)
            return None
        return Caller(await self.gate.tenant_of(authorization), authorization)

    def _slot(
        self, caller: Caller | None, *, follow: bool = False, stream: bool = False
    ) -> contextlib.AbstractAsyncContextManager[None]:
        if caller is None:
            return contextlib.nullcontext()
        return self.gate.admit(caller.tenant, follow=follow, stream=stream)

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

        started = time.perf_counter()
        authorization = _authorization(details.invocation_metadata)
        known = self._refusals.get((authorization, method))
        if known is not None:
            if known[0] > started:
                self.gate.count_refused(known[1])
                return known[2]
            del self._refusals[(authorization, method)]
        caller: Caller | None = None
        try:
            caller = await self._enter(authorization, admin)
            if caller is not None and name not in _LATE:
                self.gate.refuse_early(caller.tenant, **_EARLY.get(name, {}))
        except Exception as exc:
            err = wire_error(exc, method)
            refusal = _refusal(handler, err, name, started)
            if (
                caller is not None
                and isinstance(err, Throttled)
                and err.retry_after_ms
                and err.details.get("quota") == "append_bytes_per_s"
            ):
                # The same credential's next calls of the method, until the hint is due
                # (at most REFUSAL_REUSE_S): the same answer, reused.
                until = started + min(err.retry_after_ms / 1000, REFUSAL_REUSE_S)
                if len(self._refusals) >= _REFUSALS_KEPT:
                    self._refusals.clear()
                self._refusals[(authorization, method)] = (until, caller.tenant, refusal)
            return refusal

        if handler.unary_unary:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: Any) -> Any:
                code = "OK"
                _CALL.set(caller)
                try:
                    async with self._slot(caller):
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
        append_stream = handler.stream_stream is not None

        async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
            code = "OK"
            _CALL.set(caller)
            try:
                slot = (
                    self._slot(caller, stream=True)
                    if append_stream
                    else self._slot(caller, follow=bool(getattr(request, "follow", False)))
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


def _refusal(
    handler: grpc.RpcMethodHandler, err: TidegateError, name: str, started: float
) -> grpc.RpcMethodHandler:
    """A handler that answers ``err`` to a call refused from its metadata without ever
    receiving its request: grpc reads a unary request before it runs the handler, a
    streaming one only when the handler asks for it, so the refusal is a handler of
    streamed requests whatever the method's kind (the client cannot tell)."""

    trailers = ((STATUS_DETAILS_KEY, error_to_status(err).SerializeToString()),)

    code = err.grpc_code.name
    first = True

    async def refuse(requests: Any, context: Any) -> None:
        # The status set and no answer returned: cheaper than an abort (no exception
        # through grpc's handler machinery), which counts when a tenant far over its
        # quota makes hundreds of calls a second. A reused refusal is timed from here:
        # what else it costs is grpc's.
        nonlocal first
        begun = started if first else time.perf_counter()
        first = False
        context.set_trailing_metadata(trailers)
        context.set_code(err.grpc_code)
        context.set_details(err.message)
        metrics.observe_grpc_request(name, code, time.perf_counter() - begun)

    if handler.response_streaming:

        async def refuse_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            await refuse(requests, context)
            return
            yield  # pragma: no cover - a generator that answers nothing

        return grpc.stream_stream_rpc_method_handler(
            refuse_stream, handler.request_deserializer, handler.response_serializer
        )
    return grpc.stream_unary_rpc_method_handler(
        refuse, handler.request_deserializer, handler.response_serializer
    )
