"""Kafka's classic group protocol: confluent-kafka consumers ``subscribe()``d to a table
share its partitions with their own assignor, take over a SIGKILLed member's partitions
from its committed offsets, and commit the offsets ``tidegate group describe`` shows."""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_first_hour import cli
from tests.kafka.clients import DEADLINE_S, ConfluentKafka, librdkafka_settings
from tests.kafka.conftest import KafkaTarget

PARTITIONS = 6


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Member:
    """A consumer of the group in a process of its own (tests/kafka/group_member.py)."""

    def __init__(self, folder: Path, n: int, settings: dict[str, Any], topic: str) -> None:
        self.out = folder / f"member{n}.out"
        with self.out.open("w") as out, (folder / f"member{n}.err").open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.kafka.group_member", json.dumps(settings), topic],
                stdout=out,
                stderr=err,
            )

    def read(self) -> list[tuple[int, int]]:
        return [(r["partition"], r["offset"]) for r in _lines(self.out) if "offset" in r]

    def assigned(self) -> list[int]:
        found = [r["assigned"] for r in _lines(self.out) if "assigned" in r]
        return found[-1] if found else []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        if m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()


def _produce(kafka: KafkaTarget, topic: str, first: int, per_partition: int) -> None:
    values = [
        (p, json.dumps({"id": first + p * per_partition + i}).encode())
        for p in range(PARTITIONS)
        for i in range(per_partition)
    ]
    ConfluentKafka().produce(kafka, topic, values)


def test_a_group_of_three_reads_every_record_once_while_a_member_is_killed(
    kafka: KafkaTarget, members: list[Member], tmp_path: Path
) -> None:
    topic = f"g{secrets.token_hex(5)}.clicks"
    with kafka.gateway.client() as c:
        c.create_table(topic, {"id": "int64"}, partitions=PARTITIONS)
    group = f"readers-{secrets.token_hex(4)}"
    settings = {
        **librdkafka_settings(kafka),
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "cooperative-sticky",
    }
    _produce(kafka, topic, 0, 10)
    members.extend(Member(tmp_path, n, settings, topic) for n in range(3))

    def read() -> list[tuple[int, int]]:
        return [r for m in members for r in m.read()]

    # Every member holds two partitions once the group settled, and all was read.
    _until("the group to settle", lambda: all(len(m.assigned()) == 2 for m in members))
    _until("the first records", lambda: len(read()) >= 10 * PARTITIONS)
    victim = members[0]
    lost = victim.assigned()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    _produce(kafka, topic, 1000, 10)
    _until("every record", lambda: len(read()) >= 20 * PARTITIONS)
    time.sleep(1)  # nothing more comes: no record is read twice
    got = read()
    assert sorted(got) == [(p, o) for p in range(PARTITIONS) for o in range(20)]
    # The survivors took over the killed member's partitions, from its committed offsets.
    survivors = {r for m in members[1:] for r in m.read()}
    assert {(p, o) for p in lost for o in range(10, 20)} <= survivors
    assert sorted(members[1].assigned() + members[2].assigned()) == list(range(PARTITIONS))
    for m in members[1:]:
        m.stop()
    described = json.loads(cli(kafka.gateway, "group", "describe", group, topic, "--json").stdout)
    committed = {p["partition"]: p["committed"] for p in described["partitions"]}
    assert committed == dict.fromkeys(range(PARTITIONS), 20)
