"""Server-side scan plans of the Iceberg REST catalog (``POST .../plan``): the pinned view
of a table scan (:meth:`ScanOps.scan`) as file scan tasks any Iceberg engine reads.

A plan without ``snapshot-id`` pins the current snapshot ``S`` and, per partition, the hot
range ``[T_S(p), HW(p))`` exactly as the gateway's own scan does (``ScanOps._pin``): every
acknowledged row below HW is in exactly one of the two, whatever tiering commits meanwhile.
The snapshot's data files are named as they are; each hot range becomes Parquet files in
the table's schema and field ids under a folder no snapshot references
(:mod:`gateway.cold.plans`), written once per range and named again by later plans. With
``snapshot-id`` (time travel) a plan names that snapshot's files only; with
``start-snapshot-id`` and ``end-snapshot-id`` (an incremental append scan), the files the
appends between them added.

A plan lives ``cold.presign_expiry_s`` (one hour by default, as a read plan): its snapshot
is leased from expiry that long, and its hot-tail files are rewritten before being named
again when the orphan clean-up could remove them within a plan's life. A plan with more
hot records to write than ``cold.rest_catalog.plan_submit_records`` is submitted: its
files are written afterwards, and found completed once files cover every pinned range,
whichever replica wrote them (:mod:`gateway.core.catalog_submits`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gateway.cold.base import DataAccess
from gateway.core.catalog import _missing, _valid
from gateway.core.catalog_filters import from_iceberg_json, resolve_name
from gateway.core.scans import ScanOps, _retained
from gateway.core.views import HotRange, TableView
from gateway.wire.errors import InvalidRequest, NotFound, Unavailable, Unimplemented
from gateway.wire.filters import ALWAYS_TRUE, Expr, bind

if TYPE_CHECKING:
    from gateway.cold import ColdSnapshot
    from gateway.cold.plans import HotFile

__all__ = ["CatalogPlan", "CatalogPlanOps", "PlanRequest", "PlanState"]

#: Pins a plan tries when the hot tier trims a pinned range before its file is written.
_PIN_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """A ``PlanTableScanRequest`` of the spec, checked for types by the edge."""

    select: tuple[str, ...] | None = None
    filter: Any = None
    snapshot_id: int | None = None
    case_sensitive: bool = True
    use_snapshot_schema: bool = False
    stats_fields: tuple[str, ...] = ()
    start_snapshot_id: int | None = None
    end_snapshot_id: int | None = None
    #: The spec's hint: a plan may name only files enough for this many rows.
    min_rows_requested: int | None = None


@dataclass(frozen=True, slots=True)
class PlanState:
    """What a plan id holds (sealed by the edge): enough to answer the plan again."""

    tenant: str
    table_id: str
    snapshot_id: int | None
    lease_id: str | None
    ranges: tuple[tuple[int, int, int], ...]
    expires_at: int
    #: An incremental plan's start (exclusive; ``snapshot_id`` is its end): the files the
    #: appends between them added, no hot tail.
    start_snapshot_id: int | None = None
    #: When a submitted plan was submitted (Unix ms): its hot-tail files are written in
    #: the background; None for a plan that completed within its request.
    submitted_at: int | None = None


@dataclass(frozen=True, slots=True)
class CatalogPlan:
    """A completed plan: its files, how to read them, and what it cost."""

    state: PlanState
    data_files: list[dict[str, Any]]
    hot_files: list[HotFile]
    access: DataAccess
    #: One sentence when the plan failed (a hot tail over the limit): no files then.
    failed: str | None = None
    #: Records of the hot tail left out (plan_hot_overflow = committed).
    skipped_hot_records: int = 0
    written_bytes: int = field(default=0)
    #: The earliest retained offset per partition the plan pruned the data files with
    #: (what a page of them needs to list the same files again).
    earliest: tuple[tuple[int, int], ...] = ()
    #: The table's columns (as a plan's names resolve against).
    column_names: tuple[str, ...] = ()
    #: Submitted, not completed: its hot-tail files are being written (no files named).
    submitted: bool = False


class CatalogPlanOps(ScanOps):
    async def _plan_table(self, tenant: str, namespace: str, name: str) -> TableView:
        if self.cold is None or not (_valid(namespace) and _valid(name)):
            raise _missing(namespace, name)
        try:
            return await self.table(tenant, namespace, name, fresh=True)
        except NotFound:
            raise _missing(namespace, name) from None

    def _plan_filter(
        self,
        table: TableView,
        request: PlanRequest,
        names: Sequence[str] | None = None,
        where: str = "",
    ) -> Expr | None:
        """The plan's filter bound to the table; its names resolved against ``names``
        (the table's columns by default; the snapshot's with use-snapshot-schema)."""
        if request.filter is None:
            return None
        if names is None:
            names = table.stored_schema.names
        try:
            tree = from_iceberg_json(
                request.filter, names, request.case_sensitive, self._filter_limits
            )
        except InvalidRequest as exc:
            if not where:
                raise
            raise InvalidRequest(f"filter{where}: {exc}") from None
        bound = bind(tree, table.stored_schema)
        return None if bound == ALWAYS_TRUE else bound

    async def _plan_names(self, table: TableView, request: PlanRequest) -> tuple[list[str], str]:
        """The columns a plan's ``select``, ``filter`` and ``stats-fields`` name, and how
        an error says where they come from: with ``use-snapshot-schema`` and
        ``snapshot-id`` (time travel), the columns of the schema that snapshot was
        written with; else the table's (the hot tail is in the table's schema)."""
        names = list(table.stored_schema.names)
        sid = request.snapshot_id
        if not request.use_snapshot_schema or sid is None:
            return names, ""
        snapshot_names = await self._run(self._cold_table(table).plan_files().snapshot_columns, sid)
        # The system columns are in every schema (the stored schema holds them last).
        known = set(snapshot_names)
        kept = [n for n in names if n in known]
        return kept, f" (use-snapshot-schema: the columns of snapshot {sid})"

    def _reuse_age_s(self) -> float:
        """How old a hot-tail file may be and still be named again: young enough that
        the orphan clean-up leaves it alone for a whole plan's life (with a margin)."""
        return max(
            0.0,
            self.settings.expiry.orphan_age_s / 2 - float(self.settings.cold.presign_expiry_s),
        )

    async def catalog_plan(
        self,
        tenant: str,
        namespace: str,
        name: str,
        request: PlanRequest,
        hot_refused: str | None = None,
    ) -> CatalogPlan:
        """Plan a scan of the tenant's table (see the module docstring). With
        ``hot_refused`` (one sentence: the tenant's budget of hot-tail bytes is spent), a
        hot tail is handled as one over ``plan_max_hot_records`` (``plan_hot_overflow``).

        Raises:
            TableNotFound: no such table of this tenant (or its name is not valid).
            InvalidRequest: an unknown column in ``select``, ``stats-fields`` or the filter,
                a filter the spec does not define or that does not fit its column, one of
                ``start-snapshot-id``/``end-snapshot-id`` without the other or with
                ``snapshot-id``, or a start that is not an ancestor of the end.
            SnapshotNotFound: no such ``snapshot-id`` (or incremental start or end).
            Unavailable: the hot tier no longer holds a pinned range; plan again.
        """
        table = await self._plan_table(tenant, namespace, name)
        if table.definition.primary_key is not None:
            # Its hot tail holds changes, not rows (see ScanOps.plan).
            raise Unimplemented(
                f"table {namespace}.{name} has a primary key: its current state is not "
                "planned for engines until its state table exists; scan it through the "
                "gateway"
            )
        incremental = request.start_snapshot_id is not None or request.end_snapshot_id is not None
        if incremental and (request.start_snapshot_id is None or request.end_snapshot_id is None):
            raise InvalidRequest(
                "an incremental scan needs both start-snapshot-id and end-snapshot-id "
                "(a point-in-time scan gives snapshot-id alone)"
            )
        if incremental and request.snapshot_id is not None:
            raise InvalidRequest(
                "snapshot-id (a point-in-time scan) cannot be given with start-snapshot-id "
                "and end-snapshot-id (an incremental scan): give one or the other"
            )
        if request.min_rows_requested is not None and request.min_rows_requested < 0:
            raise InvalidRequest(
                f"min-rows-requested is {request.min_rows_requested}: it must be 0 or more"
            )
        names, where = await self._plan_names(table, request)
        for column in request.select or ():
            resolve_name(column, names, request.case_sensitive, f"select{where}")
        stats = [
            resolve_name(c, names, request.case_sensitive, f"stats-fields{where}")
            for c in request.stats_fields
        ]
        expr = await self._run(self._plan_filter, table, request, names, where)
        if incremental:
            plan = await self._plan_incremental(tenant, table, request, expr, stats)
            return await self._with_access(tenant, table, plan)
        for attempt in range(_PIN_ATTEMPTS):
            try:
                plan = await self._plan_pinned(tenant, table, request, expr, stats, hot_refused)
            except Unavailable:
                # A pinned hot range was trimmed before its file was written: tiering
                # committed it meanwhile (with tiering.hot_retention_s = 0), so a new pin
                # finds it in the new snapshot.
                if attempt + 1 == _PIN_ATTEMPTS:
                    raise
                continue
            if plan.failed is not None or plan.submitted:
                return plan
            return await self._with_access(tenant, table, plan)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _with_access(self, tenant: str, table: TableView, plan: CatalogPlan) -> CatalogPlan:
        """``plan`` with how to read its files; its lease released when that fails."""
        try:
            return replace(plan, access=await self._plan_access(tenant, table))
        except BaseException:
            if plan.state.lease_id is not None:
                await self._run(self.meta.release_lease, plan.state.lease_id)
            raise

    async def _plan_pinned(
        self,
        tenant: str,
        table: TableView,
        request: PlanRequest,
        expr: Expr | None,
        stats: list[str],
        hot_refused: str | None,
    ) -> CatalogPlan:
        """One attempt of :meth:`catalog_plan`: pin, lease, name and write the files."""
        when = request.snapshot_id
        snap, ranges, earliest = await self._run(self._pin, table, when)
        rc = self.settings.cold.rest_catalog
        skipped = 0
        tail = sum(r.to_offset - r.from_offset for r in ranges)
        d = table.definition
        if tail and not rc.server_planning(tenant, d.namespace, d.name):
            # Planning is the client's for this table: what client planning reads.
            skipped, ranges, tail = tail, [], 0
        if tail > rc.plan_max_hot_records or (tail and hot_refused is not None):
            if rc.plan_hot_overflow == "refuse":
                d = table.definition
                message = hot_refused or (
                    f"the hot tail of {d.namespace}.{d.name} is {tail} records, more than "
                    f"the {rc.plan_max_hot_records} a scan plan writes as files "
                    "(cold.rest_catalog.plan_max_hot_records): plan again once tiering "
                    "has committed more of it, or plan on the client "
                    "(scan-planning-mode=client) to read the committed rows only"
                )
                state = PlanState(tenant, d.table_id, None, None, (), 0)
                return CatalogPlan(state, [], [], _NO_ACCESS, failed=message)
            skipped, ranges = tail, []
        lease = await self._run(self._lease, table, snap, "plan", when is not None)
        try:
            plan = await self._plan_leased(
                tenant,
                table,
                request,
                snap,
                tuple((r.partition, r.from_offset, r.to_offset) for r in ranges),
                _retained(expr, earliest, d.partitions),
                stats,
                lease,
            )
        except BaseException:
            if lease is not None:
                await self._run(self.meta.release_lease, lease)
            raise
        return replace(
            plan,
            skipped_hot_records=skipped,
            earliest=tuple(sorted(earliest.items())),
            column_names=tuple(table.stored_schema.names),
        )

    async def _plan_leased(
        self,
        tenant: str,
        table: TableView,
        request: PlanRequest,
        snap: ColdSnapshot | None,
        pinned: tuple[tuple[int, int, int], ...],
        cold_expr: Expr | None,
        stats: list[str],
        lease: str | None,
    ) -> CatalogPlan:
        """The files of a pinned plan whose snapshot is leased: the data files, cut at
        ``min-rows-requested`` where record counts are exact, then the hot tail written
        now, or a submitted plan when more of it is missing than
        ``plan_submit_records``."""
        rc = self.settings.cold.rest_catalog
        reuse = self._reuse_age_s()
        sid = snap.snapshot_id if snap is not None else None
        data: list[dict[str, Any]] = []
        if snap is not None:
            files = self._cold_table(table).plan_files()
            data = await self._run(files.data_files, snap, cold_expr, stats)
        wanted = request.min_rows_requested
        if wanted and cold_expr is None:
            # No filter nor retention marks: a file's record count is its rows in the
            # scan, so the files that reach the rows asked for are enough (the spec's hint).
            data, pinned = _cut(data, pinned, wanted)
        expires = int(time.time()) + int(self.settings.cold.presign_expiry_s)
        d = table.definition
        if rc.plan_submit_records and pinned:
            missing = await self._run(self._plan_missing, table, pinned, reuse)
            if sum(hi - lo for _, lo, hi in missing) > rc.plan_submit_records:
                now_ms = int(time.time() * 1000)
                state = PlanState(tenant, d.table_id, sid, lease, pinned, expires, None, now_ms)
                return CatalogPlan(state, [], [], _NO_ACCESS, submitted=True)
        _, hot = await self._run(self._plan_files, table, None, cold_expr, pinned, stats, reuse)
        state = PlanState(tenant, d.table_id, sid, lease, pinned, expires)
        written = sum(h.written_bytes for h in hot)
        # Access is filled in by catalog_plan, once the files are settled.
        return CatalogPlan(state, data, hot, _NO_ACCESS, written_bytes=written)

    async def _plan_incremental(
        self,
        tenant: str,
        table: TableView,
        request: PlanRequest,
        expr: Expr | None,
        stats: list[str],
    ) -> CatalogPlan:
        """An incremental append scan: the committed files the appends after
        ``start-snapshot-id`` up to ``end-snapshot-id`` added (no hot tail: its rows are
        in no snapshot). The end snapshot is leased for the plan's life."""
        assert request.start_snapshot_id is not None and request.end_snapshot_id is not None
        start, end = request.start_snapshot_id, request.end_snapshot_id
        cold = self._cold_table(table)
        snap = await self._run(cold.snapshot, end)
        lease = await self._run(self._lease, table, snap, "plan", True)
        try:
            data = await self._run(cold.plan_files().added_files, start, end, expr, stats)
        except BaseException:
            if lease is not None:
                await self._run(self.meta.release_lease, lease)
            raise
        expires = int(time.time()) + int(self.settings.cold.presign_expiry_s)
        state = PlanState(tenant, table.definition.table_id, end, lease, (), expires, start)
        return CatalogPlan(
            state, data, [], _NO_ACCESS, column_names=tuple(table.stored_schema.names)
        )

    def _plan_files(
        self,
        table: TableView,
        snap: ColdSnapshot | None,
        cold_expr: Expr | None,
        ranges: Sequence[tuple[int, int, int]],
        stats: Sequence[str],
        reuse_age_s: float,
    ) -> tuple[list[dict[str, Any]], list[HotFile]]:
        files = self._cold_table(table).plan_files()
        data = files.data_files(snap, cold_expr, stats) if snap is not None else []
        hot: list[HotFile] = []
        for p, lo, hi in ranges:
            rows = self._range_rows(table, p)
            hot.extend(files.hot_files(p, lo, hi, rows, stats, reuse_age_s, cold_expr))
        return data, hot

    def _range_rows(self, table: TableView, p: int) -> Any:
        """Reads offsets ``[lo, hi)`` of partition ``p`` from the hot tier, as stored."""
        names = table.stored_schema.names

        def read(lo: int, hi: int) -> Iterator[pa.RecordBatch]:
            return self._hot_rows(table, HotRange(p, lo, hi), None, names)

        return read

    def _plan_missing(
        self, table: TableView, ranges: Sequence[tuple[int, int, int]], reuse_age_s: float
    ) -> list[tuple[int, int, int]]:
        """The parts of pinned ``ranges`` no file written earlier covers (what a plan
        still has to write), as (partition, from, to)."""
        files = self._cold_table(table).plan_files()
        out = []
        for p, lo, hi in ranges:
            at = files.covered(p, lo, hi, reuse_age_s)
            if at < hi:
                out.append((p, at, hi))
        return out

    async def _plan_access(self, tenant: str, table: TableView) -> DataAccess:
        assert self.cold is not None
        location = await self._run(lambda: self._cold_table(table).location)
        return await self._run(self.cold.data_access, tenant, location)

    async def catalog_plan_page(
        self,
        tenant: str,
        namespace: str,
        name: str,
        state: PlanState,
        request: PlanRequest,
        earliest: Sequence[tuple[int, int]],
        start: int,
        count: int,
    ) -> list[dict[str, Any]]:
        """Data files ``start .. start+count`` of a plan made earlier with ``request``
        and ``earliest`` (a plan task): the pinned snapshot's files listed again, in the
        same order, as :meth:`catalog_plan` listed them.

        Raises:
            TableNotFound: the table is not the plan's.
        """
        table = await self._plan_table(tenant, namespace, name)
        if state.tenant != tenant or state.table_id != table.definition.table_id:
            raise _missing(namespace, name)
        if state.snapshot_id is None:
            return []
        names = table.stored_schema.names
        stats = [resolve_name(c, names, True, "stats-fields") for c in request.stats_fields]
        expr = await self._run(self._plan_filter, table, request)
        cold = self._cold_table(table)
        if state.start_snapshot_id is not None:
            files = await self._run(
                cold.plan_files().added_files,
                state.start_snapshot_id,
                state.snapshot_id,
                expr,
                stats,
            )
            return files[start : start + count]
        snap = await self._run(cold.snapshot, state.snapshot_id)
        retained = _retained(expr, dict(earliest), table.definition.partitions)
        files = await self._run(cold.plan_files().data_files, snap, retained, stats)
        return files[start : start + count]

    async def catalog_plan_again(
        self,
        tenant: str,
        namespace: str,
        name: str,
        state: PlanState,
        reuse_age_s: float = float("inf"),
    ) -> CatalogPlan | None:
        """The files of a plan made earlier (``fetchPlanningResult``): the same pinned view,
        its filter left to the engine. None when the plan was cancelled.

        Raises:
            TableNotFound: the table is not the plan's (another, dropped, or not the
                tenant's): the edge answers it as an unknown plan.
        """
        table = await self._plan_table(tenant, namespace, name)
        if state.tenant != tenant or state.table_id != table.definition.table_id:
            raise _missing(namespace, name)
        if not await self._lease_held(state):
            return None
        access = await self._plan_access(tenant, table)
        if state.start_snapshot_id is not None and state.snapshot_id is not None:
            added = self._cold_table(table).plan_files().added_files
            files = await self._run(added, state.start_snapshot_id, state.snapshot_id, None, ())
            return CatalogPlan(state, files, [], access)
        snap = None
        if state.snapshot_id is not None:
            snap = await self._run(self._cold_table(table).snapshot, state.snapshot_id)
        data, hot = await self._run(
            self._plan_files, table, snap, None, state.ranges, (), reuse_age_s
        )
        written = sum(h.written_bytes for h in hot)
        return CatalogPlan(state, data, hot, access, written_bytes=written)

    async def _lease_held(self, state: PlanState) -> bool:
        """Whether the plan's snapshot lease is still held (not cancelled, not expired)."""
        if state.lease_id is None:
            return True
        leases = await self._run(self.meta.leases, state.table_id)
        return any(lease.lease_id == state.lease_id for lease in leases)

    async def catalog_plan_cancel(
        self, tenant: str, namespace: str, name: str, state: PlanState
    ) -> None:
        """Release a plan's snapshot lease (``cancelPlanning``); its files stay for the
        orphan clean-up.

        Raises:
            TableNotFound: the table is not the plan's.
        """
        table = await self._plan_table(tenant, namespace, name)
        if state.tenant != tenant or state.table_id != table.definition.table_id:
            raise _missing(namespace, name)
        if state.lease_id is not None:
            await self._run(self.meta.release_lease, state.lease_id)

    async def catalog_plan_table(self, tenant: str, namespace: str, name: str) -> str:
        """The id of the tenant's table (what a plan id is bound to).

        Raises:
            TableNotFound: no such table of this tenant.
        """
        return (await self._plan_table(tenant, namespace, name)).definition.table_id


_NO_ACCESS = DataAccess()


def _cut(
    data: list[dict[str, Any]], ranges: tuple[tuple[int, int, int], ...], wanted: int
) -> tuple[list[dict[str, Any]], tuple[tuple[int, int, int], ...]]:
    """The first data files, then the first hot ranges (the last one shortened), that
    hold ``wanted`` rows when each file's rows are all in the scan."""
    rows = 0
    for i, f in enumerate(data):
        if rows >= wanted:
            return data[:i], ()
        rows += int(f["record-count"])
    if rows >= wanted:
        return data, ()
    out = []
    for p, lo, hi in ranges:
        if rows >= wanted:
            break
        take = min(hi - lo, wanted - rows)
        out.append((p, lo, lo + take))
        rows += take
    return data, tuple(out)
