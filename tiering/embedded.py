"""Tiering on a schedule inside ``tidegate serve`` (the embedded mode).

The gateway tiers with the :class:`~tiering.core.LocalRunner` by default: plain threads
sharing the gateway's own hot log, metadata store and catalog, so the embedded mode needs
no JVM and stays light (``tiering.runner=spark`` runs the same job on Spark instead). A
deployment with a Spark cluster turns the schedule off (``TIDEGATE_TIERING__ENABLED=false``)
and runs ``tidegate tier`` / ``spark-submit`` as a CronJob.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from gateway.hot import PartitionId
from tiering.core import Components
from tiering.job import make_runner, run_once

if TYPE_CHECKING:
    from gateway.config import Settings
    from gateway.core.service import StreamTables

__all__ = ["EmbeddedTiering", "lag"]

log = logging.getLogger("tidegate.tiering")


def lag(c: Components) -> tuple[int, int]:
    """Records and estimated bytes not yet tiered, over every table (``HW(p) - T(p)``;
    bytes pro rata of the hot bytes stored)."""
    records = nbytes = 0
    for d in c.meta.all_tables():
        for p in c.meta.partitions(d.table_id):
            o = c.hot.offsets(PartitionId(d.tenant, d.table_id, p.partition))
            behind = max(0, o.high - p.tiered_watermark)
            records += behind
            nbytes += lag_bytes(o.low, o.high, o.size_bytes, p.tiered_watermark)
    return records, nbytes


def lag_bytes(low: int, high: int, size_bytes: int, tiered: int) -> int:
    """Estimated hot bytes of ``[tiered, high)`` given ``size_bytes`` for ``[low, high)``."""
    held = high - low
    behind = max(0, high - max(tiered, low))
    if held <= 0 or behind <= 0:
        return 0
    return size_bytes * behind // held


class EmbeddedTiering:
    """A daemon thread that tiers every ``tiering.interval_s`` until stopped."""

    def __init__(self, service: StreamTables, settings: Settings) -> None:
        if service.cold is None:
            raise ValueError("embedded tiering needs the cold tier")
        self.components = Components(settings, service.meta, service.hot, service.cold)
        self.interval_s = settings.tiering.interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tg-tiering", daemon=True)

    @classmethod
    def start_for(cls, service: StreamTables, settings: Settings) -> EmbeddedTiering | None:
        """Start the schedule when ``tiering.enabled`` and the cold tier is on."""
        if not settings.tiering.enabled or getattr(service, "cold", None) is None:
            return None
        job = cls(service, settings)
        job._thread.start()
        log.info("tiering every %ss (%s runner)", job.interval_s, settings.tiering.runner)
        return job

    def _loop(self) -> None:
        try:
            runner = make_runner(self.components, self.components.settings.tiering.runner)
        except Exception:
            log.exception("cannot start the tiering runner")
            return
        while not self._stop.wait(self.interval_s):
            try:
                run_once(self.components, runner)
                from gateway import metrics

                metrics.set_tiering_lag(*lag(self.components))
            except Exception:
                log.exception("tiering run failed")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current run (waits up to ``timeout`` for it)."""
        self._stop.set()
        self._thread.join(timeout)
