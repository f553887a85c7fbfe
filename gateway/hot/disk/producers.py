"""Idempotent producers on disk: the de-duplication window of each producer, and the
``state.json`` snapshot that keeps those windows (and the low mark) across restarts."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass

from gateway.hot.base import AppendResult, ProducerSequence
from gateway.hot.disk.records import PRODUCER_WINDOW, STATE_VERSION
from gateway.wire.errors import InvalidIdempotentAppend, OutOfOrderSequence

__all__ = ["ProducerWindows", "State", "Window", "new_window"]


#: (sequence, base_offset, count), oldest first.
Window = deque[tuple[int, int, int]]


def new_window() -> Window:
    return deque(maxlen=PRODUCER_WINDOW)


@dataclass(frozen=True, slots=True)
class State:
    """The content of ``state.json``: producer windows cover every batch below ``high``."""

    low: int
    high: int
    producers: dict[str, list[tuple[int, int, int]]]
    #: Whether a record below ``high`` carries a key-table's keys (None: a state file
    #: from before key-tables, which does not say).
    keyed: bool | None = None

    def to_json(self) -> bytes:
        doc: dict[str, object] = {
            "version": STATE_VERSION,
            "low": self.low,
            "high": self.high,
            "producers": {pid: [list(e) for e in w] for pid, w in self.producers.items()},
        }
        if self.keyed is not None:
            doc["keyed"] = self.keyed
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> State:
        """Parse and validate; raises ValueError on anything unexpected."""
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
            raise ValueError("unsupported state version")
        low, high, producers = doc.get("low"), doc.get("high"), doc.get("producers")
        if not isinstance(low, int) or not isinstance(high, int) or not 0 <= low <= high:
            raise ValueError("low and high must be integers with 0 <= low <= high")
        if not isinstance(producers, dict):
            raise ValueError("producers must be an object")
        keyed = doc.get("keyed")
        if keyed is not None and not isinstance(keyed, bool):
            raise ValueError("keyed must be a boolean")
        windows: dict[str, list[tuple[int, int, int]]] = {}
        for pid, entries in producers.items():
            if not isinstance(entries, list):
                raise ValueError(f"bad window for producer {pid!r}")
            window: list[tuple[int, int, int]] = []
            for entry in entries:
                if not (
                    isinstance(entry, list)
                    and len(entry) == 3
                    and all(isinstance(v, int) for v in entry)
                ):
                    raise ValueError(f"bad window entry {entry!r} for producer {pid!r}")
                window.append((entry[0], entry[1], entry[2]))
            windows[pid] = window
        return cls(low, high, windows, keyed)


class ProducerWindows(dict[str, Window]):
    """Producer id -> the window of its last batches in one partition (Kafka's rules)."""

    def check(self, where: str, producer: ProducerSequence, count: int) -> AppendResult | None:
        """The original result for a retry, None for a new batch; raises on a bad one."""
        window = self.get(producer.producer_id)
        if not window:
            if producer.sequence > 0:
                raise producer.unknown(where)
            return None
        pid, seq = producer.producer_id, producer.sequence
        last, _, last_count = window[-1]
        expected = producer.expected(last, last_count)
        if seq == expected:
            return None
        for s, base, stored_count in reversed(window):  # the latest of a wrapped sequence
            if s == seq:
                if stored_count != count and not producer.resolved:
                    raise InvalidIdempotentAppend(
                        f"producer {pid!r} resent sequence {seq} with {count} records, "
                        f"but the stored batch holds {stored_count}",
                        producer_id=pid,
                        sequence=seq,
                    )
                return AppendResult(base_offset=base, count=stored_count, duplicate=True)
        if seq > expected:
            raise OutOfOrderSequence(
                f"producer {pid!r} sent sequence {seq} to {where!r}, "
                f"expected {expected}: resend the missing batches first",
                producer_id=pid,
                sequence=seq,
                expected_sequence=expected,
            )
        raise InvalidIdempotentAppend(
            f"producer {pid!r} sent sequence {seq}, older than its de-duplication window "
            f"[{window[0][0]}, {last}]",
            producer_id=pid,
            sequence=seq,
            last_sequence=last,
        )

    def remember(self, producer: ProducerSequence, base: int, count: int) -> None:
        window = self.get(producer.producer_id)
        if window is None:
            window = self[producer.producer_id] = new_window()
        window.append((producer.sequence, base, count))
