"""An Iceberg table's commits: tiered ranges with their watermarks, lost ranges, schema
evolution, rewrites (compaction) and retention, each in one snapshot."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gateway.cold.base import (
    OPERATION_PROPERTY,
    WATERMARKS_PROPERTY,
    ColdSnapshot,
    DataFile,
    RewriteObsolete,
    fs_path,
)
from gateway.cold.iceberg.filters import to_pyiceberg
from gateway.cold.iceberg.parquet import file_batches, promotes_to
from gateway.cold.iceberg.schema import iceberg_type
from gateway.cold.iceberg.summary import (
    carried_properties,
    cold_snapshot,
    current_snapshot_id,
    iceberg_data_files,
    lost_props,
    missing_metadata_properties,
    summary_watermarks,
)
from gateway.cold.iceberg.tablebase import TableBase
from gateway.wire.errors import CommitConflict, SchemaChangeRefused
from gateway.wire.filters import Compare
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN, system_schema

if TYPE_CHECKING:
    from pyiceberg.table import Table


class TableCommits(TableBase):
    """Committing to the table: tiered ranges, lost ranges, schema changes, rewrites
    (compaction) and retention, each one Iceberg snapshot."""

    def commit_tiered(
        self,
        files: Sequence[DataFile],
        watermarks: Mapping[int, int],
        base: ColdSnapshot,
    ) -> ColdSnapshot:
        # The metadata loaded last (by the run's file_schema) when it is still at ``base``:
        # the catalog checks the branch head against its own current metadata at commit
        # time anyway, so a reload here would only cost a round trip.
        table = self._cached
        if table is None or current_snapshot_id(table) != base.snapshot_id:
            table = self._load()
        current_id = current_snapshot_id(table)
        if current_id != base.snapshot_id:
            raise CommitConflict(
                f"the table moved from snapshot {base.snapshot_id} to {current_id}; re-plan",
                base=str(base.snapshot_id),
                current=str(current_id),
            )
        merged = dict(base.watermarks)
        for p, w in watermarks.items():
            merged[int(p)] = max(int(w), merged.get(int(p), 0))
        props = {
            WATERMARKS_PROPERTY: json.dumps({str(p): merged[p] for p in sorted(merged)}),
            **lost_props(base.lost),
        }
        return self._commit(table, props, files)

    def commit_lost(self, partition: int, end: int, base: ColdSnapshot) -> ColdSnapshot:
        table = self._load()
        current = table.current_snapshot()
        current_id = None if current is None else int(current.snapshot_id)
        if current_id != base.snapshot_id:
            raise CommitConflict(
                f"the table moved from snapshot {base.snapshot_id} to {current_id}; re-plan",
                base=str(base.snapshot_id),
                current=str(current_id),
            )
        start = base.watermark(partition)
        if start >= end:
            return base
        marks = {**base.watermarks, partition: end}
        lost = {p: list(r) for p, r in base.lost.items()}
        lost[partition] = [*lost.get(partition, []), (start, end)]
        props = {
            WATERMARKS_PROPERTY: json.dumps({str(p): marks[p] for p in sorted(marks)}),
            OPERATION_PROPERTY: "lost",
            **lost_props(lost),
        }
        return self._commit(table, props, [])

    def _commit(
        self,
        table: Table,
        props: dict[str, str],
        added: Sequence[DataFile],
        deleted: Sequence[Any] = (),
        *,
        overwrite: bool = False,
    ) -> ColdSnapshot:
        """One snapshot of ``table`` adding ``added`` and removing ``deleted`` (pyiceberg
        data files of its current snapshot): an append (merging small manifests where the
        table's ``commit.manifest-merge.enabled`` says so), or an overwrite when it removes
        files or ``overwrite`` says so. pyiceberg's commit asserts the branch head it
        started from.

        Raises:
            CommitConflict: a concurrent commit moved the table.
        """
        from pyiceberg.exceptions import CommitFailedException

        # The transaction starts from this metadata: no need for its (deep-copied) view.
        new_files = iceberg_data_files(table.io, table.metadata, added)
        missing = missing_metadata_properties(table)
        try:
            with table.transaction() as tx:
                if missing:
                    tx.set_properties(missing)
                update = tx.update_snapshot(snapshot_properties=props)
                with (
                    update.overwrite() if deleted or overwrite else update.merge_append()
                ) as producer:
                    for old in deleted:
                        producer.delete_data_file(old)
                    for f in new_files:
                        producer.append_data_file(f)
        except CommitFailedException as exc:
            raise CommitConflict(f"a concurrent commit won: {exc}") from exc
        # The transaction left ``table`` at the metadata it committed: that snapshot is
        # ours (a reload would cost a catalog round trip and could return a later one).
        self._cached = table
        return cold_snapshot(table.current_snapshot())

    def evolve_schema(self, user: pa.Schema, docs: Mapping[str, str]) -> int:
        from pyiceberg.exceptions import CommitFailedException

        table = self._load()
        ice = table.schema()
        # (column, add | type | optional | doc, Iceberg type or doc): only what the table
        # lacks, so a change already committed here by an earlier attempt is a no-op.
        steps: list[tuple[str, str, Any]] = []
        for f in user:
            doc = docs.get(f.name) or None
            want = iceberg_type(f.type, f.name)
            if f.name not in ice.column_names:
                steps.append((f.name, "add", (want, doc)))
                continue
            have = ice.find_field(f.name)
            if f.name not in self.user_schema.names and have.field_type != want:
                # Left by a change that committed here but lost the metadata store's
                # compare-and-set (a concurrent change won), never written to since.
                raise SchemaChangeRefused(
                    f"cannot add column {f.name!r}: the Iceberg table already has it as "
                    f"{have.field_type} from an interrupted change; add it with that type"
                )
            if have.field_type != want and promotes_to(have.field_type, want):
                steps.append((f.name, "type", want))
            if have.required and f.nullable:
                steps.append((f.name, "optional", None))
            if (have.doc or None) != doc:
                steps.append((f.name, "doc", doc or ""))
        if steps:
            try:
                with table.transaction() as tx:
                    missing = missing_metadata_properties(table)
                    if missing:
                        tx.set_properties(missing)
                    with tx.update_schema() as update:
                        for name, kind, arg in steps:
                            if kind == "add":
                                update.add_column(name, arg[0], doc=arg[1], required=False)
                                # User columns stay ahead of the system columns, as at create.
                                update.move_before(name, PARTITION_COLUMN)
                            elif kind == "type":
                                update.update_column(name, field_type=arg)
                            elif kind == "optional":
                                update.make_column_optional(name)
                            else:
                                update.update_column(name, doc=arg)
            except CommitFailedException as exc:
                raise CommitConflict(
                    f"a concurrent change of the Iceberg table won: {exc}"
                ) from exc
        self.user_schema = user
        self.stored_schema = system_schema(user)
        return self.schema_id()

    def schema_id(self) -> int:
        return int(self._load().schema().schema_id)

    def commit_rewrite(
        self,
        removed: Sequence[DataFile],
        added: Sequence[DataFile],
        base: ColdSnapshot,
    ) -> ColdSnapshot:
        from pyiceberg.expressions import In

        table = self._load()
        current = table.current_snapshot()
        if current is None or base.snapshot_id is None:
            raise RewriteObsolete("the table has no snapshot to rewrite")
        # Snapshot isolation: whatever was committed since ``base`` (tiering only adds
        # files), the rewrite applies while every file it replaces is still live.
        parts = sorted({f.partition for f in removed})
        live = {
            str(t.file.file_path): t.file
            for t in table.scan(
                row_filter=In(term=PARTITION_COLUMN, literals=parts),
                snapshot_id=current.snapshot_id,
            ).plan_files()
        }
        gone = [f.path for f in removed if f.path not in live]
        if gone:
            raise RewriteObsolete(
                f"{len(gone)} of the {len(removed)} files to rewrite are no longer live "
                f"in snapshot {current.snapshot_id}",
                snapshot=str(current.snapshot_id),
            )
        # The new snapshot carries the current watermarks (not base's: a tiering commit
        # since base raised them) and says what it is.
        props = {
            WATERMARKS_PROPERTY: json.dumps(
                {str(p): w for p, w in sorted(summary_watermarks(current.summary).items())}
            ),
            OPERATION_PROPERTY: "compact",
            **carried_properties(current.summary),
        }
        return self._commit(table, props, added, [live[f.path] for f in removed])

    def commit_retention(self, earliest: Mapping[int, int]) -> tuple[ColdSnapshot, int]:
        from gateway.cold.base import write_data_file

        table = self._load()
        current = table.current_snapshot()
        marks = summary_watermarks(current.summary) if current is not None else {}
        raised = {int(p): max(int(e), marks.get(int(p), 0)) for p, e in earliest.items()}
        if current is None and not any(raised.values()):
            return self.snapshot(), 0
        deleted: list[Any] = []
        added: list[DataFile] = []
        removed_rows = 0
        if current is not None:
            oid = int(table.schema().find_field(OFFSET_COLUMN).field_id)
            filesystem = self.store.filesystem()
            storage = self.store.storage_options()
            file_schema = self.file_schema()
            for p, e in sorted(earliest.items()):
                prune = to_pyiceberg(Compare(PARTITION_COLUMN, "=", int(p)), self.stored_schema)
                tasks = table.scan(row_filter=prune, snapshot_id=current.snapshot_id)
                for t in tasks.plan_files():
                    f = self._data_file(t.file, oid)
                    if f.min_offset >= e:
                        continue
                    deleted.append(t.file)
                    if 0 <= f.max_offset < e:
                        removed_rows += f.record_count
                        continue
                    # Straddles the earliest offset (or has no bounds): keep its rows at
                    # or above it in a new file.
                    keep = [
                        b
                        for b in file_batches(filesystem, f.path, file_schema.names, (e, 2**63 - 1))
                        if b.num_rows
                    ]
                    kept = sum(b.num_rows for b in keep)
                    removed_rows += f.record_count - kept
                    if kept:
                        # Cast (and columns added since filled) by write_data_file.
                        rows = pa.Table.from_batches(keep)
                        added.append(
                            write_data_file(storage, self.data_location(p), rows, file_schema)
                        )
        if not deleted and all(raised[p] == marks.get(p, 0) for p in raised):
            return self.snapshot(), 0
        merged = {**marks, **raised}
        props = {
            WATERMARKS_PROPERTY: json.dumps({str(p): merged[p] for p in sorted(merged)}),
            OPERATION_PROPERTY: "retention",
            **carried_properties(current.summary if current is not None else None),
        }
        try:
            snap = self._commit(table, props, added, deleted)
        except CommitConflict:
            filesystem = self.store.filesystem()
            for f in added:  # never committed: not an orphan to wait for
                with contextlib.suppress(OSError):
                    filesystem.delete_file(fs_path(f.path))
            raise
        return snap, removed_rows
