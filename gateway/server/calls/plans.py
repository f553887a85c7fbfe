"""Plan calls: a read plan whose local data files are given as sealed links through this
gateway, and the file such a link names."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path
from typing import Any

from gateway.core import ReadPlan
from gateway.server.calls.base import CallsBase
from gateway.tenancy import Tenancy

__all__ = ["PlanCalls"]


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

    def warehouse_file(self, token: str) -> tuple[str, Path] | None:
        """(tenant, file) of a link made by :meth:`plan`; None when the link is not one
        of ours, was altered, has expired, or names no file of the warehouse."""
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
        return tenant, path
