"""Kafka's admin APIs over the same core as every other edge: DescribeConfigs and
IncrementalAlterConfigs (a table's settings as topic configs: its retention is the one
HTTP's ``PATCH /v1/tables/...`` and the SDK change), CreatePartitions (refused: a table's
partition count is fixed at creation), DescribeCluster (this gateway, at its advertised
address) and OffsetDelete (the group's committed offsets the SDK shows)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.consumer_protocol_subscription.v0.data import ConsumerProtocolSubscription
from kio.serial import entity_reader

from gateway.core import TableView
from gateway.core.names import check_group
from gateway.server.calls import wire_error
from gateway.server.kafka.base import ApisBase, message, split_topic
from gateway.server.kafka.classic import ClassicGroup, ClassicGroups
from gateway.server.kafka.consumer_groups import ConsumerGroups
from gateway.server.kafka.protocol import ErrorCode, Request, build, error_code, response_class
from gateway.server.kafka.records import is_raw
from gateway.wire.errors import GroupNotEmpty, InvalidRequest, TidegateError

__all__ = ["TOPIC_CONFIGS", "AdminApis", "subscribed_topics"]

#: Kafka's resource types (DescribeConfigs, IncrementalAlterConfigs).
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
#: Kafka's config sources and types (DescribeConfigs v1+, v3+).
_DYNAMIC_TOPIC, _DEFAULT = 1, 5
_STRING, _LONG, _LIST = 2, 5, 7
#: IncrementalAlterConfigs' operations.
_SET, _DELETE, _APPEND, _SUBTRACT = 0, 1, 2, 3
_OPS = {_SET: "SET", _DELETE: "DELETE", _APPEND: "APPEND", _SUBTRACT: "SUBTRACT"}
#: What a tenant may do to the cluster (Kafka's ACL operation codes as a bit field):
#: create topics, describe, write idempotently.
_CLUSTER_OPERATIONS = (1 << 5) | (1 << 8) | (1 << 12)
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A table's setting as a Kafka topic config: its value (None: not set), the type
    Kafka tools show it as, and the core's option when it may be altered."""

    value: Callable[[TableView], str | None]
    config_type: int
    doc: str
    option: str | None = None


def _retention(value: int | None) -> str:
    return str(value) if value else "-1"


#: The configs a topic (a table) answers, by Kafka name. Only the retentions may be
#: altered: the others are fixed at creation.
TOPIC_CONFIGS: dict[str, TopicConfig] = {
    "retention.ms": TopicConfig(
        lambda t: _retention(t.definition.retention_ms),
        _LONG,
        "Remove records this many milliseconds after their append; -1: no limit by age.",
        "retention_ms",
    ),
    "tidegate.retention.records": TopicConfig(
        lambda t: _retention(t.definition.retention_records),
        _LONG,
        "Keep at most this many records per partition, the newest; -1: no limit by count.",
        "retention_records",
    ),
    "retention.bytes": TopicConfig(
        lambda t: "-1", _LONG, "Tidegate's tables have no retention by size."
    ),
    "cleanup.policy": TopicConfig(
        lambda t: "delete", _LIST, "Records past the retention are removed, never compacted."
    ),
    "message.timestamp.type": TopicConfig(
        lambda t: "CreateTime" if is_raw(t.schema) else "LogAppendTime",
        _STRING,
        "A typed table's record time is its append (_timestamp); a raw table keeps the producer's.",
    ),
    "tidegate.key.columns": TopicConfig(
        lambda t: ",".join(t.definition.key_columns),
        _LIST,
        "Columns whose hash routes an SDK or HTTP append to a partition.",
    ),
    "tidegate.primary.key": TopicConfig(
        lambda t: ",".join(t.definition.primary_key.columns) if t.definition.primary_key else "",
        _LIST,
        "The primary key of a primary-key table (appends are upserts); empty: append-only.",
    ),
}
_ALTERABLE = ", ".join(n for n, c in TOPIC_CONFIGS.items() if c.option)


class ConfigRefused(Exception):
    """A config change Kafka refuses with ``code``; the message is its one sentence."""

    def __init__(self, code: ErrorCode, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


def _config_value(topic: str, name: str, op: int, value: str | None) -> int:
    """The core's value for a SET or DELETE of an alterable ``name`` (0: no limit)."""
    if op == _DELETE:
        return 0
    if op != _SET:
        raise ConfigRefused(
            ErrorCode.invalid_config,
            f"{_OPS.get(op, op)} is not an operation for {name} of topic {topic}, which is "
            "not a list: use SET or DELETE",
        )
    try:
        number = int(value or "")
    except ValueError:
        number = 0
    if number == -1:
        return 0
    if not 1 <= number <= _INT64_MAX:
        raise ConfigRefused(
            ErrorCode.invalid_config,
            f"{name} {value!r} of topic {topic} is not accepted: give a whole number from 1 "
            f"to {_INT64_MAX}, or -1 for no limit",
        )
    return number


def _alterable(topic: str, name: str) -> str:
    """The core's option of config ``name``, or the refusal of a read-only or unknown one."""
    config = TOPIC_CONFIGS.get(name)
    if config is not None and config.option is not None:
        return config.option
    why = (
        f"config {name!r} of topic {topic} is read-only (fixed when the table was created)"
        if config is not None
        else f"{name!r} is not a config of topic {topic}"
    )
    raise ConfigRefused(
        ErrorCode.invalid_config, f"{why}; the configs that may be altered are {_ALTERABLE}"
    )


def subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics a classic consumer's subscription (its JoinGroup protocol metadata)
    names; None for bytes that are not one (then, as Kafka's coordinator does, the member
    is taken to read every topic). Every version starts with the same topics array, so
    version 0's reader reads any."""
    if len(metadata) < 2 or struct.unpack_from(">h", metadata)[0] < 0:
        return None
    try:
        subscription, _ = entity_reader(ConsumerProtocolSubscription)(metadata, 2)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # kio raises several kinds for bytes it cannot read
        return None
    return frozenset(t for t in subscription.topics if t)


def _classic_reads(group: ClassicGroup, topic: str) -> bool:
    """Whether a member of the classic ``group`` may be reading ``topic``: it names it in
    the subscription of the protocol chosen, or no protocol is chosen yet, or its
    subscription cannot be read (Kafka's coordinator answers alike)."""
    for member in group.members.values():
        topics = subscribed_topics(member.protocols.get(group.protocol, b""))
        if not group.protocol or topics is None or topic in topics:
            return True
    return False


class AdminApis(ApisBase):
    """DescribeConfigs, IncrementalAlterConfigs, CreatePartitions, DescribeCluster and
    OffsetDelete."""

    groups: ClassicGroups
    consumer_groups: ConsumerGroups

    # Configs --------------------------------------------------------------------------
    def _broker_names(self) -> set[str]:
        """The names a broker resource may have: a live broker's node id, or empty."""
        return {"", *(str(b.node_id) for b in self.cluster.brokers)}

    async def describe_configs(self, request: Request) -> Any:
        body = request.body
        results = []
        for r in body.resources:
            answer: dict[str, Any] = {
                "resource_type": r.resource_type,
                "resource_name": r.resource_name,
                "error_code": ErrorCode.none,
                "configs": [],
            }
            if r.resource_type == BROKER_RESOURCE and r.resource_name in self._broker_names():
                pass  # the gateway's settings are its configuration file's, not Kafka's
            elif r.resource_type != TOPIC_RESOURCE:
                answer["error_code"] = ErrorCode.invalid_request
                answer["error_message"] = _not_a_topic(r.resource_type, r.resource_name)
            else:
                table = await self._table(r.resource_name, fresh=True)
                if table is None:
                    answer["error_code"] = ErrorCode.unknown_topic_or_partition
                    answer["error_message"] = f"{r.resource_name}: no such topic"
                else:
                    wanted = r.configuration_keys
                    answer["configs"] = [
                        _described(name, TOPIC_CONFIGS[name], table, body)
                        for name in TOPIC_CONFIGS
                        if wanted is None or not wanted or name in wanted
                    ]
            results.append(answer)
        return build(response_class(request), {"results": results})

    async def incremental_alter_configs(self, request: Request) -> Any:
        """Each topic's changes are checked together and applied at once (all or none),
        through the core's ``set_retention``, as HTTP's ``PATCH`` and the SDK change it."""
        body = request.body
        answers = []
        for r in body.resources:
            answer: dict[str, Any] = {
                "resource_type": r.resource_type,
                "resource_name": r.resource_name,
                "error_code": ErrorCode.none,
            }
            try:
                await self._alter(r, body.validate_only)
            except ConfigRefused as refused:
                answer.update(error_code=refused.code, error_message=refused.text[:1000])
            except Exception as exc:
                err = wire_error(exc, "a Kafka alter configs")
                answer.update(
                    error_code=_config_error(err), error_message=message(err, r.resource_name)
                )
            answers.append(answer)
        return build(response_class(request), {"responses": answers})

    async def _alter(self, resource: Any, validate_only: bool) -> None:
        topic = resource.resource_name
        if resource.resource_type != TOPIC_RESOURCE:
            raise ConfigRefused(
                ErrorCode.invalid_request, _not_a_topic(resource.resource_type, topic)
            )
        names = [c.name for c in resource.configs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigRefused(
                ErrorCode.invalid_request,
                f"config {twice[0]!r} of topic {topic} is altered twice in one request: "
                "give each config once",
            )
        table = await self._table(topic)
        if table is None:
            raise ConfigRefused(ErrorCode.unknown_topic_or_partition, f"{topic}: no such topic")
        changes = {
            _alterable(topic, c.name): _config_value(topic, c.name, c.config_operation, c.value)
            for c in resource.configs
        }
        if changes and not validate_only:
            d = table.definition
            await self.service.set_retention(
                self.tenant,
                d.namespace,
                d.name,
                changes.get("retention_ms"),
                changes.get("retention_records"),
            )

    # Partitions -----------------------------------------------------------------------
    async def create_partitions(self, request: Request) -> Any:
        """A table's partition count is fixed at creation (key routing and primary keys
        hash to it; the hot tier, the Iceberg table and committed offsets are laid out by
        it), so a request for more is refused with ``INVALID_PARTITIONS``; a request for
        as many or fewer is refused as Kafka refuses it."""
        answers = []
        names = [t.name for t in request.body.topics]
        for t in request.body.topics:
            answer: dict[str, Any] = {"name": t.name, "error_code": ErrorCode.invalid_partitions}
            table = await self._table(t.name)
            if names.count(t.name) > 1:
                answer.update(
                    error_code=ErrorCode.invalid_request,
                    error_message=f"topic {t.name} is named twice in one request: name it once",
                )
            elif table is None:
                answer.update(
                    error_code=ErrorCode.unknown_topic_or_partition,
                    error_message=f"{t.name}: no such topic",
                )
            else:
                have = table.definition.partitions
                if t.count < have:
                    why = (
                        f"has {have} partitions, more than the {t.count} asked: partitions "
                        "are never removed"
                    )
                elif t.count == have:
                    why = f"already has {have} partitions"
                else:
                    why = (
                        f"keeps its {have} partitions: a Tidegate table's partition count is fixed "
                        "at creation (its keys are routed by it); create a table with "
                        f"{t.count} partitions and copy the records into it"
                    )
                answer["error_message"] = f"topic {t.name} {why}"
            answers.append(answer)
        return build(response_class(request), {"results": answers})

    # Cluster --------------------------------------------------------------------------
    async def describe_cluster(self, request: Request) -> Any:
        """The live replicas at their advertised addresses (as Metadata names them)."""
        body = request.body
        cls = response_class(request)
        endpoint = getattr(body, "endpoint_type", 1)
        if endpoint != 1:
            code = (
                ErrorCode.unsupported_endpoint_type if endpoint == 2 else ErrorCode.invalid_request
            )
            return build(
                cls,
                {
                    "error_code": code,
                    "error_message": f"endpoint type {endpoint} is not served: this listener "
                    "describes its brokers (endpoint type 1), and has no controllers",
                    "endpoint_type": endpoint,
                    "cluster_id": self.broker.cluster_id,
                    "controller_id": -1,
                },
            )
        return build(
            cls,
            {
                "endpoint_type": 1,
                "cluster_id": self.broker.cluster_id,
                "controller_id": self.cluster.controller_id,
                "brokers": [
                    {"broker_id": b.node_id, "host": b.host, "port": b.port, "rack": None}
                    for b in self.cluster.brokers
                ],
                "cluster_authorized_operations": _CLUSTER_OPERATIONS
                if body.include_cluster_authorized_operations
                else -(2**31),
            },
        )

    # Committed offsets ----------------------------------------------------------------
    async def offset_delete(self, request: Request) -> Any:
        """Forget a group's committed offsets, the ones the SDK, HTTP and the console show.
        A partition of a topic the group is reading (a classic member of this listener
        subscribed to it, or a live member of the gateway's group of that table) answers
        ``GROUP_SUBSCRIBED_TO_TOPIC``, as Kafka answers it."""
        body = request.body
        cls = response_class(request)
        group = body.group_id
        try:
            check_group(group)
        except InvalidRequest:
            return build(cls, {"error_code": ErrorCode.invalid_group_id})
        if self._elsewhere(group):
            return build(cls, {"error_code": ErrorCode.not_coordinator})
        classic = self.groups.find(self.tenant, group)
        consumer = self.consumer_groups.find(self.tenant, group)
        if classic is not None and classic.members:
            if classic.protocol_type != "consumer":
                return build(cls, {"error_code": ErrorCode.non_empty_group})
        elif consumer is None and not any(
            g == group for g, _, _ in await self.service.list_groups(self.tenant)
        ):
            return build(cls, {"error_code": ErrorCode.group_id_not_found})
        topics = []
        for t in body.topics:
            wanted = [p.partition_index for p in t.partitions]
            reading = (
                classic is not None and bool(classic.members) and _classic_reads(classic, t.name)
            ) or (consumer is not None and consumer.reads(t.name))
            codes = await self._delete_offsets(group, t.name, wanted, reading)
            topics.append(
                {
                    "name": t.name,
                    "partitions": [
                        {"partition_index": p, "error_code": codes.get(p, ErrorCode.none)}
                        for p in wanted
                    ],
                }
            )
        return build(cls, {"topics": topics})

    async def _delete_offsets(
        self, group: str, topic: str, wanted: list[int], subscribed: bool
    ) -> dict[int, ErrorCode]:
        """Each partition's error (none when absent)."""
        table = await self._table(topic)
        parts = split_topic(topic)
        if table is None or parts is None:
            return dict.fromkeys(wanted, ErrorCode.unknown_topic_or_partition)
        if subscribed:
            return dict.fromkeys(wanted, ErrorCode.group_subscribed_to_topic)
        n = table.definition.partitions
        codes = {p: ErrorCode.unknown_topic_or_partition for p in wanted if not 0 <= p < n}
        known = [p for p in wanted if p not in codes]
        if not known:
            return codes
        try:
            await self.service.delete_offsets(self.tenant, group, *parts, known)
        except Exception as exc:
            err = wire_error(exc, "a Kafka offset delete")
            code = (
                ErrorCode.group_subscribed_to_topic
                if isinstance(err, GroupNotEmpty)
                else error_code(err)
            )
            codes.update(dict.fromkeys(known, code))
        return codes


def _described(name: str, config: TopicConfig, table: TableView, body: Any) -> dict[str, Any]:
    value = config.value(table)
    dynamic = config.option is not None and value != "-1"
    return {
        "name": name,
        "value": value,
        "read_only": config.option is None,
        "config_source": _DYNAMIC_TOPIC if dynamic else _DEFAULT,
        "is_sensitive": False,
        "synonyms": [],
        "config_type": config.config_type,
        "documentation": config.doc if getattr(body, "include_documentation", False) else None,
    }


def _not_a_topic(resource_type: int, name: str) -> str:
    return (
        f"resource {name!r} of type {resource_type} has no configs here: this listener "
        f"answers topics (type {TOPIC_RESOURCE}); the gateway's own settings are in its "
        "configuration, not changed over Kafka"
    )


def _config_error(err: TidegateError) -> ErrorCode:
    if isinstance(err, InvalidRequest):
        return ErrorCode.invalid_config
    return error_code(err)
