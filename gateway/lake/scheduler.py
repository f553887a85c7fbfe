"""Running lake jobs (tiering, compaction): once, in a loop, or on a schedule inside
``tidegate serve``.

The embedded gateway runs them with the :class:`~gateway.lake.tiering.LocalRunner` by
default: plain threads sharing the gateway's own hot log, metadata store and catalog, so
the embedded mode needs no JVM and stays light (``tiering.runner=spark`` runs the same jobs
on Spark instead). A deployment with a Spark cluster turns the schedules off
(``TIDEGATE_TIERING__ENABLED=false``, ``TIDEGATE_COMPACTION__ENABLED=false``) and runs
``tidegate tier`` / ``tidegate compact`` or ``spark-submit`` of the ``tiering`` package as
CronJobs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from gateway import metrics
from gateway.hot import PartitionId
from gateway.lake.components import Components
from gateway.lake.runners import Runner, make_runner
from gateway.lake.tiering import RunReport, tier_all

if TYPE_CHECKING:
    from gateway.cold.base import FileStats
    from gateway.config import Settings
    from gateway.meta import TableDef

__all__ = [
    "JOBS",
    "PARALLEL_TENANTS",
    "EmbeddedJobs",
    "Job",
    "changed_tables",
    "embedded_parallel_tenants",
    "lag",
    "lake_stats",
    "run_forever",
    "run_once",
]

log = logging.getLogger("tidegate.tiering")

#: The lake jobs by name.
Job = Literal["tier", "compact", "expire", "orphans", "retention"]


def _tier(c: Components, runner: Runner, tenants: int, tables: Tables) -> RunReport[Any]:
    return tier_all(c, runner=runner, max_parallel_tenants=tenants, tables=tables)


def _compact(c: Components, runner: Runner, tenants: int, tables: Tables) -> RunReport[Any]:
    from gateway.lake.compaction import compact_all

    return compact_all(c, runner=runner, max_parallel_tenants=tenants, tables=tables)


def _expire(c: Components, runner: Runner, tenants: int, tables: Tables) -> RunReport[Any]:
    # Metadata work and deletes: the driver does it all, whatever the runner.
    from gateway.lake.expiry import expire_all

    return expire_all(c, max_parallel_tenants=tenants, tables=tables)


def _orphans(c: Components, runner: Runner, tenants: int, tables: Tables) -> RunReport[Any]:
    from gateway.lake.expiry import clean_all

    return clean_all(c, max_parallel_tenants=tenants, tables=tables)


def _retention(c: Components, runner: Runner, tenants: int, tables: Tables) -> RunReport[Any]:
    # Metadata work, one rewrite per partition at most and deletes: on the driver.
    from gateway.lake.retention import retain_all

    return retain_all(c, max_parallel_tenants=tenants, tables=tables)


def changed_tables(c: Components, job: str) -> list[TableDef]:
    """The tables ``job`` has work on (issue 30): those marked for it and due (tiering:
    partitions with acknowledged records not yet tiered, or a hot tier to trim;
    compaction, expiry, orphan clean-up: what a commit asked for), and for retention the
    tables that have one. One indexed query; an idle table is not among them."""
    if job == "retention":
        return c.meta.tables_with_retention()
    kinds = {"tier": ["tier", "trim"]}.get(job, [job])
    return c.meta.due_tables(kinds)


#: Tenants a lake job works on at once when nothing else is asked: one driver thread each.
PARALLEL_TENANTS = 4

#: The tables a job visits: a list, or None for every table.
Tables = list["TableDef"] | None

#: name -> (run over the tables (None: every table) with at most so many tenants at once,
#: logger name, what a run's log line calls it).
JOBS: dict[str, tuple[Callable[[Components, Runner, int, Tables], RunReport[Any]], str, str]] = {
    "tier": (_tier, "tidegate.tiering", "tiering"),
    "compact": (_compact, "tidegate.compaction", "compaction"),
    "expire": (_expire, "tidegate.expiry", "expiry"),
    "orphans": (_orphans, "tidegate.expiry", "orphan clean-up"),
    "retention": (_retention, "tidegate.retention", "retention"),
}


def run_once(
    c: Components,
    runner: Runner,
    job: str = "tier",
    *,
    tenants: int = PARALLEL_TENANTS,
    changed: bool = False,
) -> RunReport[Any]:
    """Run the lake job ``job`` once, ``tenants`` tenants at a time, over every table or,
    with ``changed``, only the tables that need it (:func:`changed_tables`: what the
    schedules, ``tidegate tier`` and the Spark jobs do); log and return what happened
    (failures included)."""
    fn, logger, label = JOBS[job]
    started = time.monotonic()
    tables = changed_tables(c, job) if changed else None
    report = fn(c, runner, tenants, tables)
    elapsed = time.monotonic() - started
    if job == "tier":
        metrics.TIERING_RUN_SECONDS.observe(elapsed)
    else:
        metrics.record_lake_job(job, len(report.tables), len(report.failures), time.time())
        metrics.set_lake_stats(lake_stats(c, tables))
    # A run that moved nothing is the idle gateway's every 30 s: not worth a line at INFO.
    logging.getLogger(logger).log(
        logging.INFO if report.records or report.failures else logging.DEBUG,
        "%s run: %d tables, %d records, %d failed, %.2fs",
        label,
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
    job: str = "tier",
    changed: bool = True,
) -> None:
    """Run ``job`` every ``every_s`` seconds until ``stop`` is set, over the tables that
    need it (every table when not ``changed``)."""
    stop = stop or threading.Event()
    with Components.open(settings) as c:
        runner = make_runner(c, kind, master)
        while not stop.is_set():
            try:
                run_once(c, runner, job, changed=changed)
            except Exception:
                log.exception("%s run failed", job)
            stop.wait(every_s)


#: Table id -> its file statistics, as last read by a lake job that visited it (a job
#: reads those of the tables it visits only). Bounded: past it, the oldest go.
_STATS: OrderedDict[str, FileStats] = OrderedDict()
_STATS_LIMIT = 100_000
_STATS_LOCK = threading.Lock()


def lake_stats(c: Components, tables: Tables = None) -> list[FileStats]:
    """The tables' file statistics: read again for ``tables`` (None: every table, read
    now), remembered for the others as last read (tables that fail to answer are left
    out). A job that visited a few tables reads theirs only, not every table's."""
    small = c.settings.compaction.small_file_bytes
    defs = c.meta.all_tables() if tables is None else tables
    with _STATS_LOCK:
        if tables is None:
            _STATS.clear()
        for d in defs:
            try:
                _STATS[d.table_id] = c.cold.table(d).file_stats(d.partitions, small)
                _STATS.move_to_end(d.table_id)
            except Exception as exc:  # a dropped table, a catalog hiccup: metrics only
                _STATS.pop(d.table_id, None)
                log.debug("no file statistics for %s: %s", d.qualified_name, exc)
        while len(_STATS) > _STATS_LIMIT:
            _STATS.popitem(last=False)
        return list(_STATS.values())


def lag(c: Components) -> tuple[int, int]:
    """Records and estimated bytes not yet tiered, over the partitions marked for
    tiering (``HW(p) - T(p)``; bytes pro rata of the hot bytes stored): the others have
    nothing waiting, so an idle table costs nothing here either."""
    records = nbytes = 0
    for tenant, table_id, p, tiered in c.meta.marked_partitions():
        if p < 0:
            continue
        o = c.hot.offsets(PartitionId(tenant, table_id, p))
        records += max(0, o.high - tiered)
        nbytes += o.bytes_from(tiered)
    return records, nbytes


def embedded_parallel_tenants(settings: Settings) -> int:
    """Tenants the embedded schedule's jobs work on at once: ``tiering.embedded_parallel_
    tenants``, by default one with the local runner and :data:`PARALLEL_TENANTS` with Spark.

    With the local runner every tenant's driver thread runs pyiceberg's commit, Avro
    manifests and SQL in the gateway's own interpreter; four of them at once kept the
    event loop from the interpreter lock for up to ~90 ms at a time, and the passes were
    where the disk hot tier's fixed-rate append p99 of 70-400 ms came from. One at a time,
    a pass takes longer but the loop competes with one thread only. A Spark driver thread
    only waits for its tasks, and its tenants' fair-scheduler pools need them side by
    side.
    """
    chosen = settings.tiering.embedded_parallel_tenants
    if chosen is not None:
        return chosen
    return 1 if settings.tiering.runner == "local" else PARALLEL_TENANTS


class EmbeddedJobs:
    """A daemon thread that runs each enabled lake job on its own period until stopped:
    tiering every ``tiering.interval_s``, compaction every ``compaction.interval_s``,
    expiry (and, with ``expiry.orphans_enabled``, the orphan clean-up) every
    ``expiry.interval_s``, table retention every ``retention.interval_s``.
    One thread, one job at a time: the embedded gateway's lake work never takes more
    than one core, and the jobs never race each other (they are safe if they do)."""

    def __init__(self, components: Components) -> None:
        self.components = components
        s = components.settings
        #: job -> period in seconds, for the enabled jobs.
        self.periods: dict[str, float] = {}
        if s.tiering.enabled:
            self.periods["tier"] = s.tiering.interval_s
        if s.compaction.enabled:
            self.periods["compact"] = s.compaction.interval_s
        if s.expiry.enabled:
            self.periods["expire"] = s.expiry.interval_s
        if s.expiry.enabled and s.expiry.orphans_enabled:
            self.periods["orphans"] = s.expiry.interval_s
        if s.retention.enabled:
            self.periods["retention"] = s.retention.interval_s
        #: Tenants a job works on at once (:func:`embedded_parallel_tenants`).
        self.tenants = embedded_parallel_tenants(s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tg-lake", daemon=True)

    @classmethod
    def start_for(cls, components: Components | None) -> EmbeddedJobs | None:
        """Start the schedule of the enabled jobs (``tiering.enabled``,
        ``compaction.enabled``, ``expiry.enabled``) when the cold tier is on (``None``: the
        gateway has no cold tier, or every job is off)."""
        if components is None:
            return None
        job = cls(components)
        if not job.periods:
            return None
        job._thread.start()
        log.info(
            "lake jobs: %s (%s runner)",
            ", ".join(f"{name} every {p}s" for name, p in job.periods.items()),
            components.settings.tiering.runner,
        )
        return job

    def _loop(self) -> None:
        try:
            runner = make_runner(self.components, self.components.settings.tiering.runner)
        except Exception:
            log.exception("cannot start the lake jobs' runner")
            return
        now = time.monotonic()
        due = {name: now + period for name, period in self.periods.items()}
        sweep = self.components.settings.tiering.sweep_interval_s
        if "tier" in self.periods:
            due["sweep"] = now  # at start: what a crash left unmarked
        while True:
            name = min(due, key=lambda n: due[n])
            if self._stop.wait(max(0.0, due[name] - time.monotonic())):
                return
            if name == "sweep":
                self._sweep()
                if sweep > 0:
                    due["sweep"] = time.monotonic() + sweep
                else:
                    del due["sweep"]
                continue
            try:
                run_once(self.components, runner, name, tenants=self.tenants, changed=True)
                if name == "tier":
                    metrics.set_tiering_lag(*lag(self.components))
            except Exception:
                log.exception("%s run failed", name)
            due[name] = time.monotonic() + self.periods[name]

    def _sweep(self) -> None:
        """Mark every table for one tiering visit (appends a gateway acknowledged just
        before a crash may never have been marked): the next tiering run visits each
        once, then only what changes again."""
        try:
            n = self.components.meta.mark_all_tables("tier")
            log.debug("tiering sweep: %d tables marked for one visit", n)
        except Exception:
            log.exception("marking the tables for the tiering sweep failed")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current run (waits up to ``timeout`` for it)."""
        self._stop.set()
        self._thread.join(timeout)
