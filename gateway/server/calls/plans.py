"""Plan calls: a read plan whose local data files are given as sealed links through this
gateway, and the file such a link names, served as the tenant's read (metered and charged
to its read bucket; docs/decisions/client.md, "Reads through file links are metered")."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gateway import metrics
from gateway.core import ReadPlan
from gateway.server.calls.base import CallsBase
from gateway.server.calls.links import LinkRows, served_ranges
from gateway.tenancy import Tenancy

__all__ = ["LinkedFile", "PlanCalls"]


@dataclass(frozen=True)
class LinkedFile:
    """The warehouse file a plan's link names, and whose read it is."""

    tenant: str
    path: Path
    #: The link's token (what counts a row group once per link).
    token: str


class PlanCalls(CallsBase):
    """Read plans and the warehouse files their links name."""

    #: The row groups each link has served (see :mod:`.links`).
    link_rows: LinkRows | None = None

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
            token, expires = tokens.issue(tenant, inside)
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
        tenant, relative = opened
        path = (root / relative).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            return None
        await self.gate.check_read(tenant)
        return LinkedFile(tenant, path, token)

    async def file_read(
        self, linked: LinkedFile, *, status: int, range_header: str | None, nbytes: int
    ) -> None:
        """Meter ``nbytes`` of ``linked`` sent (an answer of ``status`` to
        ``range_header``) as its tenant's read, charged to its read bucket, with the rows
        of the row groups whose column chunks they held, each once per link (a footer
        read or a probe holds none; see :mod:`.links`)."""
        if self.link_rows is None:
            self.link_rows = LinkRows()
        counter = self.link_rows

        def rows() -> int:
            spans = counter.spans(linked.path)
            size = linked.path.stat().st_size
            ranges = served_ranges(status, range_header, size)
            assert isinstance(self.gate, Tenancy)
            expires = time.time() + self.gate.file_tokens.ttl_s
            return counter.count(linked.token, expires, spans, ranges)

        try:
            records = await self.service.offload(rows)
        except (OSError, ValueError):  # not a Parquet file: its bytes are still charged
            records = 0
        metrics.record_file_read(records, nbytes)
        await self.gate.record_read(linked.tenant, records, nbytes)
