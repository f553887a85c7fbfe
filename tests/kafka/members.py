"""Consumers of a Kafka group, each in a process of its own (tests/kafka/group_member.py),
so a test can SIGKILL one: what each read and holds, as it printed it. The ``members``
fixture (tests/kafka/conftest.py) kills any left running."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def until(what: str, done: Callable[[], bool]) -> None:
    from tests.kafka.clients import DEADLINE_S  # clients imports conftest, which imports this

    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def described_holdings(
    gateway: Any, group: str, topic: str, protocol: str
) -> list[tuple[int, ...]]:
    """What each member of ``protocol`` holds of ``topic``, as the gateway describes the
    group (``tidegate group describe``, the console), sorted."""
    with gateway.client() as c:
        info = c.describe_group(group, topic)
    return sorted(tuple(m.assigned) for m in info.members if m.protocol == protocol)


def holding(members: list[Member]) -> list[tuple[int, ...]]:
    """What each member says it holds, sorted as :func:`described_holdings` sorts."""
    return sorted(tuple(sorted(m.assigned())) for m in members)


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
        return [(r["partition"], r["offset"]) for r in lines(self.out) if "offset" in r]

    def assigned(self) -> list[int]:
        found = [r["assigned"] for r in lines(self.out) if "assigned" in r]
        return found[-1] if found else []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
