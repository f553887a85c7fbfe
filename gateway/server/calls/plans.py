"""Plan calls: a read plan whose local data files are given as sealed links through this
gateway, and the file such a link names, served as the tenant's read (metered and charged
to its read bucket; docs/decisions/client.md, "Reads through file links are metered")."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from gateway import metrics
from gateway.core import ReadPlan
from gateway.server.calls.base import CallsBase
from gateway.tenancy import Tenancy

__all__ = ["LinkedFile", "PlanCalls"]


@dataclass(frozen=True)
class LinkedFile:
    """The warehouse file a plan's link names, and whose read it is."""

    tenant: str
    path: Path
    #: The file's rows, metered when its footer (its last byte) is served; None: a link
    #: sealed without them (by an older gateway), read from the footer when served.
    records: int | None


class PlanCalls(CallsBase):
    """Read plans and the warehouse files their links name."""

    async def plan(
        self,
        tenant: str,
        namespace: str,
        name: str,
        *,
        row_filter: str | None,
        as_of: Any,
        files_url: str | None = None,
    ) -> ReadPlan:
        """A read plan. The data files of a local warehouse are given as links through
        this gateway (``<files_url>/v1/files/<token>``, sealed for the tenant and the file
        until ``cold.presign_expiry_s``) rather than as the server's paths, when the
        gateway serves them (a :class:`Tenancy`) and ``files_url`` (its HTTP address as
        the caller reaches it) is known."""
        await self.gate.check_read(tenant)
        plan = await self.service.plan(tenant, namespace, name, row_filter=row_filter, as_of=as_of)
        root = self._warehouse_folder()
        if files_url is None or root is None or not isinstance(self.gate, Tenancy):
            return plan
        tokens = self.gate.file_tokens
        files = []
        for f in plan.files:
            path = Path(f.url.removeprefix("file://"))
            if f.url.startswith(("http://", "https://")) or not path.is_relative_to(root):
                files.append(f)
                continue
            inside = str(path.relative_to(root))
            token, expires = tokens.issue(tenant, inside, f.file.record_count)
            when = dt.datetime.fromtimestamp(expires, dt.UTC)
            link = f"{files_url.rstrip('/')}/v1/files/{token}"
            files.append(replace(f, url=link, expires_at=when, warehouse_path=inside))
        return replace(plan, files=files)

    def _warehouse_folder(self) -> Path | None:
        """The local warehouse's folder, or None for object storage."""
        warehouse = self.service.settings.cold_warehouse
        if not warehouse.startswith("file://"):
            return None
        return Path(warehouse.removeprefix("file://")).resolve()

    async def linked_file(self, token: str) -> LinkedFile | None:
        """The file a link made by :meth:`plan` names; None when the link is not one of
        ours, was altered, has expired, or names no file of the warehouse.

        Raises:
            Throttled: the tenant's read bucket is in debt.
        """
        root = self._warehouse_folder()
        if root is None or not isinstance(self.gate, Tenancy):
            return None
        opened = self.gate.file_tokens.open(token)
        if opened is None:
            return None
        tenant, relative, records = opened
        path = (root / relative).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            return None
        await self.gate.check_read(tenant)
        return LinkedFile(tenant, path, records)

    async def file_read(self, linked: LinkedFile, *, footer: bool, nbytes: int) -> None:
        """Meter ``nbytes`` of ``linked`` served as its tenant's read, charged to its read
        bucket, with the file's rows when the range served held its footer: every Parquet
        reader reads a file's footer (its last bytes) once per opening, so the rows count
        once per reading of the file, as a server-side read of them would."""
        records = 0
        if footer:
            if linked.records is not None:
                records = linked.records
            else:
                records = await self.service.offload(_footer_rows, linked.path)
        metrics.record_file_read(records, nbytes)
        await self.gate.record_read(linked.tenant, records, nbytes)


def _footer_rows(path: Path) -> int:
    try:
        return int(pq.read_metadata(path).num_rows)
    except (OSError, ValueError):
        return 0
