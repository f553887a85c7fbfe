"""Errors on the gRPC wire, both directions, in one place.

The gateway sends a :class:`~gateway.wire.errors.TidegateError` as a gRPC status whose
``grpc-status-details-bin`` trailer holds a ``google.rpc.Status`` with ``ErrorInfo``
(reason, domain, metadata) and, for retryable errors with a hint, ``RetryInfo``; inside an
``AppendStream`` it sends the same facts as a ``tidegate.v1.Error`` message. The client
turns either back into the same typed error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import (
    ERROR_DOMAIN,
    OffsetOutOfRange,
    RetryableError,
    Throttled,
    TidegateError,
    Unavailable,
    error_for_reason,
)

__all__ = [
    "STATUS_DETAILS_KEY",
    "build_error",
    "error_from_pb",
    "error_from_rpc",
    "error_metadata",
    "error_to_pb",
    "error_to_status",
]

#: The trailing metadata key that carries a serialized ``google.rpc.Status``.
STATUS_DETAILS_KEY = "grpc-status-details-bin"


# --------------------------------------------------------------------------------------
# Gateway -> wire
# --------------------------------------------------------------------------------------
def error_metadata(err: TidegateError) -> dict[str, str]:
    """The error's details as ``ErrorInfo`` metadata (strings; None values left out)."""
    return {k: str(v) for k, v in err.details.items() if v is not None}


def _retry_after_ms(err: TidegateError) -> int | None:
    return err.retry_after_ms if isinstance(err, RetryableError) else None


def error_to_status(err: TidegateError) -> status_pb2.Status:
    """The rich ``google.rpc.Status`` of an error."""
    info = error_details_pb2.ErrorInfo(
        reason=err.reason, domain=ERROR_DOMAIN, metadata=error_metadata(err)
    )
    details = [any_pb2.Any()]
    details[0].Pack(info)
    retry_after = _retry_after_ms(err)
    if retry_after is not None:
        retry = error_details_pb2.RetryInfo(
            retry_delay=duration_pb2.Duration(
                seconds=retry_after // 1000, nanos=(retry_after % 1000) * 1_000_000
            )
        )
        packed = any_pb2.Any()
        packed.Pack(retry)
        details.append(packed)
    return status_pb2.Status(code=err.grpc_code.value[0], message=err.message, details=details)


def error_to_pb(err: TidegateError) -> pb.Error:
    """The ``tidegate.v1.Error`` of one failed request inside a stream."""
    return pb.Error(
        code=err.grpc_code.value[0],
        reason=err.reason,
        message=err.message,
        metadata=error_metadata(err),
        retry_after_ms=_retry_after_ms(err) or 0,
    )


# --------------------------------------------------------------------------------------
# Wire -> client
# --------------------------------------------------------------------------------------
def build_error(
    reason: str, message: str, metadata: Mapping[str, str], retry_ms: int | None
) -> TidegateError:
    """The typed error for a server ``reason`` (:func:`~gateway.wire.errors.error_for_reason`)."""
    cls = error_for_reason(reason)
    if cls is OffsetOutOfRange:
        return OffsetOutOfRange(
            message,
            offset=int(metadata.get("offset", -1)),
            earliest=int(metadata.get("earliest", -1)),
            latest=int(metadata.get("latest", -1)),
        )
    details: dict[str, Any] = dict(metadata)
    details.pop("retry_after_ms", None)
    if issubclass(cls, RetryableError):
        return cls(message, retry_after_ms=retry_ms, **details)
    return cls(message, **details)


def error_from_rpc(exc: grpc.RpcError) -> TidegateError:
    """The typed error behind a failed call, from its rich status details.

    A status without ``ErrorInfo`` (a proxy, or the transport itself) maps by code:
    UNAVAILABLE is :class:`Unavailable`, RESOURCE_EXHAUSTED with a ``RetryInfo`` is
    :class:`Throttled`; anything else is a plain :class:`TidegateError` whose
    ``details["grpc_code"]`` names the code.
    """
    call = cast(grpc.Call, exc)
    code = call.code()
    message = call.details() or (code.name if code is not None else "UNKNOWN")
    reason = ""
    metadata: dict[str, str] = {}
    retry_ms: int | None = None
    for key, value in call.trailing_metadata() or ():
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_ms = retry.retry_delay.seconds * 1000 + retry.retry_delay.nanos // 1_000_000
    if not reason:
        if code is grpc.StatusCode.UNAVAILABLE:
            # No ErrorInfo: the transport's own status (refused, unreachable, reset), not
            # a gateway's answer.
            return Unavailable(message, retry_after_ms=retry_ms, transport=True)
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED and retry_ms is not None:
            return Throttled(message, retry_after_ms=retry_ms)
        reason = code.name if code is not None else "UNKNOWN"
    err = build_error(reason, message, metadata, retry_ms)
    if type(err) is TidegateError:
        err.details.setdefault("grpc_code", code.name if code is not None else "UNKNOWN")
    return err


def error_from_pb(e: pb.Error) -> TidegateError:
    """The typed error of one failed ``AppendStream`` request."""
    return build_error(e.reason, e.message, dict(e.metadata), e.retry_after_ms or None)
