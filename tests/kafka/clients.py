"""The four Kafka clients of the tests behind one small face: produce values to
partitions, consume every record of partitions from offset 0.

Each is configured as docs/kafka.md tells a user to configure it (SASL/PLAIN over
plaintext, the tenant's name and API key); nothing else of them is changed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tests.kafka.conftest import KafkaTarget

#: Longest a client is given to produce or consume what a test asks.
DEADLINE_S = 60.0


@dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


class KafkaClient(Protocol):
    name: str

    def produce(
        self, target: KafkaTarget, topic: str, values: Sequence[tuple[int, bytes]]
    ) -> list[int]:
        """Produce each (partition, value); the offsets acknowledged, in order."""

    def consume(
        self, target: KafkaTarget, topic: str, partitions: Sequence[int], count: int
    ) -> list[Consumed]:
        """Every record of ``partitions`` from offset 0 until ``count`` were read."""


def librdkafka_settings(target: KafkaTarget) -> dict[str, Any]:
    """What a librdkafka client (confluent-kafka, kcat) is given to connect as the tenant."""
    return {
        "bootstrap.servers": target.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": target.tenant,
        "sasl.password": target.key,
    }


def _python_config(target: KafkaTarget) -> dict[str, Any]:
    """kafka-python's and aiokafka's settings (they share their names)."""
    return {
        "bootstrap_servers": target.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": target.tenant,
        "sasl_plain_password": target.key,
    }


class ConfluentKafka:
    name = "confluent-kafka"

    def settings(self, target: KafkaTarget) -> dict[str, Any]:
        return librdkafka_settings(target)

    def produce(
        self, target: KafkaTarget, topic: str, values: Sequence[tuple[int, bytes]]
    ) -> list[int]:
        from confluent_kafka import Producer

        producer = Producer({**self.settings(target), "compression.type": "lz4", "linger.ms": 5})
        acked: dict[int, int] = {}
        errors: list[Any] = []

        def done(i: int) -> Any:
            def report(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(err)
                else:
                    acked[i] = msg.offset()

            return report

        for i, (partition, value) in enumerate(values):
            producer.produce(topic, value, partition=partition, on_delivery=done(i))
        assert producer.flush(DEADLINE_S) == 0
        assert not errors, errors
        return [acked[i] for i in range(len(values))]

    def consume(
        self, target: KafkaTarget, topic: str, partitions: Sequence[int], count: int
    ) -> list[Consumed]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {**self.settings(target), "group.id": "unused", "enable.auto.commit": False}
        )
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
            out: list[Consumed] = []
            deadline = time.monotonic() + DEADLINE_S
            while len(out) < count and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                assert msg.error() is None, msg.error()
                out.append(
                    Consumed(
                        msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(), msg.value()
                    )
                )
            # Nothing more arrives after the last record.
            extra = consumer.poll(1.0)
            assert extra is None or extra.error() is not None, extra.value()
            return out
        finally:
            consumer.close()


class KafkaPython:
    name = "kafka-python"

    def produce(
        self, target: KafkaTarget, topic: str, values: Sequence[tuple[int, bytes]]
    ) -> list[int]:
        from kafka import KafkaProducer

        # kafka-python 3's idempotent producer is on by default, as a user gets it.
        producer = KafkaProducer(**_python_config(target), compression_type="gzip")
        try:
            futures = [producer.send(topic, value, partition=p) for p, value in values]
            producer.flush(DEADLINE_S)
            return [f.get(DEADLINE_S).offset for f in futures]
        finally:
            producer.close()

    def consume(
        self, target: KafkaTarget, topic: str, partitions: Sequence[int], count: int
    ) -> list[Consumed]:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(**_python_config(target), consumer_timeout_ms=2000)
        try:
            consumer.assign([TopicPartition(topic, p) for p in partitions])
            consumer.seek_to_beginning()
            out: list[Consumed] = []
            deadline = time.monotonic() + DEADLINE_S
            while len(out) < count and time.monotonic() < deadline:
                for msg in consumer:
                    out.append(
                        Consumed(msg.partition, msg.offset, msg.timestamp, msg.key, msg.value)
                    )
            out.extend(
                Consumed(m.partition, m.offset, m.timestamp, m.key, m.value) for m in consumer
            )
            return out
        finally:
            consumer.close()


class AioKafka:
    name = "aiokafka"

    def produce(
        self, target: KafkaTarget, topic: str, values: Sequence[tuple[int, bytes]]
    ) -> list[int]:
        from aiokafka import AIOKafkaProducer

        async def run() -> list[int]:
            producer = AIOKafkaProducer(
                **_python_config(target), compression_type="zstd", enable_idempotence=True
            )
            await producer.start()
            try:
                sent = [await producer.send(topic, value, partition=p) for p, value in values]
                return [(await f).offset for f in sent]
            finally:
                await producer.stop()

        return asyncio.run(run())

    def consume(
        self, target: KafkaTarget, topic: str, partitions: Sequence[int], count: int
    ) -> list[Consumed]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        async def run() -> list[Consumed]:
            consumer = AIOKafkaConsumer(**_python_config(target), enable_auto_commit=False)
            await consumer.start()
            try:
                consumer.assign([TopicPartition(topic, p) for p in partitions])
                await consumer.seek_to_beginning()
                out: list[Consumed] = []
                deadline = time.monotonic() + DEADLINE_S
                while time.monotonic() < deadline:
                    got = await consumer.getmany(timeout_ms=1000)
                    if not got and len(out) >= count:
                        break
                    for msgs in got.values():
                        out.extend(
                            Consumed(m.partition, m.offset, m.timestamp, m.key, m.value)
                            for m in msgs
                        )
                return out
            finally:
                await consumer.stop()

        return asyncio.run(run())


class Kcat:
    name = "kcat"

    def _args(self, target: KafkaTarget) -> list[str]:
        return [
            "kcat",
            "-b",
            target.bootstrap,
            "-X",
            "security.protocol=SASL_PLAINTEXT",
            "-X",
            "sasl.mechanisms=PLAIN",
            "-X",
            f"sasl.username={target.tenant}",
            "-X",
            f"sasl.password={target.key}",
        ]

    def produce(
        self, target: KafkaTarget, topic: str, values: Sequence[tuple[int, bytes]]
    ) -> list[int]:
        # One kcat per partition (it produces to one -p); it prints no offsets, so they are
        # the partition's next ones, checked against what the consumers read.
        for partition in sorted({p for p, _ in values}):
            lines = b"".join(v + b"\n" for p, v in values if p == partition)
            subprocess.run(
                [*self._args(target), "-P", "-z", "snappy", "-t", topic, "-p", str(partition)],
                input=lines,
                check=True,
                timeout=DEADLINE_S,
                capture_output=True,
            )
        return []

    def consume(
        self, target: KafkaTarget, topic: str, partitions: Sequence[int], count: int
    ) -> list[Consumed]:
        out: list[Consumed] = []
        for partition in partitions:
            done = subprocess.run(
                [
                    *self._args(target),
                    "-C",
                    "-t",
                    topic,
                    "-p",
                    str(partition),
                    "-o",
                    "beginning",
                    "-e",
                    "-J",
                ],
                check=True,
                timeout=DEADLINE_S,
                capture_output=True,
            )
            for line in done.stdout.splitlines():
                m = json.loads(line)
                key = m.get("key")
                payload = m.get("payload")
                out.append(
                    Consumed(
                        m["partition"],
                        m["offset"],
                        m["ts"],
                        None if key is None else key.encode(),
                        None if payload is None else payload.encode(),
                    )
                )
        return out


CLIENTS: list[KafkaClient] = [Kcat(), ConfluentKafka(), KafkaPython(), AioKafka()]
