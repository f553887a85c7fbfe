"""Deliberately broken hot tiers for the checker's own test (never used by the product).

:class:`AckFirstLog` acknowledges a batch before the hot tier has it, and writes it two
seconds later; :class:`ResolveTwiceLog` (at the end) applies a key table's retried batch
a second time.

``TIDEGATE_HOT__TYPE=tests.faults.broken:AckFirstLog`` loads it in a gateway process. A
SIGKILL in those two seconds loses acknowledged batches; the checker must say so.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from gateway.hot import PartitionId
from gateway.hot.base import AppendResult, ProducerSequence
from gateway.hot.disk import DiskHotLog


class AckFirstLog(DiskHotLog):
    name = "ack-first"

    @classmethod
    def from_settings(cls, settings: Any) -> AckFirstLog:
        return cls(settings.data_dir / "hot", fsync="batch")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next: dict[PartitionId, int] = {}
        self._guard = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[float, PartitionId, bytes, int, int]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._write_later, daemon=True).start()

    def append(
        self,
        part: PartitionId,
        payload: bytes,
        count: int,
        timestamp_us: int,
        producer: ProducerSequence | None = None,
        *,
        floor: int | None = None,
        keys: Sequence[bytes] | None = None,
        expect_high: int | None = None,
    ) -> AppendResult:
        # The fault suite's tables have no primary key: ``keys`` and ``expect_high`` are
        # never given, and the bug below is the same with them.
        with self._guard:
            base = self._next.get(part)
            if base is None:
                base = self.offsets(part).high
            self._next[part] = base + count
            self._queue.put((time.monotonic() + 2.0, part, bytes(payload), count, timestamp_us))
        return AppendResult(base, count)  # the bug: answered before it is stored

    def _write_later(self) -> None:
        while True:
            due, part, payload, count, ts = self._queue.get()
            time.sleep(max(0.0, due - time.monotonic()))
            super().append(part, payload, count, ts)


class ResolveTwiceLog(DiskHotLog):
    """A hot tier that forgets a key table's producer sequences: a retried batch of an
    idempotent producer is resolved again and its changes appended a second time (an
    upsert retried becomes ``-U``/``+U`` of itself), answered as a new range.

    ``TIDEGATE_HOT__TYPE=tests.faults.broken:ResolveTwiceLog``; the checker must say
    the batch was applied twice."""

    name = "resolve-twice"

    @classmethod
    def from_settings(cls, settings: Any) -> ResolveTwiceLog:
        return cls(settings.data_dir / "hot", fsync="batch")

    def append(
        self,
        part: PartitionId,
        payload: bytes,
        count: int,
        timestamp_us: int,
        producer: ProducerSequence | None = None,
        *,
        floor: int | None = None,
        keys: Sequence[bytes] | None = None,
        expect_high: int | None = None,
    ) -> AppendResult:
        if keys is not None and count:
            producer = None  # the bug: the sequence is not checked, so not de-duplicated
        return super().append(
            part,
            payload,
            count,
            timestamp_us,
            producer,
            floor=floor,
            keys=keys,
            expect_high=expect_high,
        )
