"""The cold tier's side of an Iceberg REST catalog scan plan (``POST .../plan``): the
snapshot's data files as the spec's content-file JSON, and the hot tail above the
snapshot as Parquet files any Iceberg reader reads like a data file.

Hot-tail files live under ``<table location>/tidegate-plans/_partition=<p>/``, a folder no
snapshot references, one file per offset range ``[start, end)`` of a partition, named
``<start>-<end>-<written ms>.parquet`` (zero-padded). A range's rows never change once
appended, so a file is written once and named again by every later plan whose hot range
starts where it does; a plan whose tail has grown past a file's end writes only the new
range as another file. The orphan clean-up (``tidegate clean-orphans``,
``expiry.orphan_age_s``) removes them like any file no snapshot names; a plan writes a
file too old to outlive it afresh, under a new name, before naming it, so a live plan never
names a file due for removal (nor one a running clean-up is deleting).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from gateway.cold.base import ColdSnapshot
    from gateway.wire.filters import Expr

__all__ = ["PLANS_FOLDER", "HotFile", "PlanFiles"]

#: The folder under a table's location that holds the hot-tail files of scan plans.
PLANS_FOLDER = "tidegate-plans"


@dataclass(frozen=True, slots=True)
class HotFile:
    """One hot-tail file of a plan: offsets ``[start, end)`` of ``partition``."""

    partition: int
    start: int
    end: int
    #: The spec's ``DataFile`` JSON (``content: data``) of the file.
    content_file: Mapping[str, Any]
    #: Bytes this plan wrote for it (0 when an earlier plan's file was named again).
    written_bytes: int


class PlanFiles(ABC):
    """What a catalog scan plan needs of one table's cold tier."""

    @abstractmethod
    def data_files(
        self, snap: ColdSnapshot, row_filter: Expr | None, stats_fields: Sequence[str]
    ) -> list[dict[str, Any]]:
        """The spec's ``DataFile`` JSON of every data file of ``snap`` that ``row_filter``
        (a bound tree) may match, with column statistics (sizes, counts, bounds) of the
        columns ``stats_fields`` only (none when empty), in (partition, path) order."""

    @abstractmethod
    def added_files(
        self, start_id: int, end_id: int, row_filter: Expr | None, stats_fields: Sequence[str]
    ) -> list[dict[str, Any]]:
        """An incremental append scan: the spec's ``DataFile`` JSON of the data files the
        append snapshots after ``start_id`` up to and including ``end_id`` added, on
        ``end_id``'s lineage, that ``row_filter`` may match, in (partition, path) order.
        Snapshots that only rewrite or remove files (compaction, retention) add none.

        Raises:
            SnapshotNotFound: the table has no such snapshot (either id).
            InvalidRequest: ``start_id`` is not an ancestor of ``end_id``.
        """

    @abstractmethod
    def snapshot_columns(self, snapshot_id: int) -> list[str]:
        """The top-level column names of the schema snapshot ``snapshot_id`` was written
        with (the spec's ``use-snapshot-schema``).

        Raises:
            SnapshotNotFound: the table has no such snapshot.
        """

    @abstractmethod
    def covered(self, partition: int, start: int, end: int, reuse_age_s: float) -> int:
        """How far files written earlier, younger than ``reuse_age_s``, cover offsets
        ``[start, end)`` of ``partition`` from ``start`` on, as :meth:`hot_files` would
        name them: ``end`` when nothing is left to write, ``start`` when nothing is
        there. (What a submitted plan still has to write is ``[covered, end)``.)"""

    @abstractmethod
    def hot_files(
        self,
        partition: int,
        start: int,
        end: int,
        rows: Callable[[int, int], Iterator[pa.RecordBatch]],
        stats_fields: Sequence[str],
        reuse_age_s: float,
        row_filter: Expr | None = None,
    ) -> list[HotFile]:
        """Files that hold exactly the offsets ``[start, end)`` of ``partition``, in
        offset order: files written for earlier plans where one starts where the range
        (or the file before) ends and ends within it, and younger than ``reuse_age_s``;
        the rest of the range written now from ``rows(lo, hi)`` (stored-schema batches of
        those offsets, in order) as one file, in the table's file schema and field ids.
        Files whose column statistics show that ``row_filter`` (a bound tree) matches
        none of their rows are left out of the answer (they are still written)."""
