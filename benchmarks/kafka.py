"""Kafka clients against the SDK on the same gateway, in the same run: a confluent-kafka
producer (idempotent, ``acks=all``, lz4, ``linger.ms=5``) and consumer against the sync SDK
producer and consumer, each sending 100-byte records one at a time while a follower reads
them (end-to-end latency: receive time - the record's ``sent_ns``), then a fresh consumer
reading the whole table from offset 0 (consumer throughput).

Both producers hold at most ``batch_records * inflight * partitions`` records unanswered
(the SDK's ``buffer_records``, librdkafka's ``queue.buffering.max.messages``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from benchmarks.harness import Bench, compare
from benchmarks.loadgen import Result, Workload
from benchmarks.sdk import sync_send_loop
from gateway.client import Client
from tests.services import GatewayProcess

KAFKA_PRODUCER = "confluent-kafka producer (idempotent, acks=all, lz4, linger 5 ms)"
#: Longest the follower waits for the last records, and a catch-up read may take.
DEADLINE_S = 120.0


def _schema() -> dict[str, str]:
    # The payload is a string: a Kafka value is a JSON object of the columns.
    return {"id": "int64", "sent_ns": "int64", "payload": "string"}


def _records(w: Workload) -> Callable[[int], dict[str, Any]]:
    payload = "x" * max(1, w.record_bytes - 16)
    return lambda i: {"id": i, "sent_ns": time.time_ns(), "payload": payload}


def _e2e(result: Result, since_ns: int, sent: Iterable[int]) -> None:
    now = time.time_ns()
    for s in sent:
        if s >= since_ns:
            result.e2e.record_value(max(1, (now - s) // 1000))


def _librdkafka(gw: GatewayProcess) -> dict[str, Any]:
    return {
        "bootstrap.servers": f"127.0.0.1:{gw.kafka_port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": gw.tenant,
        "sasl.password": gw.api_key,
    }


def _stored(client: Client, table: str) -> int:
    return sum(p.high_watermark for p in client.describe_table(table).partition_info)


class _Follower(threading.Thread):
    """Reads a table's records as they come (``poll()``: the ``sent_ns`` of what came)
    and records their end-to-end latency into ``result`` until ``expected`` were read or
    it is stopped."""

    def __init__(self, result: Result, since_ns: int, poll: Callable[[], list[int]]) -> None:
        super().__init__(daemon=True)
        self.result, self.since_ns, self.poll = result, since_ns, poll
        self.read = 0
        self.expected: int | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = None
        while not self.stop.is_set():
            if self.expected is not None:
                deadline = deadline or time.monotonic() + DEADLINE_S
                if self.read >= self.expected or time.monotonic() > deadline:
                    return
            sent = self.poll()
            self.read += len(sent)
            _e2e(self.result, self.since_ns, sent)


def _sdk(gw: GatewayProcess, w: Workload, hot: str) -> tuple[Result, Result]:
    produced = Result(w.name, f"tidegate sync SDK producer ({hot} hot tier)")
    read = Result(f"{w.name} read", f"tidegate SDK consumer ({hot} hot tier)")
    table = f"bench{uuid.uuid4().hex[:8]}.kafka"
    parts = list(range(w.partitions))
    with Client(gw.grpc_target, api_key=gw.api_key) as client:
        client.create_table(table, _schema(), partitions=w.partitions)
        since = time.time_ns() + int(w.warmup_s * 1e9)
        with client.consumer(table, partitions=parts, poll_interval=0.002) as consumer:

            def poll() -> list[int]:
                return [
                    s for b in consumer.poll(timeout=0.1) for s in b.column("sent_ns").to_pylist()
                ]

            follower = _Follower(produced, since, poll)
            follower.start()
            with client.producer(
                table,
                batch_records=w.batch_records,
                max_in_flight=w.inflight,
                buffer_records=w.batch_records * w.inflight * w.partitions,
            ) as producer:
                sync_send_loop(w, produced, producer.send, _records(w))
            follower.expected = _stored(client, table)
            follower.join(DEADLINE_S)
            follower.stop.set()
        started = time.monotonic()
        with client.consumer(table, partitions=parts, follow=False) as consumer:
            for batch in consumer.batches():
                read.records += batch.num_rows
                read.batches += 1
        read.seconds = time.monotonic() - started
        read.bytes = read.records * w.record_bytes
        client.drop_table(table)
    return produced, read


def _kafka_send(producer: Any, table: str, w: Workload) -> Callable[[dict[str, Any]], Any]:
    """Send one record as JSON to the partitions in turn; a future of its delivery."""
    count = 0

    def send(record: dict[str, Any]) -> Future[None]:
        nonlocal count
        fut: Future[None] = Future()

        def done(err: Any, _msg: Any) -> None:
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(RuntimeError(str(err)))

        value = json.dumps(record).encode()
        while True:
            try:
                producer.produce(table, value, partition=count % w.partitions, on_delivery=done)
                break
            except BufferError:  # as many unanswered as the SDK's buffer holds
                time.sleep(0.001)
        count += 1
        return fut

    return send


def _kafka_consumer(gw: GatewayProcess, table: str, w: Workload) -> Any:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **_librdkafka(gw),
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(table, p, 0) for p in range(w.partitions)])
    return consumer


def _values(consumer: Any, timeout: float) -> list[Any]:
    return [m for m in consumer.consume(10_000, timeout) if m.error() is None]


def _kafka(gw: GatewayProcess, w: Workload, hot: str) -> tuple[Result, Result]:
    from confluent_kafka import Producer

    produced = Result(w.name, f"{KAFKA_PRODUCER} ({hot} hot tier)")
    read = Result(f"{w.name} read", f"confluent-kafka consumer ({hot} hot tier)")
    table = f"bench{uuid.uuid4().hex[:8]}.kafka"
    with Client(gw.grpc_target, api_key=gw.api_key) as client:
        client.create_table(table, _schema(), partitions=w.partitions)
        since = time.time_ns() + int(w.warmup_s * 1e9)
        follow = _kafka_consumer(gw, table, w)

        def poll() -> list[int]:
            return [json.loads(m.value())["sent_ns"] for m in _values(follow, 0.1)]

        follower = _Follower(produced, since, poll)
        follower.start()
        producer = Producer(
            {
                **_librdkafka(gw),
                "enable.idempotence": True,
                "acks": "all",
                "compression.type": "lz4",
                "linger.ms": 5,
                "queue.buffering.max.messages": w.batch_records * w.inflight * w.partitions,
            }
        )
        # Delivery reports are served by a thread of their own, as an application would.
        sending = threading.Event()
        sending.set()

        def serve_reports() -> None:
            while sending.is_set():
                producer.poll(0.01)

        reports = threading.Thread(target=serve_reports, daemon=True)
        reports.start()
        sync_send_loop(w, produced, _kafka_send(producer, table, w), _records(w))
        sending.clear()
        reports.join()
        produced.errors += producer.flush(DEADLINE_S)
        follower.expected = _stored(client, table)
        follower.join(DEADLINE_S)
        follower.stop.set()
        follow.close()
        total = follower.expected
        consumer = _kafka_consumer(gw, table, w)
        started = time.monotonic()
        deadline = started + DEADLINE_S
        while read.records < total and time.monotonic() < deadline:
            got = _values(consumer, 1.0)
            read.records += len(got)
            read.batches += bool(got)
        read.seconds = time.monotonic() - started
        read.bytes = read.records * w.record_bytes
        read.errors = total - read.records
        consumer.close()
        client.drop_table(table)
    return produced, read


async def run(b: Bench, w: Workload) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for hot, gw in b.gateways.items():
        sdk_produced, sdk_read = (r.summary() for r in await asyncio.to_thread(_sdk, gw, w, hot))
        kafka_produced, kafka_read = await asyncio.to_thread(_kafka, gw, w, hot)
        rows += [
            sdk_produced,
            sdk_read,
            compare(kafka_produced.summary(), [sdk_produced]),
            compare(kafka_read.summary(), [sdk_read]),
        ]
    return rows
