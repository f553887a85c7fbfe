"""The tasks of the lake jobs: what a runner executes, on a thread of this process or on a
Spark executor. A :class:`RangeTask` is one partition's hot range ``[T(p), HW(p))`` to write
as Parquet files sorted by ``(_partition, _offset)`` (:func:`write_range`); compaction's tasks
(:mod:`gateway.lake.compaction`) follow the same :class:`LakeTask` protocol. A task writes
files and returns their metadata; nothing is visible until the job's driver commits
(:mod:`gateway.lake.tiering`).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa

from gateway.cold.base import ROW_GROUP_ROWS, DataFile, DataFileWriter, StorageOptions
from gateway.hot import HotLog, PartitionId
from gateway.lake.components import TieringError
from gateway.wire.changes import CHANGE_COLUMN, CHANGE_TYPE
from gateway.wire.codec import iter_rows
from gateway.wire.evolution import read_as
from gateway.wire.schema import TIMESTAMP_TYPE, conform_batch, parse_fields, system_schema

__all__ = ["CRASH_POINT_ENV", "LakeTask", "RangeTask", "crash_point", "write_range"]

log = logging.getLogger("tidegate.tiering")

#: Crash-test hook: the job SIGKILLs its own process at this point (``before_commit``,
#: ``after_commit``, ``after_cache``). Only for tests of exactly-once; never set it else.
CRASH_POINT_ENV = "TIDEGATE_TIERING_CRASH_POINT"


_READ_RECORDS = 50_000
_READ_BYTES = 16 * 1024 * 1024


def crash_point(name: str, env: str = CRASH_POINT_ENV) -> None:
    """Crash-test hook of the lake jobs: SIGKILL this process when ``env`` names ``name``."""
    if os.environ.get(env) == name:
        log.warning("crash point %s: killing this process", name)
        os.kill(os.getpid(), signal.SIGKILL)


class LakeTask(Protocol):
    """One task of a lake job (a hot range to tier, files to compact): serialisable,
    shipped to a Spark executor, run there by :meth:`run`, returning the data files it
    wrote. Nothing a task writes is visible until the driver commits it."""

    @property
    def tenant(self) -> str: ...
    @property
    def table(self) -> str: ...
    @property
    def partition(self) -> int: ...

    #: The job's name (``tier``, ``compact``): labels Spark job groups and logs.
    job: ClassVar[str]
    #: Whether :meth:`run` reads the hot tier (an executor opens it only then).
    needs_hot: ClassVar[bool]

    def run(self, hot: HotLog | None) -> list[DataFile]: ...


@dataclass(frozen=True, slots=True)
class RangeTask:
    """One partition's hot range to write: serialisable, shipped to a Spark executor."""

    job: ClassVar[str] = "tier"
    needs_hot: ClassVar[bool] = True

    tenant: str
    table_id: str
    table: str
    partition: int
    start: int
    end: int
    #: The user schema as stored in the metadata (JSON fields).
    fields: tuple[Mapping[str, Any], ...]
    #: Folder URI for the new files (``ColdTable.data_location``).
    location: str
    storage: StorageOptions
    #: Arrow schema of the data files, with Iceberg field ids (``ColdTable.file_schema``).
    file_schema: pa.Schema
    target_file_bytes: int
    run_id: str
    #: A primary-key table's range: its records hold ``_change`` after the user columns
    #: (the changelog), and so do the files.
    keyed: bool = False

    @property
    def part(self) -> PartitionId:
        return PartitionId(self.tenant, self.table_id, self.partition)

    def run(self, hot: HotLog | None) -> list[DataFile]:
        if hot is None:
            raise TieringError(f"tiering {self.table} needs the hot tier")
        return write_range(self, hot)


# --------------------------------------------------------------------------------------
# The task: hot range -> Parquet files
# --------------------------------------------------------------------------------------
def _iter_range(
    hot: HotLog, task: RangeTask, user: pa.Schema
) -> Iterator[tuple[int, int, pa.RecordBatch]]:
    """Records ``[start, end)`` of the partition, in offset order, as ``(first offset,
    timestamp_us, rows)`` with the rows in the user schema ``user``: each record batch of
    each hot payload as it is decoded (any IPC compression, any number of record batches
    per payload), sliced at the ends of the range, never copied or concatenated."""
    part = task.part
    offset = task.start
    while offset < task.end:
        stored = hot.read(part, offset, min(_READ_RECORDS, task.end - offset), _READ_BYTES)
        read_from = offset
        if not stored:
            raise TieringError(
                f"the hot tier of {task.table} partition {task.partition} ends at {offset}, "
                f"before the planned {task.end}"
            )
        for sb in stored:
            if offset >= task.end:
                break
            if sb.base_offset > offset:
                raise TieringError(
                    f"gap in the hot tier of {task.table} partition {task.partition}: "
                    f"expected offset {offset}, found {sb.base_offset}"
                )
            skip = offset - sb.base_offset
            if skip >= sb.count:
                continue
            left = task.end - offset
            rows = (
                iter_rows(sb.payload, threads=False)  # all of it: decoded in one go
                if skip == 0 and sb.count <= left
                else iter_rows(sb.payload, skip, left, threads=False)
            )
            for at, data in rows:
                first = sb.base_offset + at
                if first >= task.end:
                    break
                if data.num_rows > task.end - first:
                    data = data.slice(0, task.end - first)
                if not data.schema.equals(user):
                    newer = set(data.schema.names) - set(user.names)
                    if newer:  # pragma: no cover - excluded by the order of _tasks' reads
                        raise TieringError(
                            f"{task.table} partition {task.partition} offset "
                            f"{sb.base_offset} holds columns {sorted(newer)} unknown to this "
                            "run's schema; the next run moves them"
                        )
                    # Written under an older schema (added columns read as null).
                    data = conform_batch(read_as(data, user), user)
                yield first, sb.timestamp_us, data
                offset = first + data.num_rows
        if offset == read_from:
            raise TieringError(
                f"the hot tier of {task.table} partition {task.partition} holds no record "
                f"at offset {offset}"
            )


@dataclass
class _Group:
    """Consecutive hot records on their way to one row group: user columns as decoded,
    the system columns built for all of them at once by :meth:`rows`."""

    first: int = -1
    records: int = 0
    nbytes: int = 0
    batches: list[pa.RecordBatch] = field(default_factory=list)
    stamps: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def add(self, first: int, timestamp_us: int, rows: pa.RecordBatch) -> None:
        if self.first < 0:
            self.first = first
        elif first != self.first + self.records:  # pragma: no cover - _iter_range is dense
            raise TieringError(f"offset {first} does not follow {self.first + self.records}")
        self.batches.append(rows)
        self.stamps.append(timestamp_us)
        self.counts.append(rows.num_rows)
        self.records += rows.num_rows
        self.nbytes += rows.nbytes

    def rows(self, user: pa.Schema, partition: int) -> pa.Table:
        """The group in the stored schema (``user`` plus the system columns)."""
        n = self.records
        offsets = np.arange(self.first, self.first + n, dtype=np.int64)
        stamps = np.repeat(np.asarray(self.stamps, dtype=np.int64), self.counts)
        return pa.Table.from_arrays(
            [
                *pa.Table.from_batches(self.batches, user).columns,
                pa.repeat(pa.scalar(partition, pa.int32()), n),
                _wrap(pa.int64(), offsets),
                _wrap(TIMESTAMP_TYPE, stamps),
            ],
            schema=system_schema(user),
        )


def _wrap(kind: pa.DataType, values: np.ndarray[Any, Any]) -> pa.Array:
    """A numpy int64 array as an Arrow array of ``kind`` without nulls, sharing its memory
    (``pa.array`` would copy nothing either, but imports ``numpy.ma`` on first use: a
    sixth of a one-shot tiering run's CPU)."""
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def write_range(task: RangeTask, hot: HotLog) -> list[DataFile]:
    """Write the task's records as Parquet files of about ``target_file_bytes`` of
    Arrow data each (sorted by offset, one partition per file, in the table's file
    schema) and return their metadata. Nothing is committed here. The records go from
    the hot payloads to the Parquet writer a row group at a time, with the system
    columns built once per row group.

    Raises:
        TieringError: the hot range has a gap or ends early; or the hot tier's error.
    """
    user = parse_fields(list(task.fields), stored=True)
    if task.keyed:
        user = user.append(pa.field(CHANGE_COLUMN, CHANGE_TYPE, nullable=False))
    filesystem, _ = task.storage.filesystem()
    files: list[DataFile] = []
    writer: DataFileWriter | None = None
    group = _Group()

    def flush(roll: bool) -> None:
        nonlocal writer, group
        if group.records:
            if writer is None:
                writer = DataFileWriter(
                    task.storage, task.location, task.file_schema, filesystem=filesystem
                )
            writer.write(group.rows(user, task.partition))
            group = _Group()
        if writer is not None and (roll or writer.nbytes >= task.target_file_bytes):
            files.append(writer.close())
            writer = None

    try:
        for first, stamp, rows in _iter_range(hot, task, user):
            group.add(first, stamp, rows)
            if group.records >= ROW_GROUP_ROWS:
                flush(False)
            elif group.nbytes + (writer.nbytes if writer else 0) >= task.target_file_bytes:
                flush(True)
        flush(True)
    finally:
        if writer is not None:
            writer.abort()
    return files
