"""The Kafka listener in the hostile suite (issue 41): connections that send nothing
useful are closed, a declared frame size costs what arrives of it rather than what it
declares, and one tenant's connection reaches nothing of another's (their groups' offsets,
their tables, their idempotent producers) while it tries.

Frames are exact (kio's classes over a bare socket, tests/kafka/raw.py); hostile frames
before authentication, huge declared sizes and other tenants' topics in Metadata, Produce,
Fetch, ListOffsets and OffsetCommit are in tests/kafka/test_edges.py and test_offsets.py.
"""

from __future__ import annotations

import json
import secrets
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.schema.offset_fetch.v7 import request as offset_fetch

from gateway.server.kafka.protocol import build
from tests.hostile.test_edges import Peak, closed_by_server
from tests.kafka.conftest import KafkaTarget
from tests.kafka.raw import RawKafka, produce_records, record_batch
from tests.services import GatewayProcess, free_port

MiB = 1024 * 1024
#: Header, body and idle timeouts of the module's gateway (only waited for).
TIMEOUT_S = 2


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    env = {
        "TIDEGATE_HOT__TYPE": "disk",
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_SERVER__HEADER_TIMEOUT_S": str(TIMEOUT_S),
        "TIDEGATE_SERVER__BODY_TIMEOUT_S": str(TIMEOUT_S),
        "TIDEGATE_KAFKA__IDLE_S": str(TIMEOUT_S),
        "TIDEGATE_SERVER__MAX_REQUEST_BYTES": str(64 * MiB),
        "TIDEGATE_KAFKA__PORT": str(free_port()),
    }
    gateway = GatewayProcess(tmp_path_factory.mktemp("hostile-kafka"), env).start()
    try:
        yield gateway
    finally:
        gateway.stop()


def tenant(gw: GatewayProcess) -> KafkaTarget:
    name = f"k{secrets.token_hex(5)}"
    with gw.admin() as admin:
        admin.create_tenant(name)
        key = admin.issue_key(name)[1]
    return KafkaTarget(gw, f"127.0.0.1:{gw.kafka_port}", name, key)


def logged_in(target: KafkaTarget) -> RawKafka:
    raw = RawKafka(target)
    assert raw.authenticate(target.tenant, target.key).error_code == ErrorCode.none
    return raw


def request(api_key: int, version: int, **values: Any) -> Any:
    return build(load_request_schema(api_key, version), values)


def serves(target: KafkaTarget) -> None:
    """A new connection of ``target`` is served (the gateway lives and answers)."""
    with logged_in(target) as raw:
        assert raw.call(request(3, 12, topics=None)).topics is not None


def closed_reasons(gw: GatewayProcess) -> str:
    with gw.http_client(api_key=None) as http:
        return http.get("/metrics").text


def test_idle_and_unfinished_kafka_connections_are_closed(gw: GatewayProcess) -> None:
    """A bare connection, half a length prefix, an authenticated connection that then
    says nothing and one whose request never arrives whole are all closed by the gateway
    within its timeouts, each counted under its reason."""
    t = tenant(gw)
    port = gw.kafka_port
    bare = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    half = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    for s in half:
        s.sendall(b"\0\0")
    idle = [logged_in(t) for _ in range(8)]
    unfinished = [logged_in(t) for _ in range(8)]
    for raw in unfinished:
        raw.send_bytes(struct.pack(">i", MiB) + b"\0" * 100)
    try:
        for what, group in (("bare", bare), ("half a size", half)):
            assert all(closed_by_server(s) for s in group), what
        for what, raws in (("idle", idle), ("unfinished", unfinished)):
            assert all(closed_by_server(r.sock) for r in raws), what
        metrics = closed_reasons(gw)
        for reason in ("header_timeout", "idle", "body_timeout"):
            line = f'tidegate_edge_connections_closed_total{{edge="kafka",reason="{reason}"}}'
            assert line in metrics, reason
        serves(t)
    finally:
        for s in bare + half:
            s.close()
        for raw in idle + unfinished:
            raw.close()


def test_a_declared_size_costs_what_arrives_not_what_it_declares(gw: GatewayProcess) -> None:
    """32 authenticated connections each declare a 60 MiB request (within the bound) and
    send 256 KiB of it: the gateway holds what came (8 MiB), not the 1.9 GiB declared,
    and closes them at the body timeout."""
    t = tenant(gw)
    conns = [logged_in(t) for _ in range(32)]
    try:
        with Peak(gw) as peak:
            for raw in conns:
                raw.send_bytes(struct.pack(">i", 60 * MiB) + b"\0" * (256 * 1024))
            assert all(closed_by_server(r.sock) for r in conns)
        # Generous: the bytes that came, their copies and the interpreter's own noise.
        assert peak.growth < 256 * MiB, peak.growth
        serves(t)
    finally:
        for raw in conns:
            raw.close()


def test_a_tenant_reaches_nothing_of_anothers_groups_topics_or_producers(
    gw: GatewayProcess,
) -> None:
    a, b = tenant(gw), tenant(gw)
    table = f"b{secrets.token_hex(4)}.t"
    with gw.client(api_key=b.key) as c:
        c.create_table(table, {"id": "int64"}, partitions=1)
        c.append(table, [{"id": 1}, {"id": 2}])
        c.commit_offsets("team", table, {0: 2})
    with logged_in(b) as theirs, logged_in(a) as mine:
        # Their group's committed offsets, by their group id and topic.
        asked = offset_fetch.OffsetFetchRequestTopic(name=table, partition_indexes=(0,))  # type: ignore[arg-type]
        fetched = mine.call(offset_fetch.OffsetFetchRequest(group_id="team", topics=(asked,)))  # type: ignore[arg-type]
        part = fetched.topics[0].partitions[0]
        assert part.committed_offset == -1 or part.error_code != ErrorCode.none
        # Their topic cannot be deleted.
        deleted = mine.call(request(20, 5, topic_names=[table], timeout=5000))
        assert deleted.responses[0].error_code == ErrorCode.unknown_topic_or_partition
        # Their groups are not listed nor described.
        assert mine.call(request(16, 4, states_filter=[])).groups == ()
        described = mine.call(request(15, 5, groups=["team"], include_authorized_operations=False))
        assert described.groups[0].members == ()
        # Their idempotent producer id: a bump by this tenant fences nothing of theirs.
        pid = int(theirs.call(request(22, 4, transactional_id=None, transaction_timeout=60_000,
                                      producer_id=-1, producer_epoch=-1)).producer_id)  # fmt: skip
        bumped = mine.call(
            request(22, 4, transactional_id=None, transaction_timeout=60_000,
                    producer_id=pid, producer_epoch=5)
        )  # fmt: skip
        assert bumped.error_code == ErrorCode.none
        value = json.dumps({"id": 3}).encode()
        batch = record_batch([value], producer_id=pid, epoch=0, sequence=0)
        stored = theirs.call(produce_records(table, 0, batch)).responses[0].partition_responses[0]
        assert (stored.error_code, stored.base_offset) == (ErrorCode.none, 2)
        # And this tenant's batch under their id goes nowhere of theirs.
        refused = mine.call(produce_records(table, 0, batch)).responses[0].partition_responses[0]
        assert refused.error_code == ErrorCode.unknown_topic_or_partition
    with gw.client(api_key=b.key) as c:
        assert c.read(table, partition=0, offset=0).column("id").to_pylist() == [1, 2, 3]
        assert c.fetch_offsets("team", table) == {0: 2}
