"""Consumer groups in the metadata store: the offsets a group commits per table and
partition, and its membership on a table (generation and live members, one row locked by
every change), so that every gateway replica coordinates a group through the same rows.

The store only keeps the state and runs the coordinator's decisions inside one
transaction (:meth:`GroupOps.update_group`, and :meth:`GroupOps.commit_offsets` with a
``check``): what a heartbeat or a commit does to a group is decided by
:mod:`gateway.core.coordinator`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway.meta.base import MetaBase
from gateway.meta.models import GroupOffset, GroupRecord, utcnow
from gateway.meta.records import GroupState

__all__ = ["GroupOps"]

T = TypeVar("T")
E = TypeVar("E")

#: A group's stored form, to tell whether a change touched it.
_Stored = tuple[int, str, int | None]


def _stored(state: GroupState) -> _Stored:
    return state.generation, json.dumps(state.to_json()), state.rebalance_since_ms


class GroupOps(MetaBase):
    # Committed offsets --------------------------------------------------------------
    def commit_offsets(
        self,
        tenant: str,
        group: str,
        table_id: str,
        offsets: Mapping[int, int],
        check: Callable[[GroupState], E | None] | None = None,
    ) -> E | None:
        """Store ``group``'s committed offsets (partition -> next offset to consume).

        The last commit wins, also when it moves an offset backwards (a consumer that
        rewinds on purpose). All partitions of one call are stored in one transaction.

        With ``check``, the group's membership is locked first and ``check`` decides in
        the same transaction: it may change the state (members whose session timed
        out), which is saved, and returns None to store the offsets or a refusal, which
        is returned with nothing stored (the caller raises it).
        """

        def run(session: Session) -> E | None:
            if check is not None:
                refused = self._change_group(session, tenant, group, table_id, check)
                if refused is not None:
                    return refused
            self._write_offsets(session, tenant, group, table_id, offsets)
            return None

        return self._retried(run)

    def _write_offsets(
        self, session: Session, tenant: str, group: str, table_id: str, offsets: Mapping[int, int]
    ) -> None:
        if not offsets:
            return
        existing = {
            r.partition: r
            for r in session.scalars(
                select(GroupOffset).where(
                    GroupOffset.tenant_id == tenant,
                    GroupOffset.group_id == group,
                    GroupOffset.table_id == table_id,
                    GroupOffset.partition.in_(list(offsets)),
                )
            )
        }
        now = utcnow()
        for p, off in sorted(offsets.items()):
            row = existing.get(p)
            if row is None:
                session.add(
                    GroupOffset(
                        tenant_id=tenant,
                        group_id=group,
                        table_id=table_id,
                        partition=p,
                        offset=off,
                        committed_at=now,
                    )
                )
            else:
                row.offset = off
                row.committed_at = now

    def delete_offsets(
        self,
        tenant: str,
        group: str,
        table_id: str,
        partitions: Collection[int],
        check: Callable[[GroupState], E | None],
    ) -> E | None:
        """Forget ``group``'s committed offsets of ``partitions`` (those never committed
        are skipped), with the group's membership locked and ``check`` deciding first in
        the same transaction, as :meth:`commit_offsets` does: None to delete, or the
        refusal, returned with nothing deleted."""

        def run(session: Session) -> E | None:
            refused = self._change_group(session, tenant, group, table_id, check)
            if refused is not None or not partitions:
                return refused
            session.execute(
                delete(GroupOffset).where(
                    GroupOffset.tenant_id == tenant,
                    GroupOffset.group_id == group,
                    GroupOffset.table_id == table_id,
                    GroupOffset.partition.in_(sorted(partitions)),
                )
            )
            return None

        return self._retried(run)

    def fetch_offsets(self, tenant: str, group: str, table_id: str) -> dict[int, int]:
        """``group``'s committed offsets for the table; partitions never committed are absent."""
        stmt = select(GroupOffset.partition, GroupOffset.offset).where(
            GroupOffset.tenant_id == tenant,
            GroupOffset.group_id == group,
            GroupOffset.table_id == table_id,
        )
        with self._session(write=False) as session:
            return {int(p): int(o) for p, o in session.execute(stmt)}

    def list_groups(self, tenant: str, table_id: str | None = None) -> list[tuple[str, str]]:
        """``(group, table_id)`` pairs with committed offsets or members (now or once), of
        one table when given."""
        offsets = select(GroupOffset.group_id, GroupOffset.table_id).where(
            GroupOffset.tenant_id == tenant
        )
        members = select(GroupRecord.group_id, GroupRecord.table_id).where(
            GroupRecord.tenant_id == tenant
        )
        if table_id is not None:
            offsets = offsets.where(GroupOffset.table_id == table_id)
            members = members.where(GroupRecord.table_id == table_id)
        with self._session(write=False) as session:
            found = {(str(g), str(t)) for g, t in session.execute(offsets.distinct())}
            found |= {(str(g), str(t)) for g, t in session.execute(members)}
        return sorted(found)

    def all_groups(self) -> list[tuple[str, str, str, dict[int, int], GroupState]]:
        """Every group of every tenant with committed offsets or a membership row:
        ``(tenant, group, table_id, committed offsets, membership)`` (for metrics)."""
        found: dict[tuple[str, str, str], tuple[dict[int, int], GroupState]] = {}
        with self._session(write=False) as session:
            for row in session.scalars(select(GroupOffset)):
                key = (row.tenant_id, row.group_id, row.table_id)
                found.setdefault(key, ({}, GroupState()))[0][row.partition] = row.offset
            for rec in session.scalars(select(GroupRecord)):
                key = (rec.tenant_id, rec.group_id, rec.table_id)
                state = GroupState.load(
                    int(rec.generation), json.loads(rec.members_json), rec.rebalance_since_ms
                )
                found[key] = (found.get(key, ({}, state))[0], state)
        return [(*key, offsets, state) for key, (offsets, state) in sorted(found.items())]

    # Membership ---------------------------------------------------------------------
    def read_group(self, tenant: str, group: str, table_id: str) -> GroupState:
        """The group's membership on the table as stored (empty when it never had one)."""
        with self._session(write=False) as session:
            return self._load(session, tenant, group, table_id, lock=False)[1]

    def update_group(
        self, tenant: str, group: str, table_id: str, change: Callable[[GroupState], T]
    ) -> T:
        """Run ``change`` on the group's membership with its row locked, save what it
        changed in the same transaction, and return what it returned. ``change`` may
        run twice (two gateways creating the group's row at once): keep it free of
        other effects."""
        return self._retried(
            lambda session: self._change_group(session, tenant, group, table_id, change)
        )

    def _change_group(
        self,
        session: Session,
        tenant: str,
        group: str,
        table_id: str,
        change: Callable[[GroupState], T],
    ) -> T:
        row, state = self._load(session, tenant, group, table_id, lock=True)
        before = _stored(state)
        result = change(state)
        after = _stored(state)
        if after != before:
            generation, members, since = after
            if row is None:
                session.add(
                    GroupRecord(
                        tenant_id=tenant,
                        group_id=group,
                        table_id=table_id,
                        generation=generation,
                        members_json=members,
                        rebalance_since_ms=since,
                        updated_at=utcnow(),
                    )
                )
            else:
                row.generation = generation
                row.members_json = members
                row.rebalance_since_ms = since
                row.updated_at = utcnow()
        return result

    def _load(
        self, session: Session, tenant: str, group: str, table_id: str, *, lock: bool
    ) -> tuple[GroupRecord | None, GroupState]:
        stmt = select(GroupRecord).where(
            GroupRecord.tenant_id == tenant,
            GroupRecord.group_id == group,
            GroupRecord.table_id == table_id,
        )
        row = session.scalars(stmt.with_for_update() if lock else stmt).one_or_none()
        if row is None:
            return None, GroupState()
        state = GroupState.load(
            int(row.generation), json.loads(row.members_json), row.rebalance_since_ms
        )
        return row, state

    def _retried(self, run: Callable[[Session], T]) -> T:
        """``run`` in one write transaction, once more when a concurrent transaction
        created the same row first (the first commit of a partition, the first member
        of a group)."""
        for attempt in range(2):
            try:
                with self._session(write=True) as session:
                    return run(session)
            except IntegrityError:
                if attempt:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover
