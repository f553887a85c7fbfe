"""Submitted scan plans of the Iceberg REST catalog (docs/decisions/rest-catalog.md,
"Submitted plans"): a plan with more hot records to write than
``cold.rest_catalog.plan_submit_records`` answers ``submitted``; the replica that took it
writes its hot-tail files in the background (:meth:`SubmittedPlanOps.catalog_plan_write`)
and ``fetchPlanningResult`` (:meth:`SubmittedPlanOps.catalog_plan_result`) answers it
``completed`` once files cover every pinned range. A file is named by its range, so that
is a fact any replica reads from the warehouse: no state per plan on the gateway. Past
``plan_submit_grace_s`` the replica asked writes what is missing itself; a range the hot
tier trimmed before it was written makes the plan ``failed``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gateway.core.catalog import _missing
from gateway.core.catalog_plans import _NO_ACCESS, CatalogPlan, CatalogPlanOps, PlanState
from gateway.hot import PartitionId
from gateway.wire.errors import Unavailable

if TYPE_CHECKING:
    from gateway.cold.plans import HotFile
    from gateway.core.views import TableView

__all__ = ["SubmittedPlanOps"]

#: Why a submitted plan failed: what it pinned is in the lake now, not in its files.
_TRIMMED = (
    "plan again: tiering committed part of this plan's hot tail before it was written as files"
)


class SubmittedPlanOps(CatalogPlanOps):
    async def catalog_plan_write(
        self, tenant: str, namespace: str, name: str, state: PlanState
    ) -> CatalogPlan | None:
        """Write the hot-tail files of submitted plan ``state`` that are not there yet,
        one pinned range after another, looking for the plan's lease before each: None
        when the plan was cancelled meanwhile (what is written stays for the clean-up).

        Raises:
            TableNotFound: the table is not the plan's any more.
            Unavailable: the hot tier trimmed a pinned range before its file was written.
        """
        table = await self._plan_table(tenant, namespace, name)
        if state.tenant != tenant or state.table_id != table.definition.table_id:
            raise _missing(namespace, name)
        files = self._cold_table(table).plan_files()
        reuse = self._reuse_age_s()
        hot: list[HotFile] = []
        for p, lo, hi in state.ranges:
            if not await self._lease_held(state):
                return None
            rows = self._range_rows(table, p)
            hot.extend(await self._run(files.hot_files, p, lo, hi, rows, (), reuse, None))
        written = sum(h.written_bytes for h in hot)
        return CatalogPlan(state, [], hot, _NO_ACCESS, written_bytes=written)

    async def catalog_plan_result(
        self, tenant: str, namespace: str, name: str, state: PlanState
    ) -> CatalogPlan | None:
        """``fetchPlanningResult``: None when the plan was cancelled; a plan that
        completed within its request, its files again (:meth:`catalog_plan_again`). A
        submitted plan is completed when files cover every pinned range (written by any
        replica); while they do not, it is still submitted for
        ``cold.rest_catalog.plan_submit_grace_s`` after its submission, and past that
        the missing ranges are written here (the replica that took the plan died or was
        restarted). It failed when the hot tier trimmed a range not written yet.

        Raises:
            TableNotFound: the table is not the plan's.
        """
        if state.submitted_at is None:
            return await self.catalog_plan_again(tenant, namespace, name, state)
        table = await self._plan_table(tenant, namespace, name)
        if state.tenant != tenant or state.table_id != table.definition.table_id:
            raise _missing(namespace, name)
        if not await self._lease_held(state):
            return None
        reuse = self._reuse_age_s()
        missing = await self._run(self._plan_missing, table, state.ranges, reuse)
        if missing:
            if await self._run(self._trimmed, table, missing):
                return CatalogPlan(state, [], [], _NO_ACCESS, failed=_TRIMMED)
            grace_ms = self.settings.cold.rest_catalog.plan_submit_grace_s * 1000
            if time.time() * 1000 < state.submitted_at + grace_ms:
                return CatalogPlan(state, [], [], _NO_ACCESS, submitted=True)
        try:
            return await self.catalog_plan_again(tenant, namespace, name, state, reuse)
        except Unavailable:
            return CatalogPlan(state, [], [], _NO_ACCESS, failed=_TRIMMED)

    def _trimmed(self, table: TableView, missing: Sequence[tuple[int, int, int]]) -> bool:
        """Whether the hot tier no longer holds the start of a range still to write."""
        d = table.definition
        for p, lo, _ in missing:
            if self.hot.offsets(PartitionId(d.tenant, d.table_id, p)).low > lo:
                return True
        return False
