"""Running lake jobs: once, in a loop, or on a schedule inside ``tidegate serve``.

The embedded gateway tiers with the :class:`~gateway.lake.tiering.LocalRunner` by default:
plain threads sharing the gateway's own hot log, metadata store and catalog, so the
embedded mode needs no JVM and stays light (``tiering.runner=spark`` runs the same job on
Spark instead). A deployment with a Spark cluster turns the schedule off
(``TIDEGATE_TIERING__ENABLED=false``) and runs ``tidegate tier`` or ``spark-submit`` of the
``tiering`` package as a CronJob.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from gateway import metrics
from gateway.hot import PartitionId
from gateway.lake.components import Components
from gateway.lake.runners import make_runner
from gateway.lake.tiering import Runner, RunReport, tier_all

if TYPE_CHECKING:
    from gateway.config import Settings

__all__ = ["EmbeddedTiering", "lag", "run_forever", "run_once"]

log = logging.getLogger("tidegate.tiering")


def run_once(c: Components, runner: Runner) -> RunReport:
    """Tier every table once; log and return what happened (failures included)."""
    started = time.monotonic()
    report = tier_all(c, runner=runner)
    elapsed = time.monotonic() - started
    metrics.TIERING_RUN_SECONDS.observe(elapsed)
    # A run that moved nothing is the idle gateway's every 30 s: not worth a line at INFO.
    log.log(
        logging.INFO if report.records or report.failures else logging.DEBUG,
        "tiering run: %d tables, %d records, %d failed, %.2fs",
        len(report.tables),
        report.records,
        len(report.failures),
        elapsed,
    )
    return report


def run_forever(
    settings: Settings,
    *,
    every_s: float,
    kind: str = "local",
    master: str | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Run every ``every_s`` seconds until ``stop`` is set."""
    stop = stop or threading.Event()
    with Components.open(settings) as c:
        runner = make_runner(c, kind, master)
        while not stop.is_set():
            try:
                run_once(c, runner)
            except Exception:
                log.exception("tiering run failed")
            stop.wait(every_s)


def lag(c: Components) -> tuple[int, int]:
    """Records and estimated bytes not yet tiered, over every table (``HW(p) - T(p)``;
    bytes pro rata of the hot bytes stored)."""
    records = nbytes = 0
    for d in c.meta.all_tables():
        for p in c.meta.partitions(d.table_id):
            o = c.hot.offsets(PartitionId(d.tenant, d.table_id, p.partition))
            records += max(0, o.high - p.tiered_watermark)
            nbytes += o.bytes_from(p.tiered_watermark)
    return records, nbytes


class EmbeddedTiering:
    """A daemon thread that tiers every ``tiering.interval_s`` until stopped."""

    def __init__(self, components: Components) -> None:
        self.components = components
        self.interval_s = components.settings.tiering.interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tg-tiering", daemon=True)

    @classmethod
    def start_for(cls, components: Components | None) -> EmbeddedTiering | None:
        """Start the schedule when ``tiering.enabled`` and the cold tier is on (``None``:
        the gateway has no cold tier)."""
        if components is None or not components.settings.tiering.enabled:
            return None
        job = cls(components)
        job._thread.start()
        log.info(
            "tiering every %ss (%s runner)", job.interval_s, components.settings.tiering.runner
        )
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
                metrics.set_tiering_lag(*lag(self.components))
            except Exception:
                log.exception("tiering run failed")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current run (waits up to ``timeout`` for it)."""
        self._stop.set()
        self._thread.join(timeout)
