"""An Iceberg table's clean-up: expiring snapshots and the files still referenced."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gateway.cold.iceberg.tablebase import TableBase
from gateway.wire.errors import CommitConflict

if TYPE_CHECKING:
    from pyiceberg.table import Table


class TableMaintenance(TableBase):
    """Clean-up of the table: snapshot expiry and the files snapshots still name."""

    def expire_snapshots(self, snapshot_ids: Sequence[int]) -> list[str]:
        from pyiceberg.exceptions import CommitFailedException

        table = self._load()
        current = table.current_snapshot()
        ids = sorted({int(i) for i in snapshot_ids} - {current.snapshot_id if current else -1})
        expired = [s for s in (table.snapshot_by_id(i) for i in ids) if s is not None]
        if not expired:
            return []
        candidates = self._files_of(table, expired, live_only=False)
        try:
            table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in expired]).commit()
        except CommitFailedException as exc:
            raise CommitConflict(f"a concurrent commit won: {exc}") from exc
        # What the table references now (a commit racing this one is in it: it can only
        # reference files of the current snapshot, which is retained, and new files).
        kept = self.referenced_files()
        return sorted(candidates - kept)

    def referenced_files(self) -> set[str]:
        table = self._load()
        refs = self._files_of(table, table.snapshots(), live_only=True)
        refs.add(str(table.metadata_location))
        refs.update(str(m.metadata_file) for m in table.metadata.metadata_log)
        return refs

    @staticmethod
    def _files_of(table: Table, snapshots: Sequence[Any], *, live_only: bool) -> set[str]:
        """Manifest lists, manifests and data files of ``snapshots`` (each manifest read
        once: snapshots share most of them). ``live_only``: only the data files live in
        some snapshot (entries a manifest marks deleted are a parent's files)."""
        out: set[str] = set()
        seen: set[str] = set()
        for snap in snapshots:
            out.add(str(snap.manifest_list))
            for manifest in snap.manifests(table.io):
                path = str(manifest.manifest_path)
                out.add(path)
                if path in seen:
                    continue
                seen.add(path)
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=live_only):
                    out.add(str(entry.data_file.file_path))
        return out
