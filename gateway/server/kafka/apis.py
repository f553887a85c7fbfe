"""What each Kafka request does, for one authenticated connection: Metadata, Produce,
Fetch and ListOffsets over the tenant's tables, through the same
:class:`~gateway.server.calls.DataCalls` and :class:`~gateway.tenancy.Gate` as every
other edge. Topics are tables named ``namespace.name``; partitions and offsets are the
table's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.core import ReadResult, TableView
from gateway.server.calls import OFFLOAD_BYTES, AppendBody, DataCalls, wire_error
from gateway.server.kafka.protocol import (
    CREATE_TOPICS,
    DELETE_TOPICS,
    FETCH,
    FIND_COORDINATOR,
    LIST_OFFSETS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    PRODUCE,
    ErrorCode,
    Request,
    build,
    error_code,
    response_class,
)
from gateway.server.kafka.records import (
    RAW_FIELDS,
    decode_produce,
    encode_fetch,
    is_raw,
    raw_rows,
    rows_from_values,
)
from gateway.wire.errors import (
    InvalidRequest,
    OffsetOutOfRange,
    QuotaExceeded,
    TableAlreadyExists,
    TableNotFound,
    Throttled,
    TidegateError,
)
from gateway.wire.types import AppendRange

__all__ = ["LONGEST_MUTE_S", "Broker", "KafkaApis", "held_while_throttled"]

log = logging.getLogger("tidegate.server.kafka")

T = TypeVar("T")

#: The one node id this gateway answers as (every partition's leader).
NODE_ID = 0
#: Longest a throttled request is held before it fails (the connection is muted
#: meanwhile, as Kafka mutes an over-quota client's channel).
LONGEST_MUTE_S = 5.0
#: ListOffsets' special timestamps.
_LATEST, _EARLIEST, _MAX_TIMESTAMP = -1, -2, -3


@dataclass(frozen=True, slots=True)
class Broker:
    """This gateway as Kafka clients are told to reach it."""

    host: str
    port: int
    cluster_id: str = "tidegate"


def topic_id(table: TableView) -> uuid.UUID:
    """A stable Kafka topic id for a table (from its table id, which is never reused)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"tidegate:{table.definition.table_id}")


def split_topic(topic: str) -> tuple[str, str] | None:
    """``namespace.name`` as its two parts; None for a name that is not one (namespaces
    and table names hold no dot)."""
    namespace, dot, name = topic.partition(".")
    if not dot or not namespace or not name or "." in name:
        return None
    return namespace, name


def _message(err: TidegateError, topic: str) -> str:
    return f"{topic}: {err.message}"[:1000]


class KafkaApis:
    """The requests of one connection once it authenticated as ``tenant``."""

    def __init__(self, calls: DataCalls, broker: Broker, tenant: str, authorization: str) -> None:
        self.calls = calls
        self.gate = calls.gate
        self.service = calls.service
        self.broker = broker
        self.tenant = tenant
        self.authorization = authorization
        #: Milliseconds the request being served was held for the tenant's quota.
        self.muted_ms = 0

    async def handle(self, request: Request) -> Any | None:
        """The answer to ``request`` (None: a Produce with acks=0, answered with nothing).

        Raises:
            Unauthenticated, TenantSuspended: the connection's key no longer stands.
        """
        handler = self._handlers[request.api_key]
        # Counted, its key checked again (cached), held by one of the tenant's slots, as
        # a request of any edge; muted for a while when over the tenant's requests/s.
        self.muted_ms = 0
        await self._muted(lambda: self.gate.tenant_of(self.authorization))
        waits = request.api_key == FETCH and _fetch_waits(request.body)
        async with contextlib.AsyncExitStack() as held:
            # No free slot is a throttle too: held and tried again.
            await self._muted(
                lambda: held.enter_async_context(self.gate.admit(self.tenant, follow=waits))
            )
            answer = await handler(self, request)
        if answer is not None and self.muted_ms and hasattr(answer, "throttle_time"):
            # Kafka's quota answer: how long the request was held for the tenant's quota.
            muted = dt.timedelta(milliseconds=self.muted_ms)
            answer = dataclasses.replace(answer, throttle_time=muted)
        return answer

    async def _muted(self, call: Callable[[], Awaitable[T]], deadline: float | None = None) -> T:
        """``call()``, held while it is throttled (:func:`held_while_throttled`) until
        ``deadline`` (monotonic) or :data:`LONGEST_MUTE_S`; the time held is told in the
        answer's ``throttle_time_ms``."""
        until = deadline if deadline is not None else time.monotonic() + LONGEST_MUTE_S
        result, held_ms = await held_while_throttled(call, until)
        self.muted_ms += held_ms
        return result

    # Metadata ----------------------------------------------------------------------------
    async def metadata(self, request: Request) -> Any:
        body = request.body
        wanted = body.topics
        if request.api_version == 0 and not wanted:
            wanted = None  # v0: an empty list means every topic
        topics: list[dict[str, Any]] = []
        if wanted is None:
            for table in await self.service.list_tables(self.tenant):
                d = table.definition
                topics.append(self._topic(f"{d.namespace}.{d.name}", table))
        else:
            for t in wanted:
                name = t.name or ""
                topics.append(self._topic(name, await self._table(name)))
        return build(
            response_class(request),
            {
                "brokers": [
                    {"node_id": NODE_ID, "host": self.broker.host, "port": self.broker.port}
                ],
                "cluster_id": self.broker.cluster_id,
                "controller_id": NODE_ID,
                "topics": topics,
            },
        )

    async def _table(self, topic: str) -> TableView | None:
        parts = split_topic(topic)
        if parts is None:
            return None
        try:
            return await self.service.table(self.tenant, *parts)
        except (TableNotFound, InvalidRequest):
            return None

    def _topic(self, name: str, table: TableView | None) -> dict[str, Any]:
        if table is None:
            return {"name": name, "error_code": ErrorCode.unknown_topic_or_partition}
        return {
            "name": name,
            "topic_id": topic_id(table),
            "partitions": [
                {
                    "partition_index": p,
                    "leader_id": NODE_ID,
                    "leader_epoch": -1,
                    "replica_nodes": [NODE_ID],
                    "isr_nodes": [NODE_ID],
                }
                for p in range(table.definition.partitions)
            ],
        }

    # Produce -----------------------------------------------------------------------------
    async def produce(self, request: Request) -> Any | None:
        body = request.body
        deadline = time.monotonic() + min(body.timeout.total_seconds(), 60.0)
        topics = []
        for t in body.topic_data:
            answers = [
                await self._produce_partition(t.name, p.index, p.records, deadline)
                for p in t.partition_data
            ]
            topics.append({"name": t.name, "partition_responses": answers})
        if body.acks == 0:
            return None
        return build(response_class(request), {"responses": topics})

    async def _produce_partition(
        self, topic: str, partition: int, records: bytes | None, deadline: float
    ) -> dict[str, Any]:
        answer: dict[str, Any] = {"index": partition, "base_offset": -1}
        parts = split_topic(topic)
        if parts is None:
            answer["error_code"] = ErrorCode.unknown_topic_or_partition
            return answer
        namespace, name = parts
        nbytes = len(records or b"")
        big = nbytes >= OFFLOAD_BYTES
        refused: list[tuple[int, str]] = []

        async def decode() -> AppendBody:
            limit = self.service.settings.server.max_request_bytes
            produced = await self.calls.offload(big, decode_produce, records, limit)
            if produced.transactional:
                raise InvalidRequest(
                    f"{topic}: transactional produce is not supported by Tidegate's Kafka "
                    "listener yet; produce without transactional.id"
                )
            table = await self.service.table(self.tenant, namespace, name)
            if is_raw(table.schema):
                raw = await self.calls.offload(big, raw_rows, produced, table.schema)
                return AppendBody([raw], partition)
            batch, bad = await self.calls.offload(
                big, rows_from_values, produced.values, table.schema, table.added_columns
            )
            if batch is None:
                refused.extend(bad)
                raise _Refused()
            return AppendBody([batch], partition)

        async def attempt() -> list[AppendRange]:
            # Refused without decoding while the tenant's appends are refused after a
            # throttle; held and tried again meanwhile.
            self.calls.refuse_append_early(self.tenant)
            return await self.calls.append(self.tenant, namespace, name, nbytes, decode)

        try:
            ranges = await self._muted(attempt, deadline)
        except _Refused:
            answer["error_code"] = ErrorCode.invalid_record
            answer["record_errors"] = [
                {"batch_index": i, "batch_index_error_message": m} for i, m in refused
            ]
            answer["error_message"] = (
                f"{topic}: {len(refused)} record(s) refused, nothing of the batch stored; "
                f"first: record {refused[0][0]}: {refused[0][1]}"
            )[:1000]
            return answer
        except Exception as exc:
            err = wire_error(exc, "a Kafka produce")
            answer["error_code"] = error_code(err)
            answer["error_message"] = _message(err, topic)
            return answer
        answer["error_code"] = ErrorCode.none
        answer["base_offset"] = ranges[0].base_offset if ranges else -1
        return answer

    # Fetch -------------------------------------------------------------------------------
    async def fetch(self, request: Request) -> Any:
        body = request.body
        wait_s = max(0.0, min(body.max_wait.total_seconds(), 30.0))
        room = [max(1, body.max_bytes)]
        wanted = [(t.topic, p) for t in body.topics for p in t.partitions]
        answers = [await self._fetch_partition(topic, p, room) for topic, p in wanted]
        got = sum(len(a.get("records") or b"") for a in answers)
        if got < max(1, body.min_bytes) and wait_s > 0 and wanted:
            await self._wait_for_records(wanted, answers, wait_s)
            room = [max(1, body.max_bytes)]
            answers = [await self._fetch_partition(topic, p, room) for topic, p in wanted]
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, _), answer in zip(wanted, answers, strict=True):
            by_topic.setdefault(topic, []).append(answer)
        return build(
            response_class(request),
            {
                "session_id": 0,
                "responses": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
            },
        )

    async def _fetch_partition(self, topic: str, p: Any, room: list[int]) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "partition_index": p.partition,
            "high_watermark": -1,
            "last_stable_offset": -1,
            "log_start_offset": -1,
            "records": b"",
            "preferred_read_replica": -1,
        }
        table = await self._table(topic)
        if table is None:
            answer["error_code"] = ErrorCode.unknown_topic_or_partition
            return answer
        d = table.definition
        limit = max(1, min(p.partition_max_bytes, room[0]))

        raw = is_raw(table.schema)

        def encode(result: ReadResult) -> tuple[tuple[bytes, int], int]:
            data, _ = encode_fetch(result.batches, d.key_columns, raw)
            return (data, result.high_watermark), len(data)

        try:
            data, high = await self.calls.read(
                self.tenant, d.namespace, d.name, p.partition, p.fetch_offset, None, limit, encode
            )
        except OffsetOutOfRange as err:
            answer["error_code"] = ErrorCode.offset_out_of_range
            answer["high_watermark"] = answer["last_stable_offset"] = err.details["latest"]
            answer["log_start_offset"] = err.details["earliest"]
            return answer
        except Exception as exc:
            answer["error_code"] = error_code(wire_error(exc, "a Kafka fetch"))
            return answer
        room[0] = max(0, room[0] - len(data))
        answer.update(
            error_code=ErrorCode.none,
            high_watermark=high,
            last_stable_offset=high,
            records=data,
        )
        return answer

    async def _wait_for_records(
        self, wanted: list[tuple[str, Any]], answers: list[dict[str, Any]], wait_s: float
    ) -> None:
        """Wait until a record arrives in any of the partitions that answered without an
        error (a follow read of each, as the HTTP long poll does), or ``wait_s``."""

        async def one(topic: str, p: Any) -> None:
            table = await self._table(topic)
            if table is None:
                return
            d = table.definition

            def nothing(result: ReadResult) -> tuple[int, int]:
                return result.num_records, 0

            results = self.calls.follow(
                self.tenant,
                d.namespace,
                d.name,
                p.partition,
                p.fetch_offset,
                nothing,
                max_records=1,
                max_bytes=1,
                max_wait_s=wait_s,
                authorization=self.authorization,
            )
            try:
                async for found in results:
                    if found:
                        return
                    await asyncio.sleep(wait_s + 1)  # nothing: let the others decide
            finally:
                await results.aclose()  # type: ignore[attr-defined]

        followed = [
            asyncio.ensure_future(one(topic, p))
            for (topic, p), a in zip(wanted, answers, strict=True)
            if a.get("error_code") == ErrorCode.none
        ]
        if not followed:
            await asyncio.sleep(wait_s)
            return
        try:
            await asyncio.wait(followed, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in followed:
                task.cancel()
            for task in followed:
                with contextlib.suppress(BaseException):
                    await task

    # ListOffsets -------------------------------------------------------------------------
    async def list_offsets(self, request: Request) -> Any:
        topics = []
        for t in request.body.topics:
            answers = []
            table = await self._table(t.name)
            for p in t.partitions:
                answers.append(await self._list_offset(table, p.partition_index, p.timestamp))
            topics.append({"name": t.name, "partitions": answers})
        return build(response_class(request), {"topics": topics})

    async def _list_offset(
        self, table: TableView | None, partition: int, ts: int
    ) -> dict[str, Any]:
        answer: dict[str, Any] = {"partition_index": partition, "timestamp": -1, "offset": -1}
        if table is None:
            answer["error_code"] = ErrorCode.unknown_topic_or_partition
            return answer
        d = table.definition
        try:
            if ts in (_LATEST, _EARLIEST, _MAX_TIMESTAMP):
                bounds = await self.calls.offset_bounds(
                    self.tenant, d.namespace, d.name, [partition]
                )
                earliest, latest = bounds[partition]
                answer["offset"] = earliest if ts == _EARLIEST else latest
            elif ts >= 0:
                found = await self.calls.offsets_for_times(
                    self.tenant, d.namespace, d.name, ts * 1000, [partition]
                )
                bounds = await self.calls.offset_bounds(
                    self.tenant, d.namespace, d.name, [partition]
                )
                if found[partition] < bounds[partition][1]:
                    answer["offset"] = found[partition]
                    answer["timestamp"] = ts
                # else no record at or after the time: offset -1, as Kafka answers
            else:
                answer["error_code"] = ErrorCode.invalid_request
                return answer
        except Exception as exc:
            answer["error_code"] = error_code(wire_error(exc, "a Kafka list offsets"))
            return answer
        answer["error_code"] = ErrorCode.none
        return answer

    # Committed offsets ----------------------------------------------------------------
    async def find_coordinator(self, request: Request) -> Any:
        """This gateway coordinates every group (its groups live in the metadata store that
        every replica shares); transactions have no coordinator yet."""
        body = request.body
        keys = list(body.coordinator_keys) if request.api_version >= 4 else [body.key]
        group = getattr(body, "key_type", 0) == 0
        answers = [
            {
                "key": key,
                "node_id": NODE_ID if group else -1,
                "host": self.broker.host if group else "",
                "port": self.broker.port if group else -1,
                "error_code": ErrorCode.none if group else ErrorCode.coordinator_not_available,
                "error_message": None
                if group
                else "transactions are not served by Tidegate's Kafka listener yet",
            }
            for key in keys
        ]
        if request.api_version >= 4:
            return build(response_class(request), {"coordinators": answers})
        return build(response_class(request), answers[0])

    async def offset_commit(self, request: Request) -> Any:
        """A group's committed offsets, the same the SDK, HTTP and the console show. A
        consumer outside the group protocol (generation -1) commits as a client outside
        the group does: only while the group has no live member."""
        body = request.body
        generation = body.generation_id_or_member_epoch
        member = body.member_id if generation >= 0 else ""
        topics = []
        for t in body.topics:
            offsets = {p.partition_index: p.committed_offset for p in t.partitions}
            code = ErrorCode.none
            parts = split_topic(t.name)
            try:
                if parts is None:
                    raise TableNotFound(f"no table {t.name!r}")
                await self.service.commit_offsets(
                    self.tenant,
                    body.group_id,
                    *parts,
                    offsets,
                    member_id=member,
                    generation=max(0, generation),
                )
            except Exception as exc:
                code = error_code(wire_error(exc, "a Kafka offset commit"))
            topics.append(
                {
                    "name": t.name,
                    "partitions": [{"partition_index": p, "error_code": code} for p in offsets],
                }
            )
        return build(response_class(request), {"topics": topics})

    async def offset_fetch(self, request: Request) -> Any:
        body = request.body
        group = body.group_id
        code = ErrorCode.none
        answers: list[dict[str, Any]] = []
        try:
            if body.topics is None:  # every table the group committed for
                wanted: list[tuple[str, list[int] | None]] = [
                    (f"{ns}.{name}", None)
                    for g, ns, name in await self.service.list_groups(self.tenant)
                    if g == group
                ]
            else:
                wanted = [(t.name, list(t.partition_indexes)) for t in body.topics]
            for topic, partitions in wanted:
                answers.append(await self._committed(group, topic, partitions))
        except Exception as exc:
            code = error_code(wire_error(exc, "a Kafka offset fetch"))
        return build(response_class(request), {"topics": answers, "error_code": code})

    async def _committed(
        self, group: str, topic: str, partitions: list[int] | None
    ) -> dict[str, Any]:
        table = await self._table(topic)
        if table is None:
            codes = dict.fromkeys(partitions or [], ErrorCode.unknown_topic_or_partition)
            return {
                "name": topic,
                "partitions": [
                    {"partition_index": p, "committed_offset": -1, "error_code": c}
                    for p, c in codes.items()
                ],
            }
        d = table.definition
        wanted = partitions if partitions is not None else list(range(d.partitions))
        known = [p for p in wanted if 0 <= p < d.partitions]
        got = await self.service.fetch_offsets(self.tenant, group, d.namespace, d.name, known)
        return {
            "name": topic,
            "partitions": [
                {
                    "partition_index": p,
                    # -1: nothing committed, as Kafka answers it.
                    "committed_offset": got.get(p, -1),
                    "metadata": "",
                    "error_code": ErrorCode.none
                    if p in known
                    else ErrorCode.unknown_topic_or_partition,
                }
                for p in wanted
            ],
        }

    # CreateTopics -----------------------------------------------------------------------
    async def create_topics(self, request: Request) -> Any:
        """A topic created over Kafka is a table of the raw schema (:data:`RAW_FIELDS`):
        records kept as they came. ``retention.ms`` is the table's retention; the
        replication factor and the other configs have no meaning for a table and are
        ignored."""
        body = request.body
        answers = []
        for t in body.topics:
            answer: dict[str, Any] = {"name": t.name, "error_code": ErrorCode.none}
            configs = {c.name: c.value for c in t.configs}
            partitions = t.num_partitions if t.num_partitions > 0 else 1
            try:
                parts = split_topic(t.name)
                if parts is None:
                    raise InvalidRequest(
                        f"topic {t.name!r} is not a table name: name it namespace.name"
                    )
                retention = configs.get("retention.ms")
                retention_ms = int(retention) if retention and int(retention) > 0 else None
                if not body.validate_only:
                    view = await self.calls.create_table(
                        self.tenant,
                        *parts,
                        [{"name": n, "type": ty} for n, ty in RAW_FIELDS.items()],
                        partitions,
                        retention_ms=retention_ms,
                    )
                    answer["topic_id"] = topic_id(view)
                answer.update(num_partitions=partitions, replication_factor=1, configs=[])
            except ValueError:
                answer["error_code"] = ErrorCode.invalid_config
                answer["error_message"] = (
                    f"retention.ms {configs.get('retention.ms')!r} is not a number"
                )
            except Exception as exc:
                err = wire_error(exc, "a Kafka create topics")
                answer["error_message"] = _message(err, t.name)
                if isinstance(err, TableAlreadyExists):
                    answer["error_code"] = ErrorCode.topic_already_exists
                elif isinstance(err, QuotaExceeded):
                    answer["error_code"] = ErrorCode.policy_violation
                elif isinstance(err, InvalidRequest):
                    answer["error_code"] = ErrorCode.invalid_topic_exception
                else:
                    answer["error_code"] = error_code(err)
            answers.append(answer)
        return build(response_class(request), {"topics": answers})

    async def delete_topics(self, request: Request) -> Any:
        """Drop the tables, as the SDK's ``drop_table`` does (their Iceberg tables too)."""
        answers = []
        for name in request.body.topic_names:
            answer: dict[str, Any] = {"name": name, "error_code": ErrorCode.none}
            parts = split_topic(name)
            try:
                if parts is None:
                    raise TableNotFound(f"no table {name!r}")
                await self.service.drop_table(self.tenant, *parts)
            except Exception as exc:
                err = wire_error(exc, "a Kafka delete topics")
                answer.update(error_code=error_code(err), error_message=_message(err, name))
            answers.append(answer)
        return build(response_class(request), {"responses": answers})

    _handlers: dict[int, Callable[[KafkaApis, Request], Awaitable[Any]]] = {
        METADATA: metadata,
        PRODUCE: produce,
        FETCH: fetch,
        LIST_OFFSETS: list_offsets,
        FIND_COORDINATOR: find_coordinator,
        OFFSET_COMMIT: offset_commit,
        OFFSET_FETCH: offset_fetch,
        CREATE_TOPICS: create_topics,
        DELETE_TOPICS: delete_topics,
    }


async def held_while_throttled(call: Callable[[], Awaitable[T]], until: float) -> tuple[T, int]:
    """``call()`` and the milliseconds it was held: while it is throttled, the connection
    waits the time it is told and tries again (Kafka mutes an over-quota client's channel
    the same way) until ``until`` (monotonic).

    Raises:
        Throttled: still throttled at ``until``.
    """
    held = 0
    while True:
        try:
            return await call(), held
        except Throttled as err:
            pause = (err.retry_after_ms or 100) / 1000
            if time.monotonic() + pause > until:
                raise
            await asyncio.sleep(pause)
            held += int(pause * 1000)


class _Refused(Exception):
    """Records of a Produce refused one by one (the answer names each)."""


def _fetch_waits(body: Any) -> bool:
    return bool(body.max_wait.total_seconds() > 0)
