"""Consumer groups: committed offsets per group, table and partition."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.core.base import CoreBase
from gateway.core.names import INT64_MAX, check_group
from gateway.wire.errors import InvalidRequest

__all__ = ["GroupOps"]


class GroupOps(CoreBase):
    async def commit_offsets(
        self, tenant: str, group: str, namespace: str, name: str, offsets: dict[int, int]
    ) -> None:
        """Store a group's committed offsets (partition -> next offset to consume).

        Raises:
            TableNotFound, InvalidPartition, InvalidRequest: a bad group name or a
            negative offset.
        """
        check_group(group)
        table = await self.table(tenant, namespace, name)
        for p, off in offsets.items():
            self._part(table, p)
            if isinstance(off, bool) or not isinstance(off, int) or not 0 <= off <= INT64_MAX:
                raise InvalidRequest(
                    f"offset {off!r:.40} of partition {p} must be from 0 to {INT64_MAX}",
                    partition=p,
                )
        await self._run(
            self.meta.commit_offsets, tenant, group, table.definition.table_id, dict(offsets)
        )

    async def fetch_offsets(
        self,
        tenant: str,
        group: str,
        namespace: str,
        name: str,
        partitions: Sequence[int] | None = None,
    ) -> dict[int, int]:
        """A group's committed offsets; partitions without a commit are absent.

        Raises:
            TableNotFound, InvalidPartition, InvalidRequest: a bad group name.
        """
        check_group(group)
        table = await self.table(tenant, namespace, name)
        wanted = set(self._partitions(table, partitions))
        got = await self._run(self.meta.fetch_offsets, tenant, group, table.definition.table_id)
        return {p: o for p, o in sorted(got.items()) if p in wanted}

    async def list_groups(
        self, tenant: str, namespace: str | None = None, name: str | None = None
    ) -> list[tuple[str, str, str]]:
        """``(group, namespace, table)`` for every group with committed offsets, of one
        table when ``namespace`` and ``name`` are given.

        Raises:
            TableNotFound: the table named does not exist.
        """
        table_id = None
        if namespace or name:
            table_id = (await self.table(tenant, namespace or "", name or "")).definition.table_id
        found = await self._run(self.meta.list_groups, tenant, table_id)
        names = {
            d.table_id: (d.namespace, d.name)
            for d in await self._run(self.meta.list_tables, tenant, None)
        }
        return sorted((group, *names[tid]) for group, tid in found if tid in names)
