"""Kafka's request and response messages, through ``kio`` (dataclasses generated from
Kafka's own JSON message definitions, with their readers and writers): which APIs and
versions this edge serves, a frame as a request, an answer as a frame, and Tidegate's
errors as Kafka's error codes.

Nothing here is hand-written wire layout: a frame's first four bytes (its API key and
version) choose kio's request class, whose header and body kio reads; answers are kio's
response classes, built from plain values by :func:`build`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import io
import struct
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema as _load_request
from kio.index import load_response_schema as _load_response
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from gateway.wire.errors import (
    GroupNotEmpty,
    IllegalGeneration,
    InvalidIdempotentAppend,
    InvalidPartition,
    InvalidRequest,
    MalformedPayload,
    MemberFenced,
    OffsetOutOfRange,
    OutOfOrderSequence,
    PermissionDenied,
    RequestTooLarge,
    SchemaMismatch,
    TableNotFound,
    Throttled,
    TidegateError,
    Unauthenticated,
    Unavailable,
    UnknownProducer,
)

__all__ = [
    "API_VERSIONS",
    "ErrorCode",
    "ProducerFenced",
    "Request",
    "Unanswerable",
    "api_versions_fallback",
    "build",
    "encode_response",
    "error_code",
    "parse_request",
]

#: Kafka's API keys of the requests this edge serves, by name.
PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
CREATE_TOPICS, DELETE_TOPICS = 19, 20
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS = 15, 16
INIT_PRODUCER_ID = 22
DESCRIBE_CONFIGS, CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS = 32, 37, 44
OFFSET_DELETE, DESCRIBE_CLUSTER = 47, 60
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
SASL_HANDSHAKE, API_VERSIONS_KEY, SASL_AUTHENTICATE = 17, 18, 36

#: API key -> (min, max) version served. Bounded by what kio generates (Kafka 4's
#: definitions: Produce from v3, Fetch from v4) and by what this edge implements: Fetch
#: and Produce stop before v13, where topics are named by id rather than by name.
API_VERSIONS: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 12),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 8),
    METADATA: (0, 12),
    # Committed offsets: v9 of both is what a KIP-848 member sends (its member epoch;
    # librdkafka counts on both for its consumer protocol); v10 names topics by id.
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 9),
    FIND_COORDINATOR: (0, 4),
    # The classic group protocol (the client's own assignors).
    JOIN_GROUP: (0, 9),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    SYNC_GROUP: (0, 5),
    # The consumer group protocol (KIP-848, gateway/server/kafka/consumer_groups.py):
    # v1's members draw their own ids.
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    CONSUMER_GROUP_DESCRIBE: (0, 1),
    DESCRIBE_GROUPS: (0, 5),
    LIST_GROUPS: (0, 5),
    CREATE_TOPICS: (2, 7),
    # The idempotent producer (v3: KIP-360's epoch bump); v6 adds two-phase commit.
    INIT_PRODUCER_ID: (0, 5),
    # v6 names topics by id too.
    DELETE_TOPICS: (1, 5),
    # The admin APIs (gateway/server/kafka/admin.py): kio has DescribeConfigs from v1.
    DESCRIBE_CONFIGS: (1, 4),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    CREATE_PARTITIONS: (0, 3),
    OFFSET_DELETE: (0, 0),
    DESCRIBE_CLUSTER: (0, 2),
    SASL_HANDSHAKE: (0, 1),
    API_VERSIONS_KEY: (0, 3),
    SASL_AUTHENTICATE: (0, 2),
}

#: Requests a connection may send before it authenticated.
BEFORE_AUTH = frozenset({API_VERSIONS_KEY, SASL_HANDSHAKE, SASL_AUTHENTICATE})


class Unanswerable(Exception):
    """A frame that cannot be answered (not a request of a served API and version, or
    bytes kio cannot read as one): Kafka closes such a connection, and so does this
    edge. The message says why, for the log."""


@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any


#: kio resolves a message class by module name on every call (importlib's machinery,
#: ~0.1 ms): a request's class and its answer's are looked up once per (key, version).
load_request_schema = functools.cache(_load_request)
load_response_schema = functools.cache(_load_response)


def _peek(frame: bytes) -> tuple[int, int, int]:
    if len(frame) < 8:
        raise Unanswerable(f"a frame of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame)
    return api_key, api_version, correlation_id


def parse_request(frame: bytes) -> Request:
    """The request a frame (without its length prefix) holds.

    Raises:
        Unanswerable: an API or version not served (but see :func:`api_versions_fallback`),
            or bytes that are not one whole request of it.
    """
    api_key, api_version, correlation_id = _peek(frame)
    served = API_VERSIONS.get(api_key)
    if served is None:
        raise Unanswerable(f"API key {api_key} is not served")
    if not served[0] <= api_version <= served[1]:
        raise Unanswerable(f"version {api_version} of API key {api_key} is not served")
    cls = load_request_schema(api_key, api_version)
    try:
        header, at = entity_reader(cls.__header_schema__)(frame, 0)
        body, _ = entity_reader(cls)(frame, at)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # kio raises several kinds (a panic of its Rust reader too)
        raise Unanswerable(
            f"a request of API key {api_key} v{api_version} that cannot be read: {exc}"
        ) from None
    null = _null_field(body)
    if null is not None:
        # kio reads a null array or string where Kafka's definition allows none; Kafka's
        # broker cannot read such a request either and closes the connection.
        raise Unanswerable(
            f"a request of API key {api_key} v{api_version} with {null} null, which it cannot be"
        )
    # Bytes after the request's end are ignored, as Kafka's brokers ignore them:
    # librdkafka's admin client sends Metadata v12 with three of them.
    return Request(api_key, api_version, correlation_id, header.client_id, body)


def _null_field(entity: Any) -> str | None:
    """The path of the first field of ``entity`` (a kio message) that is null where its
    definition does not allow it, or None."""
    hints = _hints(type(entity))
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if value is None:
            if type(None) not in typing.get_args(hints[f.name]):
                return f.name
            continue
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if dataclasses.is_dataclass(item) and not isinstance(item, type):
                inner = _null_field(item)
                if inner is not None:
                    return f"{f.name}.{inner}"
    return None


def api_versions_fallback(frame: bytes) -> bytes | None:
    """Kafka's answer to an ``ApiVersions`` request of a version this edge does not know
    (a newer client's first request): a v0 answer with ``UNSUPPORTED_VERSION`` and the
    versions served, from which the client picks one and asks again. None for any other
    frame."""
    try:
        api_key, api_version, correlation_id = _peek(frame)
    except Unanswerable:
        return None
    if api_key != API_VERSIONS_KEY or api_version <= API_VERSIONS[API_VERSIONS_KEY][1]:
        return None
    answer = build(
        load_response_schema(API_VERSIONS_KEY, 0),
        {"error_code": ErrorCode.unsupported_version, "api_keys": supported_apis()},
    )
    return encode_response(correlation_id, answer)


def supported_apis() -> list[dict[str, int]]:
    return [
        {"api_key": key, "min_version": low, "max_version": high}
        for key, (low, high) in sorted(API_VERSIONS.items())
    ]


def response_class(request: Request) -> type[Any]:
    return load_response_schema(request.api_key, request.api_version)


def encode_response(correlation_id: int, answer: Any) -> bytes:
    """An answer as a frame: its length, its header (the correlation id), its body."""
    cls = type(answer)
    header_cls = cls.__header_schema__
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    entity_writer(header_cls)(out, build(header_cls, {"correlation_id": correlation_id}))
    entity_writer(cls)(out, answer)
    data = out.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


# --------------------------------------------------------------------------------------
# Answers from plain values
# --------------------------------------------------------------------------------------
_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _value(hint: Any, kafka_type: str | None, value: Any) -> Any:
    return None if value is None else _converter(hint, kafka_type)(value)


def _same(value: Any) -> Any:
    return value


@functools.cache
def _converter(hint: Any, kafka_type: str | None) -> Callable[[Any], Any]:
    """How a value given for a field of type ``hint`` becomes what kio takes, worked out
    once per type (the answer to every request is built so)."""
    inner = [h for h in typing.get_args(hint) if h is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(inner) == 1:
        hint = inner[0]  # a nullable field given a value: the value's own type
    if dataclasses.is_dataclass(hint):
        entity = typing.cast(type[Any], hint)
        return lambda value: build(entity, value)
    if typing.get_origin(hint) is tuple:
        (item, *_) = typing.get_args(hint)
        return lambda value: tuple(_value(item, kafka_type, v) for v in value)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return lambda value: dt.timedelta(milliseconds=value) if isinstance(value, int) else value
    if kafka_type == "error_code":
        return lambda value: value if isinstance(value, ErrorCode) else ErrorCode(value)
    return _same


@functools.cache
def _plan(cls: Any) -> tuple[tuple[str, Any, str | None, bool], ...]:
    """``cls``'s fields as (name, type, Kafka type, whether it has no default)."""
    hints = _hints(cls)
    return tuple(
        (
            f.name,
            hints[f.name],
            f.metadata.get("kafka_type"),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )


def build(cls: type[Any], values: dict[str, Any]) -> Any:
    """An instance of kio's ``cls`` (of any version) from ``values``: fields this version
    has are taken from them (nested entities from dicts, arrays from lists), the others
    ignored, and fields left out take their default (or a zero value: 0, an empty array,
    ``None`` for a nullable one)."""
    kwargs: dict[str, Any] = {}
    for name, hint, kafka_type, required in _plan(typing.cast(Any, cls)):
        if name in values:
            kwargs[name] = _value(hint, kafka_type, values[name])
        elif required:
            kwargs[name] = _zero(hint, kafka_type)
    return cls(**kwargs)


def _zero(hint: Any, kafka_type: str | None) -> Any:
    if type(None) in typing.get_args(hint):
        return None
    if typing.get_origin(hint) is tuple:
        return ()
    if dataclasses.is_dataclass(hint):
        return build(typing.cast(type[Any], hint), {})
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return dt.timedelta(0)
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type == "string":
        return ""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return None
    if kafka_type in ("bytes", "records"):
        return b""
    return 0


def first_error(answer: Any) -> str:
    """The name of the first error code other than none in ``answer`` (its own, then its
    parts'), or ``none``: the ``error`` label of the request's metrics."""
    if isinstance(answer, tuple):
        for item in answer:
            found = first_error(item)
            if found != "none":
                return found
        return "none"
    if not dataclasses.is_dataclass(answer):
        return "none"
    code = getattr(answer, "error_code", ErrorCode.none)
    if isinstance(code, ErrorCode) and code != ErrorCode.none:
        return code.name
    for f in dataclasses.fields(answer):
        value = getattr(answer, f.name)
        if isinstance(value, tuple) or dataclasses.is_dataclass(value):
            found = first_error(value)
            if found != "none":
                return found
    return "none"


def api_name(request: Request) -> str:
    """Kafka's name of the request's API (``Produce``, ``Fetch``...)."""
    return type(request.body).__name__.removesuffix("Request")


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------
class ProducerFenced(InvalidIdempotentAppend):
    """A Produce of an idempotent producer's epoch older than one it was given since
    (Kafka's INVALID_PRODUCER_EPOCH)."""

    reason = "INVALID_PRODUCER_EPOCH"


def error_code(err: TidegateError) -> ErrorCode:
    """The Kafka error code a client acts on as Kafka's own for ``err``."""
    if isinstance(err, UnknownProducer):
        # No state of the producer where its sequence is above 0 (the hot tier lost it):
        # librdkafka and the Java client bump the epoch and go on from sequence 0.
        return ErrorCode.unknown_producer_id
    if isinstance(err, ProducerFenced):
        return ErrorCode.invalid_producer_epoch
    if isinstance(err, InvalidIdempotentAppend | OutOfOrderSequence):
        # A gap, a sequence older than the de-duplication window or inside a stored
        # batch, a retry of another record count: Kafka answers all of them so.
        return ErrorCode.out_of_order_sequence_number
    if isinstance(err, TableNotFound | InvalidPartition):
        return ErrorCode.unknown_topic_or_partition
    if isinstance(err, OffsetOutOfRange):
        return ErrorCode.offset_out_of_range
    if isinstance(err, RequestTooLarge):
        return ErrorCode.message_too_large
    if isinstance(err, SchemaMismatch | MalformedPayload):
        return ErrorCode.invalid_record
    if isinstance(err, IllegalGeneration):
        return ErrorCode.illegal_generation
    if isinstance(err, MemberFenced | GroupNotEmpty):
        # A commit from outside a group with live members, or from a member it dropped:
        # Kafka answers both UNKNOWN_MEMBER_ID.
        return ErrorCode.unknown_member_id
    if isinstance(err, InvalidRequest):
        # check_group's refusal of a group name starts so.
        return (
            ErrorCode.invalid_group_id
            if err.message.startswith("group ")
            else ErrorCode.invalid_request
        )
    if isinstance(err, Unauthenticated):
        return ErrorCode.sasl_authentication_failed
    if isinstance(err, PermissionDenied):
        return ErrorCode.topic_authorization_failed
    if isinstance(err, Throttled):
        return ErrorCode.throttling_quota_exceeded
    if isinstance(err, Unavailable):
        # Retriable for every client: the storage behind the partition is not reachable.
        return ErrorCode.kafka_storage_error
    return ErrorCode.unknown_server_error
