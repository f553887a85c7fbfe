"""Operator jobs on hot-tier shards: move partitions, finish interrupted moves, drain a
shard. They run beside the gateways (the ``tidegate shard ...`` commands, the rebalancing
job) on the same metadata store and shards; see :mod:`gateway.hot.placement`."""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.hot import PartitionId, sharded
from gateway.meta.work import Mark
from gateway.wire.errors import InvalidRequest, TableNotFound

if TYPE_CHECKING:
    from gateway.hot import HotLog
    from gateway.lake.components import Components
    from gateway.meta import MetadataStore, Placement

__all__ = [
    "MoveResult",
    "Placed",
    "check_target",
    "copy_sealed",
    "drain_shard",
    "find_partition",
    "move_partition",
    "recover_moves",
    "shard_stats",
]

log = logging.getLogger(__name__)


class Placed(Protocol):
    """What the shard jobs need: the metadata store and the hot tier bound to it (a job's
    :class:`~gateway.lake.components.Components` or a gateway's stream-tables)."""

    @property
    def meta(self) -> MetadataStore: ...

    @property
    def hot(self) -> HotLog: ...


@dataclass(frozen=True, slots=True)
class MoveResult:
    tenant: str
    table: str
    partition: int
    source: str
    target: str
    #: The offset the new segment starts at (the sealed high watermark).
    start: int
    seconds: float


def find_partition(c: Placed, tenant: str, table: str, partition: int) -> PartitionId:
    """The partition of ``tenant``'s ``namespace.name``.

    Raises:
        TableNotFound / InvalidRequest: no such table or partition.
    """
    namespace, _, name = table.partition(".")
    if not name:
        raise InvalidRequest(f"name the table as namespace.name, not {table!r}")
    d = c.meta.get_table(tenant, namespace, name)
    if not 0 <= partition < d.partitions:
        raise InvalidRequest(f"table {table} has no partition {partition}")
    return PartitionId(d.tenant, d.table_id, partition)


def check_target(c: Placed, tenant: str, target: str) -> None:
    """A tenant's partition may go to a shard nobody reserved, or one reserved for it.

    Raises:
        InvalidRequest: ``target`` is not a configured shard or is another tenant's.
    """
    if target not in c.hot.shard_names():
        raise InvalidRequest(f"no hot-tier shard {target!r}", shard=target)
    owner = c.meta.shard_pins().get(target)
    if owner is not None and owner != tenant:
        raise InvalidRequest(f"shard {target!r} is reserved for another tenant", shard=target)


def move_partition(c: Placed, tenant: str, table: str, partition: int, target: str) -> MoveResult:
    """Move one partition's appends to ``target`` without copying (seal, open, record).

    Raises:
        InvalidRequest: bad target (see :func:`check_target`), or no shards.
        TableNotFound: no such table.
        Unavailable: a shard is unreachable; the move stays under way and is finished by
            the next run or by the first gateway that appends to the partition.
    """
    check_target(c, tenant, target)
    part = find_partition(c, tenant, table, partition)
    before = _placement(c, part)
    started = time.monotonic()
    sharded(c.hot).move(part, target)
    # The sealed segment goes once tiering has moved its records: mark the partition.
    now = dt.datetime.now(dt.UTC)
    c.meta.mark_work([Mark(part.table_id, part.partition, "tier", since=now, due_at=now)])
    after = _placement(c, part)
    seconds = time.monotonic() - started
    log.info(
        "moved %s partition %d of %s from %s to %s at offset %d in %.3fs",
        tenant,
        partition,
        table,
        before.shard,
        after.shard,
        after.segments[-1][2],
        seconds,
    )
    return MoveResult(
        tenant, table, partition, before.shard, after.shard, after.segments[-1][2], seconds
    )


def _placement(c: Placed, part: PartitionId) -> Placement:
    for p in c.meta.placements(tenant=part.tenant):
        if p.table_id == part.table_id and p.partition == part.partition:
            return p
    raise TableNotFound(f"partition {part.path} is gone")


def recover_moves(c: Placed) -> int:
    """Finish every move that a crash left under way; returns how many."""
    done = 0
    for p in c.meta.placements(moving=True):
        sharded(c.hot).finish_move(PartitionId(p.tenant, p.table_id, p.partition))
        done += 1
    return done


def drain_shard(
    c: Components,
    shard: str,
    *,
    wait_s: float = 0.0,
    poll_s: float = 1.0,
    force: bool = False,
) -> tuple[list[MoveResult], list[Placement]]:
    """Empty ``shard``: move every active segment on it to the least loaded other shard a
    tenant may use, then wait up to ``wait_s`` for tiering to drop its sealed segments;
    with ``force``, copy each sealed segment's un-tiered range to the shard its partition
    now appends to instead of waiting (see :meth:`HotLog.copy_segment`).

    Returns the moves made and the placements still holding a segment on the shard (empty
    once the shard can be removed from the configuration).
    """
    recover_moves(c)
    moves = []
    pins = c.meta.shard_pins()
    load: dict[str, int] = {s: 0 for s in c.hot.shard_names() if s != shard}
    for p in c.meta.placements():
        if p.shard in load:
            load[p.shard] += 1
    for p in c.meta.placements(shard=shard):
        if p.shard != shard:
            continue
        allowed = [s for s in load if pins.get(s) in (None, p.tenant)]
        own = [s for s in allowed if pins.get(s) == p.tenant]
        choices = own or allowed
        if not choices:
            raise InvalidRequest(f"no other shard may take {p.tenant}'s partitions")
        target = min(choices, key=lambda s: (load[s], s))
        moves.append(move_partition(c, p.tenant, f"{p.namespace}.{p.name}", p.partition, target))
        load[target] += 1
    if force:
        copied = copy_sealed(c, shard)
        log.info("copied %d sealed segments off %s", copied, shard)
    deadline = time.monotonic() + wait_s
    while True:
        left = c.meta.placements(shard=shard)
        if not left or time.monotonic() >= deadline:
            return moves, left
        time.sleep(poll_s)


def copy_sealed(c: Placed, shard: str) -> int:
    """Copy every sealed segment still on ``shard`` to the shard its partition appends to
    now, each replacing the original in its chain; returns how many were copied."""
    copied = 0
    for p in c.meta.placements(shard=shard):
        if p.shard == shard:
            raise InvalidRequest(
                f"partition {p.partition} of {p.tenant}'s {p.namespace}.{p.name} still takes "
                f"appends on {shard}: move it off first"
            )
        part = PartitionId(p.tenant, p.table_id, p.partition)
        for seq, on, _, end in p.segments:
            if on == shard and end is not None and sharded(c.hot).copy_segment(part, seq, p.shard):
                copied += 1
    return copied


def shard_stats(c: Placed) -> dict[str, tuple[int, int, int]]:
    """``shard -> (partitions, segments, bytes)``: partitions whose active segment is on
    the shard, segments (active or sealed) it holds and their stored payload bytes."""
    configured = c.hot.shard_names()
    stats = {s: [0, 0, 0] for s in configured}
    segments: list[tuple[PartitionId, int, str]] = []
    for p in c.meta.placements():
        stats.setdefault(p.shard, [0, 0, 0])[0] += 1
        part = PartitionId(p.tenant, p.table_id, p.partition)
        for seq, on, _, _ in p.segments:
            stats.setdefault(on, [0, 0, 0])[1] += 1
            if on in configured:
                segments.append((part, seq, on))
    for (_, _, on), nbytes in zip(segments, c.hot.held_bytes(segments), strict=True):
        stats[on][2] += nbytes
    return {s: (a, b, n) for s, (a, b, n) in stats.items()}
