"""Tidegate client SDK. Installs with grpcio and pyarrow; imports no server code.

``Client`` (sync, threads) and ``AsyncClient`` (asyncio; also ``gateway.client.aio.Client``)
are twins: the same methods, producer, consumer and errors. Errors are the gateway's own
classes from :mod:`gateway.wire.errors`, re-exported here.
"""

from gateway.client._admin import AdminClient
from gateway.client._sync import Client, Consumer, Producer
from gateway.client._types import (
    AppendRange,
    Field,
    PartitionInfo,
    RecordMetadata,
    Snapshot,
    TableInfo,
    TableRef,
)
from gateway.client.aio import AsyncClient, AsyncConsumer, AsyncProducer
from gateway.wire.errors import (
    AlreadyExists,
    CommitConflict,
    InvalidIdempotentAppend,
    InvalidPartition,
    InvalidRequest,
    InvalidSchema,
    KeyNotFound,
    MalformedPayload,
    NotFound,
    OffsetOutOfRange,
    OutOfOrderSequence,
    PermissionDenied,
    QuotaExceeded,
    RequestTooLarge,
    RetryableError,
    SchemaMismatch,
    SnapshotNotFound,
    TableAlreadyExists,
    TableNotFound,
    TenantAlreadyExists,
    TenantNotFound,
    TenantSuspended,
    Throttled,
    TidegateError,
    Unauthenticated,
    Unavailable,
    UnsupportedMediaType,
)
from gateway.wire.retry import Backoff, ConstantBackoff, ExponentialBackoff, Retry
from gateway.wire.status import error_from_rpc

__all__ = [
    "AdminClient",
    "AlreadyExists",
    "AppendRange",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "Backoff",
    "Client",
    "CommitConflict",
    "ConstantBackoff",
    "Consumer",
    "ExponentialBackoff",
    "Field",
    "InvalidIdempotentAppend",
    "InvalidPartition",
    "InvalidRequest",
    "InvalidSchema",
    "KeyNotFound",
    "MalformedPayload",
    "NotFound",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "PartitionInfo",
    "PermissionDenied",
    "Producer",
    "QuotaExceeded",
    "RecordMetadata",
    "RequestTooLarge",
    "Retry",
    "RetryableError",
    "SchemaMismatch",
    "Snapshot",
    "SnapshotNotFound",
    "TableAlreadyExists",
    "TableInfo",
    "TableNotFound",
    "TableRef",
    "TenantAlreadyExists",
    "TenantNotFound",
    "TenantSuspended",
    "Throttled",
    "TidegateError",
    "Unauthenticated",
    "Unavailable",
    "UnsupportedMediaType",
    "error_from_rpc",
]
