"""The status of partition moves asked of this gateway through the admin API.

A move is recorded when it starts (``running``) and ends ``done`` or ``failed`` with the
reason; the last :data:`KEEP` are kept in memory, so recent outcomes are this process's
own. Moves under way are also in the metadata store (a placement's ``move_target``, set
before the seal): those every gateway sees, whoever started them, and a move left half
way by a crash is listed ``pending`` until the next run or append finishes it.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway import metrics

if TYPE_CHECKING:
    from gateway.lake.shards import MoveResult
    from gateway.meta import Placement
    from gateway.wire.errors import TidegateError

__all__ = ["KEEP", "MoveLog", "MoveRecord"]

#: Finished moves kept per process.
KEEP = 200


@dataclass(slots=True)
class MoveRecord:
    id: str
    tenant: str
    table: str
    partition: int
    target: str
    started_at: float
    source: str = ""
    state: str = "running"
    start: int = 0
    seconds: float = 0.0
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "table": self.table,
            "partition": self.partition,
            "source": self.source,
            "target": self.target,
            "state": self.state,
            "start": self.start,
            "started_at_ms": int(self.started_at * 1000),
            "seconds": self.seconds,
            "error": self.error,
        }


class MoveLog:
    """This process's moves: the running ones and the last :data:`KEEP` finished."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid():x}-{int(time.time()):x}"
        self._running: dict[str, MoveRecord] = {}
        self._finished: deque[MoveRecord] = deque(maxlen=KEEP)

    def begin(self, tenant: str, table: str, partition: int, target: str) -> MoveRecord:
        record = MoveRecord(
            f"{self._prefix}-{next(self._ids)}", tenant, table, partition, target, time.time()
        )
        with self._lock:
            self._running[record.id] = record
        return record

    def done(self, record: MoveRecord, result: MoveResult) -> None:
        record.source, record.start = result.source, result.start
        self._finish(record, "done", result.seconds)

    def fail(self, record: MoveRecord, err: TidegateError) -> None:
        record.error = f"{err.reason}: {err.message}"
        self._finish(record, "failed", time.time() - record.started_at)

    def _finish(self, record: MoveRecord, state: str, seconds: float) -> None:
        record.state, record.seconds = state, seconds
        metrics.record_move_outcome(state)
        with self._lock:
            self._running.pop(record.id, None)
            self._finished.append(record)

    def listing(self, pending: Sequence[Placement]) -> list[dict[str, Any]]:
        """Running moves, then intents in the store that no running move of this process
        covers (``pending``), then finished moves; newest first within each."""
        with self._lock:
            running = sorted(self._running.values(), key=lambda r: -r.started_at)
            finished = list(reversed(self._finished))
        mine = {(r.tenant, r.table, r.partition) for r in running}
        out = [r.to_dict() for r in running]
        for p in pending:
            table = f"{p.namespace}.{p.name}"
            if (p.tenant, table, p.partition) in mine:
                continue
            pending_move = MoveRecord(
                "", p.tenant, table, p.partition, p.move_target or "", 0.0, p.shard, "pending"
            )
            out.append(pending_move.to_dict())
        out.extend(r.to_dict() for r in finished)
        return out
