"""Table calls: a table created under the tenant's table limits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.core import TableView
from gateway.server.calls.base import CallsBase

__all__ = ["TableCalls"]


class TableCalls(CallsBase):
    """Creating tables, within the tenant's limits."""

    async def create_table(
        self,
        tenant: str,
        namespace: str,
        name: str,
        fields: Any,
        partitions: int,
        key_columns: Sequence[str] = (),
        *,
        retention_ms: int | None = None,
        retention_records: int | None = None,
        primary_key: Sequence[str] = (),
        merge_engine: Any = None,
    ) -> TableView:
        return await self.service.create_table(
            tenant,
            namespace,
            name,
            fields,
            partitions,
            key_columns,
            retention_ms=retention_ms,
            retention_records=retention_records,
            limits=await self.gate.table_limits(tenant),
            primary_key=primary_key,
            merge_engine=merge_engine,
        )
