"""One confluent-kafka consumer of a classic group, run as its own process by the group
tests (so a test can SIGKILL it): ``python -m tests.kafka.group_member SETTINGS_JSON
TOPIC``. It commits each record synchronously and only then prints it as
``{"partition": p, "offset": o}``, so a record printed is a record committed; a commit
refused (a rebalance) seeks back to the record, which is read again by whoever holds its
partition. Its assignment is printed as ``{"assigned": [...]}`` whenever it changes.
SIGTERM closes the consumer (it leaves the group)."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition


def _say(value: dict[str, Any]) -> None:
    print(json.dumps(value), flush=True)


def main() -> None:
    settings, topic = json.loads(sys.argv[1]), sys.argv[2]
    consumer = Consumer(settings)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))

    held: set[int] = set()

    def assigned(_: Consumer, tps: list[TopicPartition]) -> None:
        # Cooperative assignors hand out and take back partitions a few at a time.
        held.update(tp.partition for tp in tps)
        _say({"assigned": sorted(held)})

    def revoked(_: Consumer, tps: list[TopicPartition]) -> None:
        held.difference_update(tp.partition for tp in tps)
        _say({"assigned": sorted(held)})

    consumer.subscribe([topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)
    while not stopping:
        msg = consumer.poll(0.2)
        if msg is None or msg.error() is not None:
            continue
        try:
            consumer.commit(message=msg, asynchronous=False)
        except KafkaException:
            # No longer ours (KafkaException): its new holder reads from the committed offset.
            with contextlib.suppress(KafkaException):
                consumer.seek(TopicPartition(topic, msg.partition(), msg.offset()))
            continue
        _say({"partition": msg.partition(), "offset": msg.offset()})
    consumer.close()


if __name__ == "__main__":
    main()
