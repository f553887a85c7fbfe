"""Gateway replicas sharing a metadata store (PostgreSQL) and a hot tier (Redis) are one
Kafka cluster: each is a broker at its advertised address, partitions' leaders are spread
over them, and a group's members meet on the one replica that coordinates it, whichever
replica they bootstrapped at; when that replica dies, its lease runs out and the group
re-forms on a survivor from its committed offsets (docs/kafka.md)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema

from gateway.meta import MetadataStore
from gateway.server.kafka.cluster import Broker, node_id_of, rendezvous
from gateway.server.kafka.protocol import ErrorCode, build
from gateway.server.kafka.published import CLASSIC, CONSUMER
from tests.integration.conftest import gateway_env
from tests.kafka.clients import CLIENTS, ConfluentKafka, KafkaClient, librdkafka_settings
from tests.kafka.conftest import KafkaTarget
from tests.kafka.members import Member, described_holdings, holding, until
from tests.kafka.raw import RawKafka
from tests.services import GatewayProcess, RedisServer, free_port, scratch_database

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

PARTITIONS = 6
#: The replicas' lease: a killed replica leaves the cluster this long after its last
#: renewal.
LEASE_S = 3


@contextlib.contextmanager
def replicas(
    root: Path, redis_server: RedisServer, postgres_url: str
) -> Iterator[list[KafkaTarget]]:
    """Two gateways over one Redis and one PostgreSQL metadata store (and one warehouse),
    each with its own Kafka listener, as the same tenant."""
    with scratch_database(postgres_url, "replicas") as metadata:
        env = {
            **gateway_env("redis", redis_server),
            "TIDEGATE_METADATA__URL": metadata,
            "TIDEGATE_COLD__WAREHOUSE": str(root / "warehouse"),
            "TIDEGATE_COLD__CATALOG__TYPE": "sql",
            "TIDEGATE_COLD__CATALOG__URI": f"sqlite:///{root / 'catalog.db'}",
            "TIDEGATE_TIERING__ENABLED": "false",
            "TIDEGATE_AUTH__OPERATOR_KEY": f"tgop_replicas_{secrets.token_hex(16)}",
            "TIDEGATE_KAFKA__REPLICA_LEASE_S": str(LEASE_S),
            "TIDEGATE_KAFKA__CONSUMER_SESSION_TIMEOUT_MS": "6000",
            "TIDEGATE_KAFKA__CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
        }
        gateways: list[GatewayProcess] = []
        try:
            for n in range(2):
                kafka_env = {**env, "TIDEGATE_KAFKA__PORT": str(free_port())}
                first = gateways[0] if gateways else None
                gw = GatewayProcess(
                    root / f"gw{n}",
                    kafka_env,
                    tenant=first.tenant if first else None,
                    api_key=first.api_key if first else None,
                )
                gateways.append(gw)
                gw.start()
            targets = [
                KafkaTarget(gw, f"127.0.0.1:{gw.kafka_port}", gw.tenant, gw.api_key or "")
                for gw in gateways
            ]
            # The first sees the second at its next renewal (a third of the lease).
            until(
                "the replicas to see each other",
                lambda: all(len(_brokers(t)) == 2 for t in targets),
            )
            yield targets
        finally:
            for gw in gateways:
                gw.stop()


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, postgres_url: str
) -> Iterator[list[KafkaTarget]]:
    with replicas(tmp_path_factory.mktemp("replicas"), redis_server, postgres_url) as targets:
        yield targets


def _request(api_key: int, version: int, **values: Any) -> Any:
    return build(load_request_schema(api_key, version), values)


def _call(target: KafkaTarget, request: Any) -> Any:
    with RawKafka(target) as conn:
        conn.authenticate(target.tenant, target.key)
        return conn.call(request)


def _brokers(target: KafkaTarget) -> dict[int, tuple[str, int]]:
    answer = _call(target, _request(3, 12, topics=[], allow_auto_topic_creation=False))
    return {b.node_id: (b.host, b.port) for b in answer.brokers}


def _leaders(target: KafkaTarget, topic: str) -> dict[int, int]:
    answer = _call(
        target, _request(3, 12, topics=[{"name": topic}], allow_auto_topic_creation=False)
    )
    (t,) = answer.topics
    assert t.error_code == ErrorCode.none
    return {p.partition_index: p.leader_id for p in t.partitions}


def _coordinator(target: KafkaTarget, group: str) -> tuple[int, str, int]:
    answer = _call(target, _request(10, 4, key_type=0, coordinator_keys=[group]))
    (c,) = answer.coordinators
    assert c.error_code == ErrorCode.none
    return c.node_id, c.host, c.port


def _table(target: KafkaTarget, partitions: int = PARTITIONS) -> str:
    topic = f"r{secrets.token_hex(5)}.clicks"
    with target.gateway.client() as c:
        c.create_table(topic, {"id": "int64"}, partitions=partitions)
    return topic


def _produce(target: KafkaTarget, topic: str, first: int, per_partition: int) -> None:
    values = [
        (p, json.dumps({"id": first + p * per_partition + i}).encode())
        for p in range(PARTITIONS)
        for i in range(per_partition)
    ]
    ConfluentKafka().produce(target, topic, values)


def test_either_replica_lists_both_as_brokers_and_spreads_the_leaders(
    pair: list[KafkaTarget],
) -> None:
    addresses = {("127.0.0.1", t.gateway.kafka_port) for t in pair}
    seen = [_brokers(t) for t in pair]
    assert seen[0] == seen[1]
    assert set(seen[0].values()) == addresses
    nodes = set(seen[0])
    assert len(nodes) == 2 and all(n >= 0 for n in nodes)
    # DescribeCluster tells the same brokers.
    described = _call(pair[1], _request(60, 0, include_cluster_authorized_operations=False))
    assert {b.broker_id: (b.host, b.port) for b in described.brokers} == seen[0]
    # Every partition's leader is a live broker, the same from either replica, and the
    # leaders of many partitions fall on both.
    topic = _table(pair[0], partitions=24)
    leaders = _leaders(pair[0], topic)
    assert leaders == _leaders(pair[1], topic)
    assert set(leaders.values()) == nodes
    # A group's coordinator is one replica, the same from either; groups fall on both.
    coordinators = {_coordinator(pair[0], f"g{n}") for n in range(16)}
    assert {c[0] for c in coordinators} == nodes
    assert {(c[1], c[2]) for c in coordinators} == addresses
    assert _coordinator(pair[1], "g7") == _coordinator(pair[0], "g7")


def test_a_request_of_a_group_at_the_other_replica_answers_not_coordinator(
    pair: list[KafkaTarget],
) -> None:
    group = f"g{secrets.token_hex(4)}"
    node, _, port = _coordinator(pair[0], group)
    coordinator = next(t for t in pair if t.gateway.kafka_port == port)
    other = next(t for t in pair if t.gateway.kafka_port != port)
    join = _request(
        11,
        5,
        group_id=group,
        session_timeout=10_000,
        rebalance_timeout=10_000,
        member_id="",
        protocol_type="consumer",
        protocols=[{"name": "range", "metadata": b"m"}],
    )
    assert _call(other, join).error_code == ErrorCode.not_coordinator
    heartbeat = _request(12, 4, group_id=group, member_id="m", generation_id=1)
    assert _call(other, heartbeat).error_code == ErrorCode.not_coordinator
    # The coordinator takes the join; the member it made is no member at the other.
    joined = _call(coordinator, join)
    assert (joined.error_code, joined.generation_id) == (ErrorCode.none, 1)
    heartbeat = _request(12, 4, group_id=group, member_id=joined.member_id, generation_id=1)
    assert _call(other, heartbeat).error_code == ErrorCode.not_coordinator
    assert node in _brokers(other)
    # Each broker lists the groups it coordinates (admin clients ask every broker).
    listed = [
        {g.group_id for g in _call(t, _request(16, 4, states_filter=[])).groups}
        for t in (coordinator, other)
    ]
    assert group in listed[0] and group not in listed[1]


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.name)
def test_every_client_produces_at_one_replica_and_reads_at_the_other(
    pair: list[KafkaTarget], client: KafkaClient
) -> None:
    """kcat, confluent-kafka, kafka-python and aiokafka follow the brokers Metadata names."""
    topic = _table(pair[1])
    values = [
        (p, json.dumps({"id": p * 10 + i}).encode()) for p in range(PARTITIONS) for i in range(5)
    ]
    offsets = client.produce(pair[1], topic, values)
    if offsets:  # kcat prints none: checked by what is read
        assert sorted(offsets) == sorted(o for _ in range(PARTITIONS) for o in range(5))
    got = client.consume(pair[0], topic, range(PARTITIONS), len(values))
    assert sorted((r.partition, r.offset) for r in got) == [
        (p, o) for p in range(PARTITIONS) for o in range(5)
    ]


def test_a_producer_at_one_replica_reaches_every_partition_and_each_record_is_read_once(
    pair: list[KafkaTarget],
) -> None:
    topic = _table(pair[0])
    # The client sends each partition's requests to its leader: every replica leading a
    # partition of the topic serves produce and fetch requests, whichever was bootstrapped.
    by_port = {t.gateway.kafka_port: t for t in pair}
    leading = {by_port[_brokers(pair[0])[n][1]] for n in set(_leaders(pair[0], topic).values())}
    apis = ("Produce", "Fetch")
    before = {(t.bootstrap, api): _served(t, api) for t in leading for api in apis}
    _produce(pair[0], topic, 0, 20)
    got = ConfluentKafka().consume(pair[1], topic, range(PARTITIONS), 20 * PARTITIONS)
    assert sorted((r.partition, r.offset) for r in got) == [
        (p, o) for p in range(PARTITIONS) for o in range(20)
    ]
    ids = sorted(json.loads(r.value or b"{}")["id"] for r in got)
    assert ids == list(range(20 * PARTITIONS))
    for (bootstrap, api), count in before.items():
        target = next(t for t in leading if t.bootstrap == bootstrap)
        assert _served(target, api) > count, (bootstrap, api)


def _served(target: KafkaTarget, api: str) -> float:
    """Requests of ``api`` the replica answered without an error."""
    line = f'tidegate_kafka_requests_total{{api="{api}",error="none"}}'
    with target.gateway.http_client() as h:
        text = h.get("/metrics").text
    found = [ln for ln in text.splitlines() if ln.startswith(line)]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


def _member_settings(target: KafkaTarget, group: str, protocol: str) -> dict[str, Any]:
    settings = {
        **librdkafka_settings(target),
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    if protocol == "consumer":
        return {**settings, "group.protocol": "consumer"}
    return {
        **settings,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "cooperative-sticky",
    }


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_group_over_both_replicas_is_one_group_and_moves_when_its_coordinator_dies(
    protocol: str,
    redis_server: RedisServer,
    postgres_url: str,
    members: list[Member],
    tmp_path: Path,
) -> None:
    with replicas(tmp_path / "replicas", redis_server, postgres_url) as targets:
        topic = _table(targets[0])
        group = f"readers-{secrets.token_hex(4)}"
        _produce(targets[0], topic, 0, 10)
        # Members bootstrap at different replicas: 0, 1, 0.
        members.extend(
            Member(tmp_path, n, _member_settings(targets[n % 2], group, protocol), topic)
            for n in range(3)
        )

        def read() -> list[tuple[int, int]]:
            return [r for m in members for r in m.read()]

        # One group: every member holds two partitions, no partition held twice.
        def held() -> list[int]:
            return sorted(p for m in members for p in m.assigned())

        until(
            "one group",
            lambda: held() == [*range(PARTITIONS)] and all(len(m.assigned()) == 2 for m in members),
        )
        until("the first records", lambda: len(read()) >= 10 * PARTITIONS)
        assert sorted(read()) == [(p, o) for p in range(PARTITIONS) for o in range(10)]
        # Either replica describes the group with its Kafka members, as its coordinator
        # published them.
        kind = CLASSIC if protocol == "classic" else CONSUMER

        def described_at(target: KafkaTarget) -> bool:
            return described_holdings(target.gateway, group, topic, kind) == holding(members)

        for target in targets:
            until("the members described", lambda t=target: described_at(t))

        # The coordinator dies; after its lease the survivor is the one broker and the
        # group's coordinator, and the group goes on from its commits there.
        _, _, port = _coordinator(targets[0], group)
        dead = next(t for t in targets if t.gateway.kafka_port == port)
        survivor = next(t for t in targets if t.gateway.kafka_port != port)
        assert dead.gateway.proc is not None
        dead.gateway.proc.send_signal(signal.SIGKILL)
        dead.gateway.proc.wait()
        killed = time.monotonic()
        until("the lease to run out", lambda: len(_brokers(survivor)) == 1)
        assert time.monotonic() - killed < LEASE_S * 4
        assert _brokers(survivor) == {
            _coordinator(survivor, group)[0]: ("127.0.0.1", survivor.gateway.kafka_port)
        }
        _produce(survivor, topic, 1000, 10)
        until("every record", lambda: len(read()) >= 20 * PARTITIONS)
        time.sleep(1)  # nothing more comes: no record is read twice
        assert sorted(read()) == [(p, o) for p in range(PARTITIONS) for o in range(20)]
        until("the group re-formed", lambda: held() == [*range(PARTITIONS)])
        until("the members described", lambda: described_at(survivor))
        for m in members:
            m.stop()
        # The killed replica's row was swept once its lease ran out; the survivor, stopped,
        # removes its own at once: the store names no replica.
        survivor.gateway.stop()
        store = MetadataStore(survivor.gateway.extra_env["TIDEGATE_METADATA__URL"])
        try:
            assert store.live_replicas(at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)) == []
        finally:
            store.close()


def test_rendezvous_picks_the_same_broker_everywhere_and_moves_only_a_leaver_s_keys() -> None:
    brokers = [Broker("h", 9000 + n, node_id=node_id_of(f"h:{9000 + n}")) for n in range(3)]
    keys = [f"table/{p}" for p in range(300)]
    before = {k: rendezvous(k, brokers) for k in keys}
    assert {k: rendezvous(k, list(reversed(brokers))) for k in keys} == before
    assert len(set(before.values())) == 3
    gone = brokers[1]
    after = {k: rendezvous(k, [brokers[0], brokers[2]]) for k in keys}
    assert {k for k in keys if after[k] != before[k]} == {k for k in keys if before[k] == gone}
    assert node_id_of("h:9000") == node_id_of("h:9000") and 0 <= node_id_of("x") < 2**31
