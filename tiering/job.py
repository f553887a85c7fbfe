"""One tiering run over every table, or a loop of them: what ``tidegate tier``,
``python -m tiering`` (and so ``spark-submit``) and the embedded schedule call."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Literal

from tiering.core import Components, LocalRunner, Runner, RunReport, tier_all

if TYPE_CHECKING:
    from gateway.config import Settings

__all__ = ["make_runner", "run_forever", "run_once"]

log = logging.getLogger("tidegate.tiering")

RunnerName = Literal["local", "spark"]


def make_runner(c: Components, kind: RunnerName, master: str | None = None) -> Runner:
    if kind == "spark":
        import os

        from tiering.spark import SparkRunner, spark_session

        if master is None and not os.environ.get("PYSPARK_GATEWAY_PORT"):
            master = c.settings.tiering.master
        # Under spark-submit (its JVM gateway is there) and no explicit master, the
        # application's --master wins.
        return SparkRunner(c.settings, spark_session(master))
    return LocalRunner(c)


def run_once(c: Components, runner: Runner) -> RunReport:
    """Tier every table once; log and return what happened (failures included)."""
    started = time.monotonic()
    report = tier_all(c, runner=runner)
    elapsed = time.monotonic() - started
    _observe(report, elapsed)
    log.info(
        "tiering run: %d tables, %d records, %d failed, %.2fs",
        len(report.tables),
        report.records,
        len(report.failures),
        elapsed,
    )
    return report


def _observe(report: RunReport, seconds: float) -> None:
    try:
        from gateway import metrics
    except ImportError:  # pragma: no cover
        return
    metrics.TIERING_RUN_SECONDS.observe(seconds)


def run_forever(
    settings: Settings,
    *,
    every_s: float,
    kind: RunnerName = "local",
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
