"""Kafka's idempotent producer over the hot tier's de-duplication: real clients with
``enable.idempotence``, the exact answers of each sequence case, and a confluent-kafka
producer through two kill -9s of the gateway judged by the fault suite's checker."""

from __future__ import annotations

import datetime as dt
import json
import secrets
import signal
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as init_producer_id

from tests.faults.checker import TableState, check, records_of
from tests.faults.history import History
from tests.kafka.clients import DEADLINE_S, librdkafka_settings
from tests.kafka.conftest import KafkaTarget
from tests.kafka.raw import RawKafka, produce_records, record_batch
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration

ROW = {"id": 1, "name": "a", "price": 1.0, "ok": True}


def idempotent_producer(target: KafkaTarget, **extra: Any) -> Producer:
    """A confluent-kafka producer as docs/kafka.md configures an idempotent one."""
    return Producer(
        {
            **librdkafka_settings(target),
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            "linger.ms": 5,
            **extra,
        }
    )


def test_an_idempotent_confluent_kafka_producer_stores_each_record_once(
    kafka: KafkaTarget, topic: str
) -> None:
    producer = idempotent_producer(kafka)
    acked: dict[int, tuple[int, int]] = {}
    errors: list[Any] = []

    def report(i: int) -> Any:
        def done(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                acked[i] = (msg.partition(), msg.offset())

        return done

    rows = [{**ROW, "id": i, "name": f"n{i}"} for i in range(300)]
    for i, row in enumerate(rows):
        producer.produce(topic, json.dumps(row).encode(), partition=i % 2, on_delivery=report(i))
    assert producer.flush(DEADLINE_S) == 0
    assert not errors, errors
    assert len(acked) == len(rows)
    with kafka.gateway.client() as c:
        stored: dict[tuple[int, int], int] = {}
        for p in (0, 1):
            t = c.read(topic, partition=p, offset=0, max_records=10_000)
            offsets, ids = t.column("_offset").to_pylist(), t.column("id").to_pylist()
            stored.update({(p, o): i for o, i in zip(offsets, ids, strict=True)})
    # Every record once, where its acknowledgement said.
    assert sorted(stored.values()) == list(range(len(rows)))
    assert {at: i for i, at in acked.items()} == stored


def _produce(
    topic: str, partition: int, values: list[bytes], pid: int, epoch: int, sequence: int
) -> Any:
    batch = record_batch(values, producer_id=pid, epoch=epoch, sequence=sequence)
    return produce_records(topic, partition, batch)


def _init(transactional_id: str | None = None, pid: int = -1, epoch: int = -1) -> Any:
    return init_producer_id.InitProducerIdRequest(
        transactional_id=transactional_id,
        transaction_timeout=dt.timedelta(seconds=60),
        producer_id=pid,  # type: ignore[arg-type]
        producer_epoch=epoch,  # type: ignore[arg-type]
    )


def test_each_sequence_case_gets_kafkas_answer(kafka: KafkaTarget, topic: str) -> None:
    """Retries, gaps, unknown producers, fenced epochs and transactions, each answered
    with the code Kafka's broker gives and nothing stored twice."""
    rec = [json.dumps({**ROW, "id": i}).encode() for i in range(10)]
    with RawKafka(kafka) as raw:
        assert raw.authenticate(kafka.tenant, kafka.key).error_code == ErrorCode.none
        init = raw.call(_init())
        assert init.error_code == ErrorCode.none and init.producer_epoch == 0
        pid = int(init.producer_id)
        assert pid > 0 and int(raw.call(_init()).producer_id) != pid

        def send(values: list[bytes], seq: int, epoch: int = 0, p: int = 0, who: int = pid) -> Any:
            answer = raw.call(_produce(topic, p, values, who, epoch, seq))
            return answer.responses[0].partition_responses[0]

        for seq, values, offset in ((0, rec[0:3], 0), (3, rec[3:5], 3)):
            stored = send(values, seq)
            assert (stored.error_code, stored.base_offset) == (ErrorCode.none, offset)
        # A retry of either batch: acknowledged with its first offsets, not stored again.
        for seq, values, offset in ((0, rec[0:3], 0), (3, rec[3:5], 3)):
            again = send(values, seq)
            assert (again.error_code, again.base_offset) == (ErrorCode.none, offset)
        # A gap, a sequence inside a stored batch: out of order, nothing stored.
        assert send(rec[5:6], 9).error_code == ErrorCode.out_of_order_sequence_number
        assert send(rec[5:6], 1).error_code == ErrorCode.out_of_order_sequence_number
        # A producer never seen here that does not start at 0.
        stranger = send(rec[5:6], 7, who=pid + 1)
        assert stranger.error_code == ErrorCode.unknown_producer_id
        # Sequences are per partition: the other one starts at 0.
        assert send(rec[5:6], 0, p=1).base_offset == 0
        # KIP-360's bump: the next epoch starts over at 0, the older one is fenced.
        bumped = raw.call(_init(pid=pid, epoch=0))
        assert (int(bumped.producer_id), bumped.producer_epoch) == (pid, 1)
        assert send(rec[5:7], 0, epoch=1).base_offset == 5
        assert send(rec[7:8], 5, epoch=0).error_code == ErrorCode.invalid_producer_epoch
        assert raw.call(_init(pid=pid, epoch=0)).error_code == ErrorCode.invalid_producer_epoch
        # Kafka takes one batch per partition from an idempotent producer.
        doubled = b"".join(
            record_batch(rec[i : i + 1], producer_id=pid, epoch=1, sequence=i - 5) for i in (7, 8)
        )
        two = produce_records(topic, 0, doubled)
        refused = raw.call(two).responses[0].partition_responses[0]
        assert refused.error_code == ErrorCode.invalid_record
        assert "exactly one" in (refused.error_message or "")
        # Transactions are refused with an error every client stops on.
        txn = raw.call(_init(transactional_id="tx-1"))
        assert txn.error_code == ErrorCode.transactional_id_authorization_failed
    with kafka.gateway.client() as c:
        ids = c.read(topic, partition=0, offset=0).column("id").to_pylist()
    assert ids == [0, 1, 2, 3, 4, 5, 6]


def test_a_transactional_producer_is_told_at_once_that_transactions_are_not_served(
    kafka: KafkaTarget,
) -> None:
    producer = Producer({**librdkafka_settings(kafka), "transactional.id": "tx-docs"})
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(DEADLINE_S)
    err = refused.value.args[0]
    # A fatal error naming why, not a timeout after retries.
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and err.fatal()
    assert "transactions are not served" in err.str()


# Through kill -9s --------------------------------------------------------------------------
def test_an_idempotent_producer_through_two_kill_9s_stores_each_record_once(
    killable: GatewayProcess,
) -> None:
    """A confluent-kafka producer (idempotent, acks=all) writes while the gateway is
    SIGKILLed twice and started again on the same folder and ports: its retries of the
    batches in flight are found by the hot tier, so every acknowledged record is stored
    once at its acknowledged offset (the fault suite's checker judges the history)."""
    gw = killable
    assert gw.api_key is not None
    target = KafkaTarget(gw, f"127.0.0.1:{gw.kafka_port}", gw.tenant, gw.api_key)
    table = f"k{secrets.token_hex(4)}.idem"
    with gw.client() as c:
        c.create_table(table, {"rid": "string"}, partitions=2)
    history = History()
    producer = idempotent_producer(
        target, **{"reconnect.backoff.max.ms": 500, "message.timeout.ms": 120_000}
    )
    stop = threading.Event()
    sent = 0

    def delivered(rid: str, partition: int) -> Any:
        def done(err: Any, msg: Any) -> None:
            # A delivery error may come after the batch was stored: its outcome is unknown.
            outcome: dict[str, Any] = (
                {"outcome": "ok", "at": [[msg.partition(), msg.offset()]]}
                if err is None
                else {"outcome": "unknown", "error": str(err)}
            )
            history.record(
                "append", "kafka", table=table, key=f"kafka/{partition}", rids=[rid], **outcome
            )

        return done

    def write() -> None:
        # At most 2,000 records unanswered (a few of librdkafka's batches in flight and
        # queued), so the acknowledgements keep up with what is sent.
        nonlocal sent
        while not stop.is_set():
            if sent - len(history.of("append")) > 2_000:
                producer.poll(0.05)
                continue
            for _ in range(20):
                rid = f"r{sent}"
                p = sent % 2
                producer.produce(
                    table,
                    json.dumps({"rid": rid}).encode(),
                    partition=p,
                    on_delivery=delivered(rid, p),
                )
                sent += 1
            producer.poll(0.005)

    def acked() -> int:
        return sum(1 for e in history.of("append") if e["outcome"] == "ok")

    def until_acked(count: int) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while acked() < count:
            assert time.monotonic() < deadline, f"only {acked()} of {count} acknowledged"
            time.sleep(0.05)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        for kill in range(2):
            until_acked(2_000 * (kill + 1))
            history.record("fault", "test", kind="gateway_kill", target="gateway", phase="start")
            gw.restart()
            history.record("fault", "test", kind="gateway_kill", target="gateway", phase="end")
        until_acked(acked() + 2_000)
    finally:
        stop.set()
        writer.join(30)
    assert producer.flush(DEADLINE_S * 2) == 0
    final = TableState(2)
    with gw.client(timeout=60) as c:
        stream = []
        for p in range(2):
            offset = 0
            while t := c.read(table, partition=p, offset=offset, max_records=50_000):
                if t.num_rows == 0:
                    break
                stream += records_of(t.select(["_partition", "_offset", "rid"]).to_pylist())
                offset = stream[-1][1] + 1
        final.paths["stream"] = stream
        final.paths["scan"] = records_of(
            c.scan(table, columns=["rid", "_partition", "_offset"]).to_pylist()
        )
    verdict = check(history, {table: final})
    assert verdict.violations == [], [v.message for v in verdict.violations[:10]]
    # Every record sent was acknowledged (none given up on), and each is there once.
    assert verdict.acknowledged == sent and verdict.unknown == 0
    assert len(stream) == sent


# librdkafka's own epoch bump (KIP-360) ---------------------------------------------------
def test_librdkafka_bumps_its_epoch_after_a_timeout_and_each_record_is_stored_once(
    killable: GatewayProcess,
) -> None:
    """An idempotent confluent-kafka producer whose batches time out in flight (the
    gateway is stopped with SIGSTOP) bumps its epoch itself, as KIP-360 lets an idempotent
    producer, and goes on at sequence 0 of the new epoch once the gateway runs again: the same
    producer id at epoch 1, every acknowledged record stored once where it was
    acknowledged, a timed-out one at most once, and the old epoch's batch fenced when it
    reaches the gateway after the new epoch's first."""
    gw = killable
    assert gw.api_key is not None and gw.proc is not None
    target = KafkaTarget(gw, f"127.0.0.1:{gw.kafka_port}", gw.tenant, gw.api_key)
    table = f"k{secrets.token_hex(4)}.bump"
    with gw.client() as c:
        c.create_table(table, {"rid": "string"}, partitions=1)
    eos: list[dict[str, Any]] = []
    producer = idempotent_producer(
        target,
        **{
            "message.timeout.ms": 3_000,
            "request.timeout.ms": 2_000,
            "socket.timeout.ms": 2_000,
            "reconnect.backoff.max.ms": 200,
            "statistics.interval.ms": 100,
            "stats_cb": lambda stats: eos.append(json.loads(stats)["eos"]),
        },
    )
    acked: dict[str, int] = {}
    failed: dict[str, str] = {}

    def report(err: Any, msg: Any) -> None:
        rid = json.loads(msg.value())["rid"]
        if err is None:
            acked[rid] = msg.offset()
        else:
            failed[rid] = err.name()

    def send(rids: range) -> None:
        for i in rids:
            producer.produce(
                table, json.dumps({"rid": f"r{i}"}).encode(), partition=0, on_delivery=report
            )
        producer.poll(0)

    def until(what: str, done: Any, limit: float = DEADLINE_S) -> None:
        deadline = time.monotonic() + limit
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            producer.poll(0.1)

    send(range(100))
    assert producer.flush(DEADLINE_S) == 0 and len(acked) == 100
    until("the producer's id in its statistics", lambda: eos and eos[-1]["producer_id"] > 0)
    first = (eos[-1]["producer_id"], eos[-1]["producer_epoch"])
    assert first[1] == 0

    gw.proc.send_signal(signal.SIGSTOP)
    try:
        send(range(100, 150))
        until("the stopped gateway's batches to time out", lambda: len(failed) == 50, 30)
    finally:
        gw.proc.send_signal(signal.SIGCONT)
    assert set(failed.values()) <= {"_MSG_TIMED_OUT", "_TIMED_OUT", "_TIMED_OUT_QUEUE"}

    send(range(150, 250))
    assert producer.flush(DEADLINE_S) == 0
    assert len(acked) == 200, failed
    # The same producer, one epoch on: librdkafka bumped it, the gateway answered
    # (statistics taken after the flush).
    seen = len(eos)
    until("fresh statistics", lambda: len(eos) >= seen + 2)
    assert (eos[-1]["producer_id"], eos[-1]["producer_epoch"]) == (first[0], 1)
    assert eos[-1]["epoch_cnt"] >= 1

    with gw.client() as c:
        t = c.read(table, partition=0, offset=0, max_records=10_000)
    stored = list(zip(t.column("rid").to_pylist(), t.column("_offset").to_pylist(), strict=True))
    rids = [rid for rid, _ in stored]
    assert len(set(rids)) == len(rids), "a record stored twice"
    assert {rid: offset for rid, offset in stored if rid in acked} == acked
    assert set(rids) - set(acked) <= set(failed)
    # The timed-out batch reached the gateway late: stored whole if before the first
    # batch of the new epoch, fenced (INVALID_PRODUCER_EPOCH) if after it.
    late = set(rids) & set(failed)
    with gw.http_client() as h:
        metrics = h.get("/metrics").text
    fenced = 'tidegate_kafka_requests_total{api="Produce",error="invalid_producer_epoch"}'
    if fenced in metrics:
        assert not late
    else:
        assert late == set(failed)
    # librdkafka bumps the epoch of an idempotent producer itself (KIP-360 lets it): one
    # InitProducerId, and the new epoch's first batch starts the hot tier's producer anew.
    assert 'tidegate_kafka_requests_total{api="InitProducerId",error="none"} 1.0' in metrics
