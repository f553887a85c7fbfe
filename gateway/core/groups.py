"""Consumer groups: committed offsets per group, table and partition."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.core.base import CoreBase
from gateway.core.names import INT64_MAX, check_group
from gateway.wire.errors import InvalidRequest, OffsetOutOfRange

__all__ = ["GroupOps"]


class GroupOps(CoreBase):
    async def commit_offsets(
        self, tenant: str, group: str, namespace: str, name: str, offsets: dict[int, int]
    ) -> None:
        """Store a group's committed offsets (partition -> next offset to consume).

        Raises:
            TableNotFound, InvalidPartition, InvalidRequest: a bad group name or a
            negative offset.
            OffsetOutOfRange: an offset past the partition's high watermark (a group
            commits the next offset to consume, at most the high watermark: a commit
            past it would leave the group failing on every read until reset).
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
        table_id = table.definition.table_id

        def commit() -> None:
            cached = {v.partition: v for v in self.meta.partitions(table_id)}
            for p, off in sorted(offsets.items()):
                hot = self.hot.offsets(self._part(table, p))
                known = cached.get(p)
                high = max(hot.high, known.tiered_watermark if known is not None else 0)
                if off > high:
                    raise OffsetOutOfRange(
                        f"offset {off} of partition {p} is past its end: a group commits "
                        f"the next offset to consume, at most the high watermark {high}",
                        offset=off,
                        earliest=known.earliest_offset if known is not None else 0,
                        latest=high,
                    )
            self.meta.commit_offsets(tenant, group, table_id, dict(offsets))

        await self._run(commit)

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
