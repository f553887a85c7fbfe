"""Server-side scan planning of the Iceberg REST catalog: ``planTableScan``
(``POST .../tables/{table}/plan``), ``fetchPlanningResult`` (``GET .../plan/{plan-id}``),
``cancelPlanning`` (``DELETE .../plan/{plan-id}``) and ``fetchScanTasks``
(``POST .../tables/{table}/tasks``).

A plan is the pinned view of the gateway's own scan (``gateway/core/catalog_plans.py``):
the snapshot's data files plus the hot tail as Parquet files, so an engine that plans on
the server reads every acknowledged row. Plans complete within the request (status
``completed``) unless they have more hot records to write than
``cold.rest_catalog.plan_submit_records`` (off by default): those answer ``submitted`` and
this replica writes their files in the background; ``fetchPlanningResult`` answers
``completed`` once files cover every pinned range, on any replica (docs/decisions/
rest-catalog.md, "Submitted plans"). A completed answer names the hot files and the first
``cold.rest_catalog.plan_page_files`` data files, and the rest come as plan tasks (pages
of as many) for ``fetchScanTasks``.

A plan id is the plan's state sealed (AES-GCM under a key derived from the operator key,
its own purpose): unguessable, the same on every replica, and bound to the tenant and the
table (by id: a table dropped and made again under the name is another table). A forged
id, one of another table or tenant, or an expired one answers 404
``NoSuchPlanIdException`` exactly as an unknown one. A plan task is sealed the same way
(another purpose: a plan id is no plan task) with the plan's filter and its page, so any
replica lists the pinned snapshot's files again and answers the page; a forged or foreign
one answers 404 ``NoSuchPlanTaskException``.
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' parameter types.
import asyncio
import base64
import json
import logging
import os
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from gateway import metrics
from gateway.core.catalog_filters import resolve_name
from gateway.core.catalog_plans import CatalogPlan, PlanRequest, PlanState
from gateway.server.calls import DataCalls
from gateway.server.http.bodies import body_model
from gateway.server.http.iceberg_errors import SEPARATOR, iceberg_error
from gateway.tenancy import Tenancy
from gateway.wire.errors import TableNotFound, Unavailable

__all__ = ["PLAN_ENDPOINTS", "SCAN_PLANNING_MODE", "PlanIds", "add_plan_routes"]

PLAN_ENDPOINTS = [
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/plan",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}/plan/{plan-id}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}/plan/{plan-id}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/tasks",
]
_log = logging.getLogger(__name__)

#: The table config key telling an engine to plan its scans on the server.
SCAN_PLANNING_MODE = "scan-planning-mode"
#: Largest plan request body: a filter of up to server.max_filter_chars, as JSON.
_PLAN_BODY = 1024 * 1024
_PLAN_ID_PREFIX = "tgplan."
#: Longest plan id opened (a plan of many partitions' hot ranges is longer).
_MAX_PLAN_ID = 16 * 1024


class PlanTableScanBody(BaseModel):
    """The spec's ``PlanTableScanRequest``."""

    model_config = ConfigDict(populate_by_name=True)

    snapshot_id: int | None = Field(None, alias="snapshot-id")
    select: list[str] | None = None
    filter: Any = None
    min_rows_requested: int | None = Field(None, alias="min-rows-requested")
    case_sensitive: bool = Field(True, alias="case-sensitive")
    use_snapshot_schema: bool = Field(False, alias="use-snapshot-schema")
    start_snapshot_id: int | None = Field(None, alias="start-snapshot-id")
    end_snapshot_id: int | None = Field(None, alias="end-snapshot-id")
    stats_fields: list[str] | None = Field(None, alias="stats-fields")


class FetchScanTasksBody(BaseModel):
    """The spec's ``FetchScanTasksRequest``."""

    plan_task: str = Field(alias="plan-task")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class PlanIds:
    """Plan states sealed into plan ids and opened again."""

    def __init__(self, seal_key: bytes, clock: Callable[[], float] = time.time) -> None:
        self._aead = AESGCM(seal_key)
        self._clock = clock

    def seal(self, state: PlanState, task: Any = None) -> str:
        """A plan id for ``state`` or, with ``task`` (JSON), a plan task of that plan."""
        doc = [
            state.tenant,
            state.table_id,
            # An incremental plan: [start, end] in the place of the snapshot.
            state.snapshot_id
            if state.start_snapshot_id is None
            else [state.start_snapshot_id, state.snapshot_id],
            state.lease_id,
            [x for r in state.ranges for x in r],
            # A submitted plan: [expiry, submitted at (Unix ms)].
            state.expires_at
            if state.submitted_at is None
            else [state.expires_at, state.submitted_at],
        ]
        purpose = b"plan v1" if task is None else b"plan task v1"
        if task is not None:
            doc.append(task)
        plain = zlib.compress(json.dumps(doc, separators=(",", ":")).encode())
        nonce = os.urandom(12)
        return _PLAN_ID_PREFIX + _b64(nonce + self._aead.encrypt(nonce, plain, purpose))

    def open(self, text: str) -> PlanState | None:
        """The state sealed in plan id ``text``; None when forged, altered or expired."""
        opened = self._open(text, b"plan v1")
        return opened[0] if opened is not None else None

    def open_task(self, text: str) -> tuple[PlanState, Any] | None:
        """The plan state and task sealed in plan task ``text``; None when forged,
        altered or expired (a plan id is not a plan task, nor the reverse)."""
        return self._open(text, b"plan task v1")

    def _open(self, text: str, purpose: bytes) -> tuple[PlanState, Any] | None:
        if not text.startswith(_PLAN_ID_PREFIX) or len(text) > _MAX_PLAN_ID:
            return None
        body = text.removeprefix(_PLAN_ID_PREFIX)
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            plain = self._aead.decrypt(raw[:12], raw[12:], purpose)
            tenant, table_id, snap, lease, flat, expires, *task = json.loads(
                zlib.decompress(plain, bufsize=_MAX_PLAN_ID)
            )
        except (ValueError, InvalidTag, zlib.error, TypeError):
            return None
        submitted = None
        if isinstance(expires, list):
            expires, submitted = expires
        if expires <= self._clock():
            return None
        ranges = tuple(tuple(flat[i : i + 3]) for i in range(0, len(flat), 3))
        start = None
        if isinstance(snap, list):
            start, snap = snap
        state = PlanState(tenant, table_id, snap, lease, ranges, int(expires), start, submitted)
        return state, (task[0] if task else None)


def planning_config(calls: DataCalls, table: tuple[str, str, str] | None = None) -> dict[str, str]:
    """What the catalog's ``defaults`` (``GET /v1/config``) say of scan planning, and a
    table's ``config`` when it has one (``table``: tenant, namespace, name):
    ``scan-planning-mode: server``, or ``client`` for a table of
    ``cold.rest_catalog.client_planning_tables``. pyiceberg 0.12 reads the mode from its
    catalog properties only (the defaults, which a client's own ``scan-planning-mode``
    overrides); Iceberg Java from either. A table's config is left without it when it is
    otherwise empty (a local warehouse): DuckDB's extension (1.4) takes a non-empty table
    config for S3 credentials and fails without a region."""
    rc = calls.service.settings.cold.rest_catalog
    if not rc.scan_planning:
        return {}
    if table is not None and not rc.server_planning(*table):
        return {SCAN_PLANNING_MODE: "client"}
    return {SCAN_PLANNING_MODE: "server"}


def plan_endpoints(calls: DataCalls) -> list[str]:
    """The planning routes ``GET /v1/config`` lists (none when planning is off)."""
    return PLAN_ENDPOINTS if calls.service.settings.cold.rest_catalog.scan_planning else []


def _no_plan() -> JSONResponse:
    return iceberg_error(
        404,
        "no such plan-id for this table (it is unknown, expired, or another table's)",
        "NoSuchPlanIdException",
    )


def _no_task() -> JSONResponse:
    return iceberg_error(
        404,
        "no such plan-task for this table (it is unknown, expired, or another table's)",
        "NoSuchPlanTaskException",
    )


def _failed(message: str) -> JSONResponse:
    """The spec's ``FailedPlanningResult``: a 200 answer that carries the error."""
    metrics.record_catalog_plan("failed", 0)
    error = {"message": message, "type": "ServiceUnavailableException", "code": 503}
    return JSONResponse({"status": "failed", "error": error})


def _completed(
    plan: CatalogPlan, plan_id: str | None, tasks: list[str] | None = None, page: int = 0
) -> dict[str, Any]:
    """The spec's completed planning result; with ``page``, only the first ``page`` data
    files (the rest are in the plan ``tasks``)."""
    data = plan.data_files[:page] if page else plan.data_files
    files = [*(h.content_file for h in plan.hot_files), *data]
    out: dict[str, Any] = {"status": "completed"}
    if plan_id is not None:
        out["plan-id"] = plan_id
    out["file-scan-tasks"] = [{"data-file": f} for f in files]
    if tasks:
        out["plan-tasks"] = tasks
    access = plan.access
    if access.credentials:
        out["storage-credentials"] = [
            {"prefix": access.prefix, "config": {**access.config, **access.credentials}}
        ]
    return out


class Planner:
    """What the planning routes share: the service, the tenancy (budgets and metering) and
    the seal of plan ids and plan tasks."""

    def __init__(self, tenancy: Tenancy, calls: DataCalls) -> None:
        self.tenancy = tenancy
        self.service = calls.service
        self.ids = PlanIds(tenancy.auth.derive_secret("iceberg-scan-plan"))
        #: Submitted plans whose files this replica is writing (held so that they are
        #: not collected; nothing answers from them: the files are the state).
        self.writing: set[asyncio.Task[None]] = set()

    @staticmethod
    def one_part(namespace: str, table: str) -> str:
        if SEPARATOR in namespace:
            raise TableNotFound(f"table {namespace[:200]!r}.{table[:200]!r} does not exist")
        return namespace

    async def own_plan(self, tenant: str, ns: str, table: str, plan_id: str) -> PlanState | None:
        """The state of ``plan_id`` when it is a live plan of this tenant's table (which
        must exist: TableNotFound otherwise); None for any other id."""
        table_id = await self.service.catalog_plan_table(tenant, ns, table)
        state = self.ids.open(plan_id)
        if state is None or state.tenant != tenant or state.table_id != table_id:
            return None
        return state

    async def hot_refused(self, tenant: str) -> str | None:
        """Why a plan of ``tenant`` may not write hot-tail files now (its budget of bytes
        written by plans is spent), or None."""
        rate = self.service.settings.cold.rest_catalog.plan_hot_bytes_per_s
        if rate and not await self.tenancy.guard.plan_hot_allowed(tenant, rate):
            return (
                f"the tenant's budget of hot-tail bytes written by scan plans ({rate}/s, "
                "cold.rest_catalog.plan_hot_bytes_per_s) is spent: plan again in a moment, "
                "or plan on the client (scan-planning-mode=client) to read the committed "
                "rows only"
            )
        return None

    async def charge(self, tenant: str, plan: CatalogPlan) -> None:
        """The hot rows ``plan`` materialised are a read of the tenant's (metered, and
        charged to its read quota) and spend its budget of hot-tail bytes."""
        if not plan.written_bytes:
            return
        records = sum(
            int(h.content_file["record-count"]) for h in plan.hot_files if h.written_bytes
        )
        await self.tenancy.record_read(tenant, records, plan.written_bytes)
        rate = self.service.settings.cold.rest_catalog.plan_hot_bytes_per_s
        if rate:
            await self.tenancy.guard.charge_plan_hot(tenant, plan.written_bytes, rate)

    async def plan(self, tenant: str, ns: str, table: str, body: PlanTableScanBody) -> JSONResponse:
        plan = await self.service.catalog_plan(
            tenant,
            ns,
            table,
            PlanRequest(
                select=tuple(body.select) if body.select is not None else None,
                filter=body.filter,
                snapshot_id=body.snapshot_id,
                case_sensitive=body.case_sensitive,
                use_snapshot_schema=body.use_snapshot_schema,
                stats_fields=tuple(body.stats_fields or ()),
                start_snapshot_id=body.start_snapshot_id,
                end_snapshot_id=body.end_snapshot_id,
                min_rows_requested=body.min_rows_requested,
            ),
            await self.hot_refused(tenant),
        )
        if plan.failed is not None:
            return _failed(plan.failed)
        if plan.submitted:
            metrics.record_catalog_plan("submitted", 0)
            plan_id = self.ids.seal(plan.state)
            task = asyncio.create_task(self.write_submitted(tenant, ns, table, plan.state))
            self.writing.add(task)
            task.add_done_callback(self.writing.discard)
            return JSONResponse({"status": "submitted", "plan-id": plan_id})
        outcome = "committed_only" if plan.skipped_hot_records else "completed"
        metrics.record_catalog_plan(outcome, plan.written_bytes)
        await self.charge(tenant, plan)
        metrics.record_catalog_access(bool(plan.access.credentials))
        asked = {
            "filter": body.filter,
            "case-sensitive": body.case_sensitive,
            # Resolved against the table already: a page asks for them as they are.
            "stats": [
                resolve_name(c, plan.column_names, body.case_sensitive, "stats-fields")
                for c in body.stats_fields or ()
            ],
            "earliest": [x for pe in plan.earliest for x in pe],
        }
        return JSONResponse(self.paged(plan, asked, self.ids.seal(plan.state)))

    async def write_submitted(self, tenant: str, ns: str, table: str, state: PlanState) -> None:
        """Write the hot-tail files of a submitted plan (a background task of the
        replica that took it); charged to the tenant as a plan's files are."""
        try:
            plan = await self.service.catalog_plan_write(tenant, ns, table, state)
        except (TableNotFound, Unavailable) as exc:
            # Dropped, or trimmed before it was written: fetchPlanningResult says so.
            _log.info("submitted scan plan of %s.%s not written: %s", ns, table, exc)
            return
        except Exception:
            _log.exception("submitted scan plan of %s.%s not written", ns, table)
            return
        if plan is None:
            return  # cancelled meanwhile
        metrics.record_catalog_plan("completed", plan.written_bytes)
        await self.charge(tenant, plan)

    def paged(
        self, plan: CatalogPlan, asked: dict[str, Any], plan_id: str | None
    ) -> dict[str, Any]:
        """The completed answer of ``plan``: its first page of data files, and a plan
        task per further page (``asked``: how the plan listed its data files)."""
        size = self.service.settings.cold.rest_catalog.plan_page_files
        tasks: list[str] = []
        for start in range(size, len(plan.data_files), size):
            tasks.append(self.ids.seal(plan.state, {**asked, "start": start, "count": size}))
        if any(len(t) > _MAX_PLAN_ID for t in tasks):
            tasks = []  # a filter too large to carry: every file in this answer
        return _completed(plan, plan_id, tasks, size if tasks else 0)

    async def result(self, tenant: str, ns: str, table: str, plan_id: str) -> JSONResponse:
        state = await self.own_plan(tenant, ns, table, plan_id)
        if state is None:
            return _no_plan()
        try:
            plan = await self.service.catalog_plan_result(tenant, ns, table, state)
        except TableNotFound:
            return _no_plan()
        if plan is None:
            return JSONResponse({"status": "cancelled"})
        if plan.submitted:
            return JSONResponse({"status": "submitted"})
        if plan.failed is not None:
            return _failed(plan.failed)
        if plan.written_bytes:
            # A submitted plan whose files this replica wrote (taken over past the grace).
            metrics.record_catalog_plan("completed", plan.written_bytes)
            await self.charge(tenant, plan)
        # Listed again without the filter (the engine applies it) nor retention marks.
        asked: dict[str, Any] = {
            "filter": None,
            "case-sensitive": True,
            "stats": [],
            "earliest": [],
        }
        return JSONResponse(self.paged(plan, asked, None))

    async def cancel(self, tenant: str, ns: str, table: str, plan_id: str) -> Response:
        state = await self.own_plan(tenant, ns, table, plan_id)
        if state is None:
            return _no_plan()
        try:
            await self.service.catalog_plan_cancel(tenant, ns, table, state)
        except TableNotFound:
            return _no_plan()
        return Response(status_code=204)

    async def scan_tasks(
        self, tenant: str, ns: str, table: str, table_id: str, plan_task: str
    ) -> JSONResponse:
        """The page of data files ``plan_task`` names, when it is a task of this tenant's
        table ``table_id``."""
        opened = self.ids.open_task(plan_task)
        if opened is None or opened[0].tenant != tenant or opened[0].table_id != table_id:
            return _no_task()
        state, task = opened
        flat = task["earliest"]
        try:
            files = await self.service.catalog_plan_page(
                tenant,
                ns,
                table,
                state,
                PlanRequest(
                    filter=task["filter"],
                    case_sensitive=task["case-sensitive"],
                    stats_fields=tuple(task["stats"]),
                ),
                [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)],
                task["start"],
                task["count"],
            )
        except TableNotFound:
            return _no_task()
        return JSONResponse({"file-scan-tasks": [{"data-file": f} for f in files]})


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"content": {"application/json": {"schema": model.model_json_schema()}}}}


def add_plan_routes(
    router: APIRouter,
    tenancy: Tenancy,
    calls: DataCalls,
    caller: Callable[..., AsyncIterator[str]],
) -> None:
    """Add the planning routes to the catalog's ``router`` (``caller``: its dependency
    that authenticates the caller and yields the tenant)."""
    if not calls.service.settings.cold.rest_catalog.scan_planning:
        return
    planner = Planner(tenancy, calls)
    Tenant = Annotated[str, Depends(caller)]

    @router.post(
        "/namespaces/{namespace}/tables/{table}/plan",
        summary="Plan a scan on the server: the committed files and the hot tail as files.",
        openapi_extra=_body_schema(PlanTableScanBody),
    )
    async def plan_table_scan(
        request: Request, namespace: str, table: str, tenant: Tenant
    ) -> JSONResponse:
        """Every row of the table at this moment (the current snapshot's data files and,
        per partition, the records above its tiered watermark as Parquet files), or of
        ``snapshot-id``'s files only. The filter prunes files on both tiers; an engine
        still applies it to the rows it reads."""
        ns = planner.one_part(namespace, table)
        body = await body_model(request, PlanTableScanBody, _PLAN_BODY)
        return await planner.plan(tenant, ns, table, body)

    @router.get(
        "/namespaces/{namespace}/tables/{table}/plan/{plan_id}",
        summary="The result of a scan plan: 'completed' with its files, 'submitted' while "
        "its hot-tail files are being written, 'cancelled' or 'failed'.",
    )
    async def fetch_planning_result(
        namespace: str, table: str, plan_id: str, tenant: Tenant
    ) -> JSONResponse:
        return await planner.result(tenant, planner.one_part(namespace, table), table, plan_id)

    @router.delete(
        "/namespaces/{namespace}/tables/{table}/plan/{plan_id}",
        status_code=204,
        summary="Cancel a scan plan: its snapshot is no longer held for it.",
    )
    async def cancel_planning(namespace: str, table: str, plan_id: str, tenant: Tenant) -> Response:
        return await planner.cancel(tenant, planner.one_part(namespace, table), table, plan_id)

    @router.post(
        "/namespaces/{namespace}/tables/{table}/tasks",
        summary="The scan tasks of a plan task: a page of a large plan's data files.",
        openapi_extra=_body_schema(FetchScanTasksBody),
    )
    async def fetch_scan_tasks(
        request: Request, namespace: str, table: str, tenant: Tenant
    ) -> JSONResponse:
        ns = planner.one_part(namespace, table)
        table_id = await planner.service.catalog_plan_table(tenant, ns, table)
        body = await body_model(request, FetchScanTasksBody, _PLAN_BODY)
        return await planner.scan_tasks(tenant, ns, table, table_id, body.plan_task)
