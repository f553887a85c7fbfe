"""Snapshot expiry with file deletion, and orphan clean-up: what keeps a stream-table's
storage from growing with every tiering and compaction commit.

**Expiry** (:func:`expire_table`), per table:

1. choose the snapshots to expire: every snapshot that stopped being the current one
   (its successor was committed) more than ``expiry.retention_s`` ago (and never less
   than ``tiering.hot_retention_s``: hot-tier trimming reads the snapshot that was
   current that long ago), except the ``expiry.keep_last`` newest, the current one, and
   every snapshot an open scan or a read plan holds a lease on (metadata store);
2. remove them from the table's metadata in one commit (pyiceberg's expiry: it deletes
   no file);
3. delete the files that only they referenced (data files, manifests, manifest lists):
   computed against the metadata as it is after the commit, so a file a retained snapshot
   or a concurrent commit reads is never among them. A crash between 2 and 3 leaves
   orphans, removed by the clean-up below.

A snapshot's age is counted from when it stopped being current, not from its own commit:
a stream read that pinned the current snapshot a moment before a compaction replaced it
still finds every file for ``retention_s``.

**Orphan clean-up** (:func:`clean_orphans`): files under the table's folder that the
metadata does not reference (files of a tiering or compaction job that died before its
commit, or of an expiry that died before deleting) and that are older than
``expiry.orphan_age_s`` (3 days: a job still running may commit a file it wrote until
then). The folder is listed before the metadata is read, so a file committed meanwhile is
seen as referenced.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.cold.base import ColdTable, SnapshotInfo, fs_path
from gateway.lake.components import Components
from gateway.lake.passes import (
    RunReport,
    commit_retry,
    each_table,
    record_failure,
    with_lake_work,
)
from gateway.lake.tasks import crash_point
from gateway.wire.errors import CommitConflict

if TYPE_CHECKING:
    from gateway.meta import TableDef
    from gateway.wire.retry import Retry

__all__ = [
    "CRASH_POINT_ENV",
    "ExpiryResult",
    "OrphanResult",
    "choose_expired",
    "clean_all",
    "clean_orphans",
    "expire_all",
    "expire_table",
]

log = logging.getLogger("tidegate.expiry")

#: Crash-test hook (``after_expire``: the metadata commit is done, no file deleted yet).
CRASH_POINT_ENV = "TIDEGATE_EXPIRY_CRASH_POINT"


def choose_expired(
    snapshots: Sequence[SnapshotInfo],
    *,
    now_ms: int,
    retention_ms: int,
    keep_last: int,
    pinned: Iterable[int] = (),
) -> list[int]:
    """Ids of the snapshots (oldest first, as :meth:`ColdTable.snapshots` lists them) to
    expire: replaced by their successor more than ``retention_ms`` before ``now_ms``, not
    among the ``keep_last`` newest, not the current (newest) one, not ``pinned``."""
    ordered = sorted(snapshots, key=lambda s: (s.timestamp_ms, s.snapshot_id))
    keep = {s.snapshot_id for s in ordered[-max(1, keep_last) :]} | set(pinned)
    return [
        s.snapshot_id
        for s, successor in itertools.pairwise(ordered)
        if s.snapshot_id not in keep and successor.timestamp_ms <= now_ms - retention_ms
    ]


@dataclass(frozen=True, slots=True)
class ExpiryResult:
    table: str
    tenant: str
    expired: tuple[int, ...] = ()
    #: Snapshots kept only because a scan or a plan holds a lease on them.
    pinned: tuple[int, ...] = ()
    deleted_files: int = 0
    conflicts: int = 0

    @property
    def records(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class OrphanResult:
    table: str
    tenant: str
    #: Paths removed.
    removed: tuple[str, ...] = ()
    #: Unreferenced files left because they are younger than the safety window.
    young: int = 0
    bytes: int = 0

    @property
    def records(self) -> int:
        return 0


def _delete(c: Components, paths: Iterable[str]) -> int:
    filesystem, _ = c.cold.storage_options().filesystem()
    deleted = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            filesystem.delete_file(fs_path(path))
            deleted += 1
    return deleted


def _tables(c: Components, d: TableDef) -> list[ColdTable]:
    """The Iceberg tables of ``d``: its own, and a primary-key table's state table."""
    tables: list[ColdTable] = [c.cold.table(d)]
    if d.primary_key is not None:
        tables.append(c.cold.state_table(d))
    return tables


def expire_table(
    c: Components, d: TableDef, *, now: float | None = None, retry: Retry | None = None
) -> ExpiryResult:
    """Expire the table's old snapshots and delete the files only they referenced (a
    primary-key table's changelog and state table alike, each under the same rule).

    Raises:
        CommitConflict: still conflicting after ``retry.attempts`` tries.
    """
    retry = retry or commit_retry(c)
    expired: list[int] = []
    pinned: list[int] = []
    deleted = conflicts = 0
    for cold in _tables(c, d):
        e, p, n, k = _expire(c, d, cold, now, retry)
        expired += e
        pinned += p
        deleted += n
        conflicts += k
    result = ExpiryResult(
        d.qualified_name,
        d.tenant,
        expired=tuple(expired),
        pinned=tuple(sorted(pinned)),
        deleted_files=deleted,
        conflicts=conflicts,
    )
    if expired:
        log.info(
            "%s: expired %d snapshots, deleted %d files", d.qualified_name, len(expired), deleted
        )
    c.meta.record_run(
        d.table_id,
        "expire",
        "ok",
        f"expired {len(result.expired)} snapshots, deleted {result.deleted_files} files"
        + (f", {len(result.pinned)} kept for open scans or plans" if result.pinned else ""),
    )
    return result


def _expire(
    c: Components, d: TableDef, cold: ColdTable, now: float | None, retry: Retry
) -> tuple[list[int], list[int], int, int]:
    """Expire one Iceberg table's old snapshots: (expired, kept for leases, files
    deleted, conflicts met)."""
    cfg = c.settings.expiry
    retention_s = max(cfg.retention_s, c.settings.tiering.hot_retention_s)
    started = time.monotonic()
    conflicts = 0
    while True:
        at = now if now is not None else time.time()
        leases = c.meta.leases(d.table_id, at=dt.datetime.fromtimestamp(at, dt.UTC))
        pinned = {lease.snapshot_id for lease in leases}
        snapshots = cold.snapshots()
        ids = choose_expired(
            snapshots,
            now_ms=int(at * 1000),
            retention_ms=int(retention_s * 1000),
            keep_last=cfg.keep_last,
            pinned=pinned,
        )
        held = choose_expired(
            snapshots,
            now_ms=int(at * 1000),
            retention_ms=int(retention_s * 1000),
            keep_last=cfg.keep_last,
        )
        if not ids:
            return [], sorted(set(held) - set(ids)), 0, conflicts
        try:
            unreferenced = cold.expire_snapshots(ids)
        except CommitConflict as err:
            conflicts += 1
            delay = retry.next_delay(err, conflicts, started)
            if delay is None:
                raise
            time.sleep(delay)
            continue
        crash_point("after_expire", CRASH_POINT_ENV)
        deleted = _delete(c, unreferenced)
        return ids, sorted(set(held) - set(ids)), deleted, conflicts


def _list_files(c: Components, root: str) -> list[tuple[str, float, int]]:
    """(path, modification time in seconds, size) of every file below ``root``."""
    from pyarrow import fs as pafs

    filesystem, _ = c.cold.storage_options().filesystem()
    base = fs_path(root)
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
    except FileNotFoundError:
        return []
    prefix = root[: len(root) - len(base)] if root.endswith(base) else ""
    out = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        mtime = info.mtime.timestamp() if info.mtime is not None else time.time()
        out.append((prefix + info.path, mtime, int(info.size or 0)))
    return out


def clean_orphans(c: Components, d: TableDef, *, now: float | None = None) -> OrphanResult:
    """Remove the files under the table's folder (and a primary-key table's state
    table's) that its metadata does not reference and that are older than
    ``expiry.orphan_age_s``."""
    at = now if now is not None else time.time()
    cutoff = at - c.settings.expiry.orphan_age_s
    old: list[tuple[str, int]] = []
    young = 0
    for cold in _tables(c, d):
        listed = _list_files(c, cold.location)  # before reading the metadata: see the module
        referenced = {fs_path(p) for p in cold.referenced_files()}
        unreferenced = [(p, m, n) for p, m, n in listed if fs_path(p) not in referenced]
        here = [(p, n) for p, m, n in unreferenced if m <= cutoff]
        young += len(unreferenced) - len(here)
        old += here
    _delete(c, (p for p, _ in old))
    result = OrphanResult(
        d.qualified_name,
        d.tenant,
        removed=tuple(p for p, _ in old),
        young=young,
        bytes=sum(n for _, n in old),
    )
    if old:
        log.info("%s: removed %d orphan files", d.qualified_name, len(old))
    c.meta.record_run(
        d.table_id,
        "orphans",
        "ok",
        f"removed {len(old)} orphan files, {result.young} younger than the safety window",
    )
    return result


def expire_all(
    c: Components,
    *,
    tables: Iterable[TableDef] | None = None,
    now: float | None = None,
    max_parallel_tenants: int = 4,
) -> RunReport[ExpiryResult]:
    """Expire every table's (or ``tables``') old snapshots, tenants side by side."""
    return each_table(
        c,
        lambda d: with_lake_work(
            c,
            d,
            "expire",
            max(c.settings.expiry.retention_s, c.settings.tiering.hot_retention_s),
            lambda: expire_table(c, d, now=now),
        ),
        job="expiry",
        tables=tables,
        max_parallel_tenants=max_parallel_tenants,
        on_table=record_failure(c, "expire"),
    )


def clean_all(
    c: Components,
    *,
    tables: Iterable[TableDef] | None = None,
    now: float | None = None,
    max_parallel_tenants: int = 4,
) -> RunReport[OrphanResult]:
    """Remove every table's (or ``tables``') old orphan files, tenants side by side."""
    return each_table(
        c,
        lambda d: with_lake_work(
            c, d, "orphans", c.settings.expiry.orphan_age_s, lambda: clean_orphans(c, d, now=now)
        ),
        job="orphan clean-up",
        tables=tables,
        max_parallel_tenants=max_parallel_tenants,
        on_table=record_failure(c, "orphans"),
    )
