"""Tidegate client SDK. Installs with grpcio and pyarrow; imports no server code.

``Client`` (sync, threads) and ``AsyncClient`` (asyncio; also ``gateway.client.aio.Client``)
are twins: the same methods, producer, consumer and errors. Errors are the gateway's own
classes from :mod:`gateway.errors`, re-exported here.
"""

from gateway.client._common import (
    AppendRange,
    Backoff,
    ConstantBackoff,
    ExponentialBackoff,
    RecordMetadata,
    Retry,
    TableInfo,
    TableRef,
    error_from_rpc,
)
from gateway.client._sync import Client, Consumer, Producer
from gateway.client.aio import AsyncClient, AsyncConsumer, AsyncProducer
from gateway.errors import (
    AlreadyExists,
    InvalidIdempotentAppend,
    InvalidPartition,
    InvalidRequest,
    InvalidSchema,
    MalformedPayload,
    NotFound,
    OffsetOutOfRange,
    OutOfOrderSequence,
    RequestTooLarge,
    RetryableError,
    SchemaMismatch,
    TableAlreadyExists,
    TableNotFound,
    TenantNotFound,
    Throttled,
    TidegateError,
    Unavailable,
    UnsupportedMediaType,
)

__all__ = [
    "AlreadyExists",
    "AppendRange",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "Backoff",
    "Client",
    "ConstantBackoff",
    "Consumer",
    "ExponentialBackoff",
    "InvalidIdempotentAppend",
    "InvalidPartition",
    "InvalidRequest",
    "InvalidSchema",
    "MalformedPayload",
    "NotFound",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "Producer",
    "RecordMetadata",
    "RequestTooLarge",
    "Retry",
    "RetryableError",
    "SchemaMismatch",
    "TableAlreadyExists",
    "TableInfo",
    "TableNotFound",
    "TableRef",
    "TenantNotFound",
    "Throttled",
    "TidegateError",
    "Unavailable",
    "UnsupportedMediaType",
    "error_from_rpc",
]
