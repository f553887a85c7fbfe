"""The Kafka listener's edges: authentication, tenant isolation, errors at the edges of
a partition, and hostile frames that close a connection while the gateway serves on."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch
from kio.schema.list_offsets.v7 import request as list_offsets
from kio.schema.metadata.v12 import request as metadata
from kio.schema.produce.v9 import request as produce
from kio.schema.sasl_handshake.v0 import request as handshake

from tests.kafka.clients import CLIENTS, Kcat, librdkafka_settings
from tests.kafka.conftest import KafkaTarget
from tests.kafka.raw import RawKafka, produce_records, record_batch
from tests.services import GatewayProcess, free_port

pytestmark = pytest.mark.integration

ROW = {"id": 1, "name": "a", "price": 1.0, "ok": True}


def produce_request(
    topic: str, partition: int, values: list[bytes], codec: int = 0
) -> produce.ProduceRequest:
    return produce_records(topic, partition, record_batch(values, codec))


def fetch_request(topic: str, partition: int, offset: int, wait_ms: int = 0) -> fetch.FetchRequest:
    return fetch.FetchRequest(
        max_wait=dt.timedelta(milliseconds=wait_ms),
        min_bytes=1,
        topics=(
            fetch.FetchTopic(
                topic=topic,
                partitions=(
                    fetch.FetchPartition(
                        partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


def metadata_request(topics: list[str] | None) -> metadata.MetadataRequest:
    return metadata.MetadataRequest(
        topics=None
        if topics is None
        else tuple(metadata.MetadataRequestTopic(topic_id=None, name=t) for t in topics),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def list_offsets_request(topic: str, timestamp: int) -> list_offsets.ListOffsetsRequest:
    return list_offsets.ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=(
            list_offsets.ListOffsetsTopic(
                name=topic,
                partitions=(
                    list_offsets.ListOffsetsPartition(partition_index=0, timestamp=timestamp),
                ),
            ),
        ),
    )


def still_serves(kafka: KafkaTarget, topic: str) -> None:
    """A real client still lists the tenant's topics, and the SDK still appends."""
    admin = AdminClient(librdkafka_settings(kafka))
    assert topic in admin.list_topics(timeout=30).topics
    with kafka.gateway.client() as c:
        c.append(topic, [{"id": 7, "name": "x", "price": 0.0, "ok": False}])


# Authentication ------------------------------------------------------------------------
def test_a_wrong_key_is_refused_and_the_connection_closed(kafka: KafkaTarget, topic: str) -> None:
    with RawKafka(kafka) as raw:
        answer = raw.authenticate(kafka.tenant, kafka.key + "x")
        assert answer.error_code == ErrorCode.sasl_authentication_failed
        assert "invalid API key" in (answer.error_message or "")
        assert raw.closed()
    # Another tenant's name with this tenant's key is refused too.
    with RawKafka(kafka) as raw:
        answer = raw.authenticate("someone-else", kafka.key)
        assert answer.error_code == ErrorCode.sasl_authentication_failed
        assert raw.closed()
    # A real client is told its credentials are wrong.
    admin = AdminClient({**librdkafka_settings(kafka), "sasl.password": "tg_wrong"})
    with pytest.raises(KafkaException) as refused:
        admin.list_topics(timeout=3)
    assert refused.value.args[0].code() in (KafkaError._AUTHENTICATION, KafkaError._TRANSPORT)
    still_serves(kafka, topic)


def test_nothing_but_authentication_is_served_before_it(kafka: KafkaTarget) -> None:
    with RawKafka(kafka) as raw:
        raw.call(ApiVersionsRequest(client_software_name="raw", client_software_version="1"))
        raw.send(metadata_request(None))
        assert raw.closed()


# Tenancy -------------------------------------------------------------------------------
def test_a_tenant_cannot_see_or_touch_another_tenants_table(
    kafka: KafkaTarget, other_tenant: KafkaTarget, topic: str, theirs: str
) -> None:
    # kcat, a real client, lists the tenant's own topics and not the other's.
    listed = subprocess.run(
        [*Kcat()._args(kafka), "-L", "-J"], capture_output=True, check=True, timeout=60
    )
    names = {t["topic"] for t in json.loads(listed.stdout)["topics"]}
    assert topic in names and theirs not in names

    with RawKafka(kafka) as raw:
        assert raw.authenticate(kafka.tenant, kafka.key).error_code == ErrorCode.none
        everything = raw.call(metadata_request(None))
        assert theirs not in {t.name for t in everything.topics}
        named = raw.call(metadata_request([theirs]))
        assert named.topics[0].error_code == ErrorCode.unknown_topic_or_partition
        fetched = raw.call(fetch_request(theirs, 0, 0))
        assert fetched.responses[0].partitions[0].error_code == (
            ErrorCode.unknown_topic_or_partition
        )
        assert not fetched.responses[0].partitions[0].records
        produced = raw.call(produce_request(theirs, 0, [b'{"id": 2}']))
        assert produced.responses[0].partition_responses[0].error_code == (
            ErrorCode.unknown_topic_or_partition
        )
        offsets = raw.call(list_offsets_request(theirs, -1))
        assert offsets.topics[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    # Nothing of theirs changed.
    with kafka.gateway.client(api_key=other_tenant.key) as b:
        assert b.read(theirs, partition=0, offset=0).column("id").to_pylist() == [1]


# Produce and fetch at the edges ----------------------------------------------------------
def test_a_bad_record_refuses_its_batch_naming_each_record(kafka: KafkaTarget, topic: str) -> None:
    with RawKafka(kafka) as raw:
        assert raw.authenticate(kafka.tenant, kafka.key).error_code == ErrorCode.none
        good = json.dumps({"id": 1, "name": "a", "price": 1.0, "ok": True}).encode()
        answer = raw.call(produce_request(topic, 0, [good, b'{"id": "two"}', b"not json", good]))
        part = answer.responses[0].partition_responses[0]
        assert part.error_code == ErrorCode.invalid_record
        errors = {e.batch_index: e.batch_index_error_message for e in part.record_errors}
        assert set(errors) == {1, 2}
        assert "record 1" in errors[1] and "not JSON" in errors[2]
        assert topic in (part.error_message or "")
        # Nothing of the batch was stored: the good records of it neither.
        fetched = raw.call(fetch_request(topic, 0, 0))
        p = fetched.responses[0].partitions[0]
        assert p.error_code == ErrorCode.none and p.high_watermark == 0 and not p.records


def test_offsets_out_of_range_and_list_offsets(kafka: KafkaTarget, topic: str) -> None:
    with kafka.gateway.client() as c:
        c.append(
            topic, [{"id": i, "name": "a", "price": 1.0, "ok": True} for i in range(3)], partition=0
        )
    with RawKafka(kafka) as raw:
        assert raw.authenticate(kafka.tenant, kafka.key).error_code == ErrorCode.none
        past = raw.call(fetch_request(topic, 0, 4)).responses[0].partitions[0]
        assert past.error_code == ErrorCode.offset_out_of_range
        assert (past.high_watermark, past.log_start_offset) == (3, 0)
        at_end = raw.call(fetch_request(topic, 0, 3, wait_ms=200)).responses[0].partitions[0]
        assert at_end.error_code == ErrorCode.none and not at_end.records
        latest = raw.call(list_offsets_request(topic, -1)).topics[0].partitions[0]
        earliest = raw.call(list_offsets_request(topic, -2)).topics[0].partitions[0]
        assert (earliest.offset, latest.offset) == (0, 3)
        future = raw.call(list_offsets_request(topic, 2**45)).topics[0].partitions[0]
        assert future.error_code == ErrorCode.none and future.offset == -1
        past_stamp = raw.call(list_offsets_request(topic, 0)).topics[0].partitions[0]
        assert past_stamp.offset == 0


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_a_compressed_batch_that_expands_past_the_limit_is_refused_unexpanded(
    kafka: KafkaTarget, topic: str, codec: int
) -> None:
    # 200 MiB of zeros in one record: a few KiB compressed, a small frame (snappy, which
    # compresses zeros only 21:1, gets 20 MiB to stay under the frame bound). The
    # gateway's request limit is 1 MiB (tests/integration/conftest.py's gateway_env).
    bomb = b"\0" * ((20 if codec == 2 else 200) << 20)
    assert kafka.gateway.proc is not None
    pid = kafka.gateway.proc.pid
    before = peak_rss_bytes(pid)
    with RawKafka(kafka) as raw:
        assert raw.authenticate(kafka.tenant, kafka.key).error_code == ErrorCode.none
        answer = raw.call(produce_request(topic, 0, [bomb], codec))
        del bomb
        part = answer.responses[0].partition_responses[0]
        assert part.error_code == ErrorCode.message_too_large
        assert "expands to more than 1048576 bytes" in (part.error_message or "")
    assert peak_rss_bytes(pid) - before < 100 << 20
    still_serves(kafka, topic)


# Hostile frames --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(struct.pack(">i", 2**31 - 1), id="huge-declared-size"),
        pytest.param(struct.pack(">i", 1 << 20) + b"x" * 100, id="over-the-bound-before-auth"),
        pytest.param(struct.pack(">i", -5), id="negative-size"),
        pytest.param(struct.pack(">i", 24) + os.urandom(24), id="garbage"),
        pytest.param(
            struct.pack(">i", 10) + struct.pack(">hhi", 3, 99, 1) + b"\0\0", id="unknown-version"
        ),
        pytest.param(struct.pack(">i", 8) + struct.pack(">hhi", 18, 3, 1), id="truncated-body"),
        pytest.param(struct.pack(">i", 100) + b"\0" * 10, id="truncated-frame"),
        pytest.param(b"", id="idle"),
    ],
)
def test_a_hostile_frame_closes_its_connection_and_the_gateway_serves_on(
    kafka: KafkaTarget, topic: str, frame: bytes
) -> None:
    with RawKafka(kafka) as raw:
        raw.send_bytes(frame)
        assert raw.closed()  # within the header timeout (2 s here) at the latest
    still_serves(kafka, topic)


def test_a_huge_frame_after_authentication_is_refused_unread(
    kafka: KafkaTarget, topic: str
) -> None:
    with RawKafka(kafka) as raw:
        assert raw.authenticate(kafka.tenant, kafka.key).error_code == ErrorCode.none
        raw.send_bytes(struct.pack(">i", 2**31 - 1) + b"\0" * 1024)
        assert raw.closed()
    still_serves(kafka, topic)


def test_an_unknown_api_versions_version_gets_kafkas_v0_answer(kafka: KafkaTarget) -> None:
    with RawKafka(kafka) as raw:
        # ApiVersions v9 (unknown here): answered in v0 with UNSUPPORTED_VERSION and the
        # versions served, and the connection stays open for the retry.
        raw.send_bytes(struct.pack(">i", 10) + struct.pack(">hhih", 18, 9, 77, -1))
        frame = raw.read_frame()
        correlation, error, count = struct.unpack_from(">ihi", frame)
        assert (correlation, error) == (77, ErrorCode.unsupported_version)
        assert count >= 7
        answer = raw.call(
            ApiVersionsRequest(client_software_name="raw", client_software_version="1")
        )
        served = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
        assert served[18] == (0, 3) and served[0][1] >= 8 and served[1][1] >= 11


def test_the_clients_of_the_suite_are_the_four_of_the_issue() -> None:
    assert [c.name for c in CLIENTS] == ["kcat", "confluent-kafka", "kafka-python", "aiokafka"]


def counted(kafka: KafkaTarget, line_start: str) -> float:
    with kafka.gateway.http_client() as h:
        text = h.get("/metrics").text
    found = [ln for ln in text.splitlines() if ln.startswith(line_start)]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


def test_requests_by_api_and_error_and_closed_connections_are_counted(
    kafka: KafkaTarget, topic: str
) -> None:
    refused = 'tidegate_kafka_requests_total{api="Produce",error="invalid_record"}'
    fetched = 'tidegate_kafka_requests_total{api="Fetch",error="none"}'
    too_large = 'tidegate_edge_connections_closed_total{edge="kafka",reason="too_large"}'
    before = [counted(kafka, m) for m in (refused, fetched, too_large)]
    with RawKafka(kafka) as raw:
        assert raw.authenticate(kafka.tenant, kafka.key).error_code == ErrorCode.none
        raw.call(produce_request(topic, 0, [b"not json"]))
        raw.call(fetch_request(topic, 0, 0))
    with RawKafka(kafka) as raw:
        raw.send_bytes(struct.pack(">i", 2**31 - 1))
        assert raw.closed()
    after = [counted(kafka, m) for m in (refused, fetched, too_large)]
    # At least these (a client of an earlier test may still be polling this gateway).
    assert all(a - b >= 1 for a, b in zip(after, before, strict=True)), (before, after)


def test_acks_0_is_stored_and_answered_with_nothing(kafka: KafkaTarget, topic: str) -> None:
    with RawKafka(kafka) as raw:
        assert raw.authenticate(kafka.tenant, kafka.key).error_code == ErrorCode.none
        request = produce_request(topic, 1, [json.dumps(ROW).encode()])
        raw.send(dataclasses.replace(request, acks=0))
        # The next answer on the connection is the next request's: nothing came between.
        fetched = raw.call(fetch_request(topic, 1, 0, wait_ms=2000))
        part = fetched.responses[0].partitions[0]
        assert part.error_code == ErrorCode.none and part.high_watermark == 1


def test_sasl_handshake_v0_takes_a_bare_token(kafka: KafkaTarget, topic: str) -> None:
    with RawKafka(kafka) as raw:
        answer = raw.call(handshake.SaslHandshakeRequest(mechanism="PLAIN"))
        assert answer.error_code == ErrorCode.none and answer.mechanisms == ("PLAIN",)
        token = b"\0" + kafka.tenant.encode() + b"\0" + kafka.key.encode()
        raw.send_bytes(struct.pack(">i", len(token)) + token)
        assert raw.read_frame() == b""  # authenticated
        everything = raw.call(metadata_request(None))
        assert topic in {t.name for t in everything.topics}
    with RawKafka(kafka) as raw:
        raw.call(handshake.SaslHandshakeRequest(mechanism="PLAIN"))
        token = b"\0" + kafka.tenant.encode() + b"\0wrong"
        raw.send_bytes(struct.pack(">i", len(token)) + token)
        assert raw.closed()


def test_a_revoked_key_ends_its_connections(kafka: KafkaTarget, topic: str) -> None:
    with kafka.gateway.admin() as admin:
        key_id, key = admin.issue_key(kafka.tenant)
    with RawKafka(kafka) as raw:
        assert raw.authenticate(kafka.tenant, key).error_code == ErrorCode.none
        raw.call(metadata_request([topic]))
        with kafka.gateway.admin() as admin:
            admin.revoke_key(key_id)
        deadline = time.monotonic() + 30  # the key cache holds it auth.key_cache_ttl_s
        with pytest.raises(ConnectionError):
            while time.monotonic() < deadline:
                raw.call(metadata_request([topic]))
                time.sleep(0.2)


def test_an_over_quota_tenant_is_muted_and_told_so_not_refused(
    kafka: KafkaTarget, other_tenant: KafkaTarget
) -> None:
    with kafka.gateway.admin() as admin:
        admin.set_quota(other_tenant.tenant, requests_per_s=2)
    with RawKafka(other_tenant) as raw:
        assert raw.authenticate(other_tenant.tenant, other_tenant.key).error_code == (
            ErrorCode.none
        )
        answers = [raw.call(metadata_request(None)) for _ in range(6)]
    # Every request was answered (none refused, the connection kept), the later ones held
    # for the quota and saying how long, as Kafka's throttle_time_ms does.
    assert all(a.topics == () for a in answers)
    assert sum(a.throttle_time.total_seconds() for a in answers) > 0


def test_appends_over_the_byte_quota_are_held_then_stored(
    kafka: KafkaTarget, other_tenant: KafkaTarget, theirs: str
) -> None:
    with kafka.gateway.admin() as admin:
        admin.set_quota(other_tenant.tenant, append_bytes_per_s=1000)
    values = [json.dumps({"id": i}).encode() + b" " * 200 for i in range(2)]
    with RawKafka(other_tenant) as raw:
        assert raw.authenticate(other_tenant.tenant, other_tenant.key).error_code == (
            ErrorCode.none
        )
        answers = [raw.call(produce_request(theirs, 0, values)) for _ in range(6)]
    parts = [a.responses[0].partition_responses[0] for a in answers]
    assert [p.error_code for p in parts] == [ErrorCode.none] * 6
    assert [p.base_offset for p in parts] == [1, 3, 5, 7, 9, 11]
    assert sum(a.throttle_time.total_seconds() for a in answers) > 0


def test_a_tenant_holds_at_most_its_connection_cap_and_is_told_the_advertised_address(
    tmp_path: Path,
) -> None:
    env = {
        "TIDEGATE_KAFKA__MAX_TENANT_CONNECTIONS": "2",
        "TIDEGATE_QUOTA__MAX_FOLLOWS": "1",
        "TIDEGATE_KAFKA__ADVERTISED_HOST": "kafka.example",
        "TIDEGATE_KAFKA__ADVERTISED_PORT": "19092",
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_KAFKA__PORT": str(free_port()),
    }
    gw = GatewayProcess(tmp_path / "gw", env)
    try:
        gw.start()
        assert gw.api_key is not None
        target = KafkaTarget(gw, f"127.0.0.1:{gw.kafka_port}", gw.tenant, gw.api_key)
        first, second = RawKafka(target), RawKafka(target)
        for raw in (first, second):
            assert raw.authenticate(gw.tenant, gw.api_key).error_code == ErrorCode.none
        with RawKafka(target) as third:
            answer = third.authenticate(gw.tenant, gw.api_key)
            assert answer.error_code == ErrorCode.sasl_authentication_failed
            assert "at most 2 (kafka.max_tenant_connections)" in (answer.error_message or "")
            assert third.closed()
        # The two held go on; one closed makes room for another.
        listed = first.call(metadata_request(None))
        assert listed.topics == ()
        # The broker clients are sent to is the advertised address.
        assert [(b.node_id, b.host, b.port) for b in listed.brokers] == [
            (0, "kafka.example", 19092)
        ]
        second.close()
        deadline = time.monotonic() + 30
        while True:
            with RawKafka(target) as again:
                if again.authenticate(gw.tenant, gw.api_key).error_code == ErrorCode.none:
                    break
            assert time.monotonic() < deadline

        # One long poll holds the tenant's one follow slot: another waits for it (muted)
        # and is answered, told how long it was held, not refused.
        with gw.client() as c:
            c.create_table("slot.t", {"n": "int64"}, partitions=1)
        first.send(fetch_request("slot.t", 0, 0, wait_ms=1500))
        with RawKafka(target) as other:
            assert other.authenticate(gw.tenant, gw.api_key).error_code == ErrorCode.none
            waited = other.call(fetch_request("slot.t", 0, 0, wait_ms=100))
            assert waited.responses[0].partitions[0].error_code == ErrorCode.none
            assert waited.throttle_time.total_seconds() > 0
        assert first.read_frame()  # the long poll's own answer, after its wait
        first.close()
    finally:
        gw.stop()


def test_a_tenants_logins_past_its_rate_are_held_then_refused(tmp_path: Path) -> None:
    """Logins refill at kafka.max_tenant_connection_rate (0.25/s here, one at once): the
    second login is held until its turn, a third whose turn is further off than the
    longest hold is refused in one sentence, and another tenant logs in at once."""
    env = {
        "TIDEGATE_KAFKA__MAX_TENANT_CONNECTION_RATE": "0.25",
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_KAFKA__PORT": str(free_port()),
    }
    gw = GatewayProcess(tmp_path / "gw", env)
    try:
        gw.start()
        assert gw.api_key is not None
        with gw.admin() as admin:
            admin.create_tenant("neighbour")
            neighbour_key = admin.issue_key("neighbour")[1]
        target = KafkaTarget(gw, f"127.0.0.1:{gw.kafka_port}", gw.tenant, gw.api_key)
        closed = 'tidegate_edge_connections_closed_total{edge="kafka",reason="over_tenant_rate"}'
        with RawKafka(target) as first, RawKafka(target) as second, RawKafka(target) as third:
            assert first.authenticate(gw.tenant, gw.api_key).error_code == ErrorCode.none
            answers: list[object] = []
            started = time.monotonic()
            held = threading.Thread(
                target=lambda: answers.append(second.authenticate(gw.tenant, gw.api_key))
            )
            held.start()
            time.sleep(0.5)
            refused = third.authenticate(gw.tenant, gw.api_key)
            assert refused.error_code == ErrorCode.sasl_authentication_failed
            assert (
                f"tenant {gw.tenant!r} opens Kafka connections to this gateway faster than "
                "0.25 a second (kafka.max_tenant_connection_rate)"
            ) in (refused.error_message or "")
            assert third.closed()
            with RawKafka(target) as other:  # not held by this tenant's logins
                assert other.authenticate("neighbour", neighbour_key).error_code == ErrorCode.none
                assert held.is_alive()
            held.join(30)
            assert answers and answers[0].error_code == ErrorCode.none  # type: ignore[attr-defined]
            assert time.monotonic() - started >= 3.0  # its turn came 4 s after the first
        assert counted(target, closed) == 1
    finally:
        gw.stop()
