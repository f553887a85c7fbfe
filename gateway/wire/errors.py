"""Every error Tidegate raises on purpose, in one tree.

Each class knows its gRPC status code, its HTTP status and a stable machine-readable
``reason`` (an UPPER_SNAKE string clients may switch on). The edges translate them once:
the gRPC interceptor into a ``google.rpc.Status`` with ``ErrorInfo`` (and ``RetryInfo``
for retryable errors), the FastAPI handler into ``{"error": {"reason", "message", ...}}``.

    TidegateError
    ├── InvalidRequest                 INVALID_ARGUMENT / 400
    │   ├── SchemaMismatch             rows do not match the table schema
    │   ├── InvalidSchema              a table schema that cannot be stored
    │   ├── SchemaChangeRefused        a schema change other than the admitted ones
    │   ├── MalformedPayload           bytes that are not Arrow IPC / JSON
    │   ├── InvalidPartition           partition outside 0..N-1
    │   ├── InvalidIdempotentAppend    producer_id/sequence used inconsistently
    │   │   └── UnknownProducer        FAILED_PRECONDITION / 400: a producer the partition
    │   │                              holds no state of, at a sequence above 0
    │   ├── RequestTooLarge            over the configured request size (HTTP 413)
    │   └── UnsupportedMediaType       a body neither JSON nor Arrow IPC (HTTP 415)
    ├── Unauthenticated                UNAUTHENTICATED / 401: no, a malformed, a revoked
    │                                  or a wrong API key
    ├── PermissionDenied               PERMISSION_DENIED / 403
    │   └── TenantSuspended            the key's tenant is suspended
    ├── NotFound                       NOT_FOUND / 404
    │   ├── TableNotFound
    │   ├── TenantNotFound
    │   ├── KeyNotFound
    │   └── SnapshotNotFound           an as_of that names no snapshot
    ├── AlreadyExists                  ALREADY_EXISTS / 409
    │   ├── TableAlreadyExists
    │   └── TenantAlreadyExists
    ├── QuotaExceeded                  RESOURCE_EXHAUSTED / 429: a table or partition count
    │                                  quota; not retryable as is
    ├── OffsetOutOfRange               OUT_OF_RANGE / 416, carries earliest and latest
    ├── MemberFenced                   FAILED_PRECONDITION / 409: a consumer-group member
    │   │                              that may no longer act for the group (zombie fencing)
    │   ├── IllegalGeneration          a commit for a partition the member no longer holds
    │   │                              at that generation (Kafka's ILLEGAL_GENERATION)
    │   └── UnknownMember              the member left or missed its session timeout
    ├── GroupNotEmpty                  FAILED_PRECONDITION / 409: offsets committed from
    │                                  outside a group that has live members
    ├── Unimplemented                  UNIMPLEMENTED / 501: a method this edge does not serve
    └── RetryableError                 safe to retry the same request unchanged
        ├── OutOfOrderSequence         ABORTED / 409: an earlier sequence is missing
        ├── HighWatermarkMoved         ABORTED / 409: an append conditional on the high
        │                              watermark found it moved; nothing was stored
        ├── CommitConflict             ABORTED / 409: the Iceberg table moved; re-plan
        ├── Throttled                  RESOURCE_EXHAUSTED / 429, carries retry_after_ms
        └── Unavailable                UNAVAILABLE / 503: a backend is down
            ├── HotStateLost           the hot tier holds no (or an older) state of a
            │                          partition: the core re-seeds it, never reuses offsets
            └── ResourceUnavailable    the gateway ran out of descriptors, disk space or
                                       memory (EMFILE, ENFILE, ENOSPC...): retry later
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import grpc

__all__ = [
    "AlreadyExists",
    "CommitConflict",
    "GroupNotEmpty",
    "HotStateLost",
    "IllegalGeneration",
    "InvalidIdempotentAppend",
    "InvalidPartition",
    "InvalidRequest",
    "InvalidSchema",
    "KeyNotFound",
    "MalformedPayload",
    "MemberFenced",
    "NotFound",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "PermissionDenied",
    "QuotaExceeded",
    "RequestTooLarge",
    "ResourceUnavailable",
    "RetryableError",
    "SchemaChangeRefused",
    "SchemaMismatch",
    "SnapshotNotFound",
    "TableAlreadyExists",
    "TableNotFound",
    "TenantAlreadyExists",
    "TenantNotFound",
    "TenantSuspended",
    "Throttled",
    "TidegateError",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "UnknownMember",
    "UnknownProducer",
    "UnsupportedMediaType",
    "error_for_reason",
]

ERROR_DOMAIN = "tidegate.dev"


class TidegateError(Exception):
    """Base of every error Tidegate raises on purpose.

    ``details`` holds machine-readable facts (strings only on the wire) that the edges put
    into ``ErrorInfo.metadata`` and the JSON error body.
    """

    grpc_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    http_status: ClassVar[int] = 500
    reason: ClassVar[str] = "INTERNAL"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, **details: Any) -> None:
        message = _public(message)
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = {
            k: _public(v) if isinstance(v, str) else v for k, v in details.items()
        }

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "message": self.message, **self.details}


#: (absolute folder, what it is shown as) of the serving process (:func:`hide_paths`).
_HIDDEN: list[tuple[str, str]] = []


# A server's call, so not in __all__ (which the SDK re-exports).
def hide_paths(folders: Mapping[str, str]) -> None:
    """From now on, show each folder of ``folders`` (absolute path -> a name such as
    ``<data_dir>``) by its name in every error made in this process.

    A gateway calls it at start: an error message may quote a file (a disk hot tier
    that cannot write a segment, a catalog that cannot open a manifest), and its caller
    must learn what failed, not where the server keeps its files. Longer paths first, so
    a folder inside another is named by the nearer one."""
    found = {str(k).rstrip("/"): v for k, v in folders.items() if str(k).rstrip("/")}
    _HIDDEN[:] = sorted(found.items(), key=lambda kv: -len(kv[0]))


def _public(text: str) -> str:
    """``text`` printable (:func:`_printable`) and naming no hidden folder."""
    for folder, name in _HIDDEN:
        if folder in text:
            text = text.replace(folder, name)
    return _printable(text)


def _printable(text: str) -> str:
    """``text`` as valid UTF-8 (a lone surrogate a client sent becomes ``\\udXXX``), so
    an error that quotes hostile input can always be sent."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class InvalidRequest(TidegateError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400
    reason = "INVALID_REQUEST"


class SchemaMismatch(InvalidRequest):
    reason = "SCHEMA_MISMATCH"


class InvalidSchema(InvalidRequest):
    reason = "INVALID_SCHEMA"


class SchemaChangeRefused(InvalidRequest):
    """A schema change that would drop, rename, narrow or retype a column (or is
    malformed): nothing was changed."""

    reason = "SCHEMA_CHANGE_REFUSED"


class MalformedPayload(InvalidRequest):
    reason = "MALFORMED_PAYLOAD"


class InvalidPartition(InvalidRequest):
    reason = "INVALID_PARTITION"


class InvalidIdempotentAppend(InvalidRequest):
    reason = "INVALID_IDEMPOTENT_APPEND"


class UnknownProducer(InvalidIdempotentAppend):
    """A batch with a sequence above 0 from a producer the partition holds no state of
    (Kafka's UNKNOWN_PRODUCER_ID): its earlier batches were never seen here, or the hot
    tier lost their state (an emptied Redis, a wiped disk partition). Nothing was stored,
    but whether the producer's earlier batches were is unknown. Not retryable as is: a
    producer continues under a new producer id (or epoch) from sequence 0, and never
    sends again under it a batch whose earlier attempt may have been stored."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "UNKNOWN_PRODUCER_ID"


class RequestTooLarge(InvalidRequest):
    http_status = 413
    reason = "REQUEST_TOO_LARGE"


class UnsupportedMediaType(InvalidRequest):
    """An HTTP body whose Content-Type the route does not take."""

    http_status = 415
    reason = "UNSUPPORTED_MEDIA_TYPE"


class Unauthenticated(TidegateError):
    """The request carries no API key, a malformed one, or one that is wrong or revoked.

    The message never says which: a caller cannot probe for valid key ids.
    """

    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401
    reason = "UNAUTHENTICATED"


class PermissionDenied(TidegateError):
    """The caller is known but may not do this (a tenant key on the admin API)."""

    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403
    reason = "PERMISSION_DENIED"


class TenantSuspended(PermissionDenied):
    reason = "TENANT_SUSPENDED"


class NotFound(TidegateError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404
    reason = "NOT_FOUND"


class TableNotFound(NotFound):
    reason = "TABLE_NOT_FOUND"


class TenantNotFound(NotFound):
    reason = "TENANT_NOT_FOUND"


class KeyNotFound(NotFound):
    reason = "KEY_NOT_FOUND"


class SnapshotNotFound(NotFound):
    reason = "SNAPSHOT_NOT_FOUND"


class AlreadyExists(TidegateError):
    grpc_code = grpc.StatusCode.ALREADY_EXISTS
    http_status = 409
    reason = "ALREADY_EXISTS"


class TableAlreadyExists(AlreadyExists):
    reason = "TABLE_ALREADY_EXISTS"


class TenantAlreadyExists(AlreadyExists):
    reason = "TENANT_ALREADY_EXISTS"


class QuotaExceeded(TidegateError):
    """A count quota (tables, partitions) would be passed; retrying will not help."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429
    reason = "QUOTA_EXCEEDED"


class OffsetOutOfRange(TidegateError):
    """A read below the earliest available offset or above the high watermark."""

    grpc_code = grpc.StatusCode.OUT_OF_RANGE
    http_status = 416
    reason = "OFFSET_OUT_OF_RANGE"

    def __init__(self, message: str, *, offset: int, earliest: int, latest: int) -> None:
        super().__init__(message, offset=offset, earliest=earliest, latest=latest)


class MemberFenced(TidegateError):
    """A consumer-group member acted for the group after it stopped being the one that
    holds the partitions (its session timed out, it left, or they were reassigned).
    Details: ``group``, ``member`` and the group's current ``generation``."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 409
    reason = "MEMBER_FENCED"


class IllegalGeneration(MemberFenced):
    """A commit from a generation in which the member no longer holds the partition."""

    reason = "ILLEGAL_GENERATION"


class UnknownMember(MemberFenced):
    """The member is not in the group (it left, or missed its session timeout)."""

    reason = "UNKNOWN_MEMBER_ID"


class GroupNotEmpty(TidegateError):
    """Offsets committed without membership while the group has live members."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 409
    reason = "NON_EMPTY_GROUP"


class Unimplemented(TidegateError):
    """A method the edge does not serve (e.g. Flight's DoPut: Flight serves reads)."""

    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    http_status = 501
    reason = "UNIMPLEMENTED"


class RetryableError(TidegateError):
    """The same request may succeed if sent again, after ``retry_after_ms`` when given."""

    retryable = True

    def __init__(self, message: str, *, retry_after_ms: int | None = None, **details: Any) -> None:
        if retry_after_ms is not None:
            details["retry_after_ms"] = retry_after_ms
        super().__init__(message, **details)
        self.retry_after_ms = retry_after_ms


class OutOfOrderSequence(RetryableError):
    """An idempotent append skipped a sequence; resend the missing batches first."""

    grpc_code = grpc.StatusCode.ABORTED
    http_status = 409
    reason = "OUT_OF_ORDER_SEQUENCE"


# Server-internal (the core resolves a key-table's batch again and retries), so not in
# __all__, which the SDK re-exports.
class HighWatermarkMoved(RetryableError):
    """An append made conditional on the partition's high watermark (``expect_high``,
    the one a primary-key table's write was resolved against) found it moved: another
    append landed since, and nothing was stored. Resolve the batch again and retry."""

    grpc_code = grpc.StatusCode.ABORTED
    http_status = 409
    reason = "HIGH_WATERMARK_MOVED"


class CommitConflict(RetryableError):
    """Another commit changed the Iceberg table since the snapshot a job planned from."""

    grpc_code = grpc.StatusCode.ABORTED
    http_status = 409
    reason = "COMMIT_CONFLICT"


class Throttled(RetryableError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429
    reason = "THROTTLED"


class Unavailable(RetryableError):
    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    reason = "UNAVAILABLE"


class ResourceUnavailable(Unavailable):
    """The gateway ran out of a resource (file descriptors, disk space, memory) while
    serving the request: nothing was acknowledged, and the same request may succeed
    later. Never an INTERNAL error (a 500 would tell a client not to retry)."""

    reason = "RESOURCE_UNAVAILABLE"


class HotStateLost(Unavailable):
    """The hot tier has no state for a partition, or an older one than was seen
    (an emptied or rolled-back Redis, a removed partition folder): the append was not
    applied. The core re-seeds the partition at its tiered watermark (or higher) and
    appends again; offsets below what was tiered or acknowledged are never assigned again.
    """

    reason = "HOT_STATE_LOST"


def _all_subclasses(cls: type[TidegateError]) -> list[type[TidegateError]]:
    out: list[type[TidegateError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


_ALL_ERRORS: list[type[TidegateError]] = [TidegateError, *_all_subclasses(TidegateError)]
# Only classes that name their own reason: RetryableError inherits "INTERNAL" and must not
# make an internal error look retryable.
_BY_REASON: dict[str, type[TidegateError]] = {
    c.reason: c for c in _ALL_ERRORS if "reason" in vars(c)
}


def error_for_reason(reason: str) -> type[TidegateError]:
    """The class that owns ``reason`` (``TidegateError`` for an unknown one)."""
    return _BY_REASON.get(reason, TidegateError)
