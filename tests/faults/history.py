"""The recorded history of a fault run: every operation a client did and what came of it.

Events are plain dicts (JSON lines on disk) in the order they completed, each with its
index ``i``, the seconds since the run began ``t``, a ``type`` and a ``client``:

- ``append``: ``table``, ``key`` (the idempotence key, ``producer/partition/sequence``, or
  the SDK producer's id), ``rids`` (the record ids sent), ``outcome`` (``ok`` with ``at``,
  one ``[partition, offset]`` per rid; ``refused``: definitely not stored; ``unknown``:
  the connection broke or the answer was an error that does not say), ``error``;
  ``atomic`` when the rids went in one request (stored wholly or not at all), ``took``
  (seconds) for an acknowledged request.
- ``read``: ``table``, ``partition``, ``from``, ``records`` (``[offset, rid]`` pairs).
- ``scan``: ``table``, ``records`` (``[partition, offset, rid]``).
- ``fetch_offsets`` / ``commit``: ``table``, ``group``, ``offsets`` (partition -> offset).
- ``fault``: ``kind``, ``target``, ``phase`` (``start`` / ``end``), details;
- ``restart``: a client started over after an error it does not retry, ``error``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

Event = dict[str, Any]


class History:
    """A thread-safe, append-only list of events."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._t0 = time.monotonic()

    def record(self, type: str, client: str, **fields: Any) -> Event:
        with self._lock:
            event = {
                "i": len(self._events),
                "t": round(time.monotonic() - self._t0, 3),
                "type": type,
                "client": client,
                **fields,
            }
            self._events.append(event)
        return event

    def __iter__(self) -> Iterator[Event]:
        with self._lock:
            return iter(list(self._events))

    def __len__(self) -> int:
        return len(self._events)

    def of(self, *types: str) -> list[Event]:
        return [e for e in self if e["type"] in types]

    def dump(self, path: Path) -> None:
        with path.open("w") as out:
            for e in self:
                out.write(json.dumps(e, separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path: Path) -> History:
        return cls.of_events(json.loads(line) for line in path.read_text().splitlines())

    @classmethod
    def of_events(cls, events: Iterable[Event]) -> History:
        h = cls()
        h._events = [{**e, "i": i} for i, e in enumerate(events)]
        return h
