"""What every lake job shares: a pass over every table, tenants side by side
(:func:`each_table`), its report (:class:`RunReport`), how it retries a conflicting commit
(:func:`commit_retry`), and the bookkeeping of a table's lake work (:func:`with_lake_work`,
:func:`record_failure`). Tiering, compaction, expiry and retention each run on it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from gateway.lake.components import Components
from gateway.wire.errors import SnapshotNotFound, TableNotFound
from gateway.wire.retry import ExponentialBackoff, Retry

if TYPE_CHECKING:
    from gateway.meta import TableDef

__all__ = [
    "CREATION_GRACE_S",
    "RunReport",
    "being_created",
    "commit_retry",
    "dropped",
    "each_table",
    "record_failure",
    "with_lake_work",
]

log = logging.getLogger("tidegate.tiering")

#: A table younger than this whose Iceberg table is missing is still being created (the
#: metadata row is written first, the Iceberg table a moment later, in one request): the
#: lake jobs skip it quietly. Older, a missing Iceberg table is a failure of the table.
CREATION_GRACE_S = 60.0


class _Counted(Protocol):
    @property
    def records(self) -> int: ...


R = TypeVar("R", bound=_Counted)


@dataclass
class RunReport(Generic[R]):
    """What one run of a lake job did: a result per table handled, an error per table
    that failed."""

    tables: list[R] = field(default_factory=list)
    #: ``tenant/namespace.name`` -> the error that stopped that table.
    failures: dict[str, BaseException] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(t.records for t in self.tables)

    @property
    def ok(self) -> bool:
        return not self.failures


def commit_retry(c: Components) -> Retry:
    """How a lake job retries a conflicting commit: ``tiering.commit_attempts`` tries,
    jittered exponential backoff from 50 ms to 2 s."""
    return Retry(
        ExponentialBackoff(base=0.05, cap=2.0),
        attempts=c.settings.tiering.commit_attempts - 1,
        timeout=None,
    )


def with_lake_work(c: Components, d: TableDef, job: str, window_s: float, fn: Callable[[], R]) -> R:
    """Run ``fn``, ``job``'s work on ``d``, then clear the table's ``job`` mark for the
    changes it covered: those marked ``window_s`` (the job's age threshold: snapshot
    retention, the orphans' safety window) before it began; a later mark stays, due
    ``window_s`` after it. A compaction that committed asks for expiry and orphan
    clean-up in turn. Never fails the run for its bookkeeping."""
    from gateway.meta.work import TABLE_LEVEL, Mark

    began = dt.datetime.now(dt.UTC)
    result = fn()
    try:
        if job == "compact" and bool(getattr(result, "added", False)):
            s = c.settings
            now = dt.datetime.now(dt.UTC)
            c.meta.mark_work(
                Mark(d.table_id, TABLE_LEVEL, j, since=now, due_at=now + dt.timedelta(seconds=w))
                for j, w in (("expire", s.expiry.retention_s), ("orphans", s.expiry.orphan_age_s))
            )
        c.meta.finish_work(d.table_id, job, began - dt.timedelta(seconds=window_s), window_s)
    except Exception as exc:
        log.warning("%s: recording its lake work failed (%s)", d.qualified_name, exc)
    return result


def each_table(
    c: Components,
    fn: Callable[[TableDef], R],
    *,
    job: str,
    tables: Iterable[TableDef] | None = None,
    max_parallel_tenants: int = 4,
    on_table: Callable[[TableDef, R | BaseException], None] | None = None,
    on_failure: Callable[[], None] | None = None,
) -> RunReport[R]:
    """Run a lake job's ``fn`` on every table (or ``tables``), tenants side by side:
    one driver thread per tenant (at most ``max_parallel_tenants`` at once), so a Spark
    runner puts each tenant's tasks in its own fair-scheduler pool; a table that fails
    is logged and reported and never stops another table or tenant. A table still being
    created (:func:`being_created`) is skipped without a word above DEBUG, one dropped
    while its pass ran (:func:`dropped`) with one INFO line, no traceback."""
    defs = list(c.meta.all_tables() if tables is None else tables)
    by_tenant: dict[str, list[TableDef]] = defaultdict(list)
    for d in defs:
        by_tenant[d.tenant].append(d)
    report: RunReport[R] = RunReport()
    lock = threading.Lock()

    def one_tenant(items: list[TableDef]) -> None:
        for d in items:
            outcome: R | BaseException
            if dropped(c, d):
                # Dropped since it was listed: a job must not make its Iceberg table (made
                # at first use) again behind the drop.
                log.info(
                    "%s %s/%s: the table was dropped while the pass ran; skipped",
                    job, d.tenant, d.qualified_name,
                )  # fmt: skip
                continue
            try:
                outcome = fn(d)
            except Exception as exc:
                if isinstance(exc, SnapshotNotFound) and being_created(d, exc):
                    log.debug("%s %s/%s: not created yet; skipped", job, d.tenant, d.qualified_name)
                    continue
                if dropped(c, d):
                    log.info(
                        "%s %s/%s: the table was dropped while the pass ran; skipped (%s)",
                        job, d.tenant, d.qualified_name, type(exc).__name__,
                    )  # fmt: skip
                    continue
                log.exception("%s %s/%s failed", job, d.tenant, d.qualified_name)
                if on_failure is not None:
                    on_failure()
                outcome = exc
            with lock:
                if isinstance(outcome, BaseException):
                    report.failures[f"{d.tenant}/{d.qualified_name}"] = outcome
                else:
                    report.tables.append(outcome)
            if on_table is not None:
                on_table(d, outcome)

    if len(by_tenant) <= 1:
        for items in by_tenant.values():
            one_tenant(items)
    else:
        workers = max(1, min(max_parallel_tenants, len(by_tenant)))
        with ThreadPoolExecutor(workers, "tg-tenant") as pool:
            list(pool.map(one_tenant, by_tenant.values()))
    return report


def dropped(c: Components, d: TableDef) -> bool:
    """Whether ``d`` is no longer its name's table (dropped, and maybe created again under
    a new id): the failure of a lake job on it is the race of a drop with the pass, and
    the drop has removed or will remove everything the job would have touched."""
    try:
        now = c.meta.get_table(d.tenant, d.namespace, d.name)
    except TableNotFound:
        return True
    except Exception:  # the metadata store is down: not a drop that can be shown
        return False
    return now.table_id != d.table_id


def being_created(d: TableDef, exc: SnapshotNotFound, now: float | None = None) -> bool:
    """Whether ``exc`` (the Iceberg table of ``d`` is missing) only means that a lake job
    listed ``d`` between its metadata row and its Iceberg table (:data:`CREATION_GRACE_S`)."""
    created = d.created_at
    if created.tzinfo is None:  # SQLite hands back naive UTC
        created = created.replace(tzinfo=dt.UTC)
    age = (now or time.time()) - created.timestamp()
    return "missing_iceberg_table" in exc.details and age < CREATION_GRACE_S


def record_failure(c: Components, job: str) -> Callable[[TableDef, Any], None]:
    """An ``on_table`` hook for :func:`each_table` that remembers a
    table's failed run of ``job`` (what describe shows as its last run)."""

    def on_table(d: TableDef, outcome: Any) -> None:
        if isinstance(outcome, BaseException):
            with contextlib.suppress(Exception):
                first = (str(outcome) or type(outcome).__name__).splitlines()[0]
                c.meta.record_run(d.table_id, job, "failed", first)

    return on_table
