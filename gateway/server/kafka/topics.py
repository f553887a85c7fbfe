"""Kafka's Metadata, CreateTopics and DeleteTopics: topics are the tenant's tables, named
``namespace.name``; a topic created over Kafka is a table of the raw schema."""

from __future__ import annotations

import json
import uuid
from typing import Any

from gateway.core import TableView
from gateway.server.calls import wire_error
from gateway.server.kafka.base import ApisBase, message, split_topic, topic_id
from gateway.server.kafka.protocol import ErrorCode, Request, build, error_code, response_class
from gateway.server.kafka.records import RAW_FIELDS
from gateway.wire.errors import (
    InvalidRequest,
    InvalidSchema,
    QuotaExceeded,
    SchemaMismatch,
    TableAlreadyExists,
    TableNotFound,
)

#: The configs of CreateTopics that shape the table (docs/kafka.md, "Topics with a schema").
SCHEMA_CONFIG, KEY_CONFIG, PRIMARY_KEY_CONFIG = (
    "tidegate.schema",
    "tidegate.key.columns",
    "tidegate.primary.key",
)


class BadTopicConfig(Exception):
    """A CreateTopics config that cannot be read (Kafka's INVALID_CONFIG)."""


def _columns(value: str | None) -> list[str]:
    return [c.strip() for c in (value or "").split(",") if c.strip()]


def _retention(topic: str, name: str, value: str | None) -> int | None:
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        raise BadTopicConfig(
            f"{name} {value!r} of topic {topic} is not a number (-1: no limit)"
        ) from None
    return n if n > 0 else None


def table_of(topic: str, configs: dict[str, str | None]) -> tuple[Any, dict[str, Any]]:
    """The schema and the create options of a table made by CreateTopics: the raw schema,
    unless ``tidegate.schema`` names one (JSON, as ``POST /v1/tables`` takes it: a list of
    fields or ``{"column": "type"}``); ``tidegate.key.columns`` and ``tidegate.primary.key``
    (comma-separated columns); ``retention.ms`` and ``tidegate.retention.records``.

    Raises:
        BadTopicConfig: a config that is not what it must be (one sentence naming it).
    """
    options: dict[str, Any] = {
        "retention_ms": _retention(topic, "retention.ms", configs.get("retention.ms")),
        "retention_records": _retention(
            topic, "tidegate.retention.records", configs.get("tidegate.retention.records")
        ),
    }
    schema = configs.get(SCHEMA_CONFIG)
    keys, primary = _columns(configs.get(KEY_CONFIG)), _columns(configs.get(PRIMARY_KEY_CONFIG))
    if not schema:
        if keys or primary:
            raise BadTopicConfig(
                f"{KEY_CONFIG} and {PRIMARY_KEY_CONFIG} of topic {topic} name columns of a "
                f"schema: give it in {SCHEMA_CONFIG} (a raw topic has key, value, headers "
                "and timestamp only)"
            )
        return [{"name": n, "type": ty} for n, ty in RAW_FIELDS.items()], options
    try:
        fields = json.loads(schema)
    except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
        raise BadTopicConfig(
            f"{SCHEMA_CONFIG} of topic {topic} is not JSON; give the schema as "
            '{"column": "type", ...} or a list of fields, as POST /v1/tables takes it'
        ) from None
    return fields, {**options, "key_columns": keys, "primary_key": primary}


class TopicApis(ApisBase):
    """Metadata, CreateTopics and DeleteTopics."""

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
            by_id: dict[uuid.UUID, TableView] | None = None
            for t in wanted:
                wanted_id = getattr(t, "topic_id", None)
                if t.name is None and wanted_id is not None and wanted_id.int:
                    # v10+ asks by topic id (a KIP-848 member learns its assignment so):
                    # looked up among the tenant's tables only.
                    if by_id is None:
                        by_id = {
                            topic_id(table): table
                            for table in await self.service.list_tables(self.tenant)
                        }
                    topics.append(self._topic_by_id(wanted_id, by_id.get(wanted_id)))
                    continue
                name = t.name or ""
                topics.append(self._topic(name, await self._table(name)))
        return build(
            response_class(request),
            {
                # The live replicas; each partition's leader is one of them (any serves it).
                "brokers": [
                    {"node_id": b.node_id, "host": b.host, "port": b.port}
                    for b in self.cluster.brokers
                ],
                "cluster_id": self.broker.cluster_id,
                "controller_id": self.cluster.controller_id,
                "topics": topics,
            },
        )

    def _topic_by_id(self, wanted: uuid.UUID, table: TableView | None) -> dict[str, Any]:
        if table is None:
            return {"name": None, "topic_id": wanted, "error_code": ErrorCode.unknown_topic_id}
        d = table.definition
        return self._topic(f"{d.namespace}.{d.name}", table)

    def _topic(self, name: str, table: TableView | None) -> dict[str, Any]:
        if table is None:
            return {"name": name, "error_code": ErrorCode.unknown_topic_or_partition}
        d = table.definition
        leaders = [self.cluster.leader(d.table_id, p).node_id for p in range(d.partitions)]
        return {
            "name": name,
            "topic_id": topic_id(table),
            "partitions": [
                {
                    "partition_index": p,
                    "leader_id": leader,
                    "leader_epoch": -1,
                    "replica_nodes": [leader],
                    "isr_nodes": [leader],
                }
                for p, leader in enumerate(leaders)
            ],
        }

    async def create_topics(self, request: Request) -> Any:
        """A topic created over Kafka is a table of the raw schema (:data:`RAW_FIELDS`):
        records kept as they came, unless its configs name a schema (:func:`table_of`).
        ``retention.ms`` is the table's retention; the replication factor and the other
        configs have no meaning for a table and are ignored."""
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
                fields, options = table_of(t.name, configs)
                if not body.validate_only:
                    view = await self.calls.create_table(
                        self.tenant, *parts, fields, partitions, **options
                    )
                    answer["topic_id"] = topic_id(view)
                answer.update(num_partitions=partitions, replication_factor=1, configs=[])
            except BadTopicConfig as bad:
                answer.update(error_code=ErrorCode.invalid_config, error_message=str(bad))
            except Exception as exc:
                err = wire_error(exc, "a Kafka create topics")
                answer["error_message"] = message(err, t.name)
                if isinstance(err, TableAlreadyExists):
                    answer["error_code"] = ErrorCode.topic_already_exists
                elif isinstance(err, QuotaExceeded):
                    answer["error_code"] = ErrorCode.policy_violation
                elif isinstance(err, (InvalidSchema, SchemaMismatch)):
                    # The schema, key or primary key its configs named.
                    answer["error_code"] = ErrorCode.invalid_config
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
                answer.update(error_code=error_code(err), error_message=message(err, name))
            answers.append(answer)
        return build(response_class(request), {"responses": answers})
