"""The reads of a Redis hot tier partition: its batches from an offset (:meth:`ShardReads.read`,
:meth:`ShardReads.read_at`) and its offsets, over the chain of its segments, looked at again
when a move changed the chain under the read. :class:`ShardReads` is the part of
:class:`~gateway.hot.redis.RedisHotLog` that does it."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from gateway.hot.base import LogOffsets, PartitionId, StoredBatch
from gateway.hot.placement import Chain
from gateway.hot.redis.moves import ShardMoves
from gateway.hot.redis.scripts import (
    READ_AT_END,
    READ_CHUNK,
    READ_OK,
    READ_OUT_OF_RANGE,
    partition_keys,
)
from gateway.hot.redis.shard import to_int
from gateway.wire.errors import OffsetOutOfRange, TidegateError, Unavailable

__all__ = ["ShardReads"]


T = TypeVar("T")


class _Stale(Exception):
    """The cached chain no longer matches what the shards hold: reload it."""


class ShardReads(ShardMoves):
    """The reads and offsets of :class:`~gateway.hot.redis.RedisHotLog`, over the chains
    and shards of :class:`~gateway.hot.redis.moves.ShardMoves`."""

    def read(
        self, part: PartitionId, from_offset: int, max_records: int, max_bytes: int
    ) -> list[StoredBatch]:
        return self._on_chain(
            part,
            lambda chain, attempt: self._read_chain(
                part, chain, from_offset, max(max_records, 1), max(max_bytes, 1), attempt
            ),
        )

    def _on_chain(self, part: PartitionId, run: Callable[[Chain, int], T]) -> T:
        """``run(chain, attempt)`` over the partition's chain, reloaded and run again while
        the shards say the cached chain is stale (:class:`_Stale`), settled on the third
        try."""
        for attempt in range(4):
            chain = self.chain(part, refresh=attempt > 0)
            try:
                return run(chain, attempt)
            except _Stale:
                if attempt == 2:
                    self._settle(part, chain)
            except Unavailable:
                if attempt > 0 or self._placements is None:
                    raise
                # The cached chain may name a shard that a forced drain has emptied and
                # an operator has taken away: the store's chain may not need it.
        raise Unavailable(f"the placement of {part.path} keeps changing", backend="redis")

    def read_at(
        self, part: PartitionId, from_offset: int, max_records: int, max_bytes: int
    ) -> tuple[LogOffsets, list[StoredBatch]]:
        # A partition of one open segment (all but those a move is carrying): the read
        # script answers the marks with the batches. Anything else takes the long way.
        chain = self.chain(part)
        if len(chain.segments) == 1 and chain.segments[0].end is None:
            seg = chain.segments[0]
            shard = self._shard(seg.shard)
            args = [from_offset, max(max_records, 1), max(max_bytes, 1), READ_CHUNK]
            try:
                reply = shard.run(
                    f"read of {part.path}",
                    shard.read,
                    partition_keys(part, seg.seq),
                    args,
                    retry=True,
                )
            except Unavailable:
                if self._placements is None:
                    raise
                reply = None
            if reply is not None and to_int(reply[3]) == 0:
                status = to_int(reply[0])
                o = LogOffsets(low=to_int(reply[1]), high=to_int(reply[2]))
                if status in (READ_OUT_OF_RANGE, READ_AT_END):
                    return o, []
                if status == READ_OK:
                    batches = [self._batch(entry) for entry in cast("list[Any]", reply[4])]
                    self._check_dense(part, from_offset, batches)
                    return o, batches
        return super().read_at(part, from_offset, max_records, max_bytes)

    def _read_chain(
        self,
        part: PartitionId,
        chain: Chain,
        from_offset: int,
        max_records: int,
        max_bytes: int,
        attempt: int,
    ) -> list[StoredBatch]:
        i = chain.index_of(from_offset)
        if i < 0:
            if attempt == 0:
                raise _Stale
            o = self.offsets(part)
            raise self._out_of_range(part, from_offset, o.low, o.high)
        out: list[StoredBatch] = []
        offset, records, nbytes = from_offset, 0, 0
        while True:
            seg = chain.segments[i]
            shard = self._shard(seg.shard)
            args = [offset, max_records - records, max_bytes - nbytes, READ_CHUNK]
            reply = shard.run(
                f"read of {part.path}",
                shard.read,
                partition_keys(part, seg.seq),
                args,
                retry=True,
            )
            status, low, high = to_int(reply[0]), to_int(reply[1]), to_int(reply[2])
            sealed = to_int(reply[3])
            last = i == len(chain.segments) - 1
            if sealed == 2 or (seg.end is not None and sealed == 0):
                raise _Stale  # dropped, or a chain newer than this one's knowledge
            if status == READ_OUT_OF_RANGE:
                if out:
                    return out
                if attempt == 0:
                    raise _Stale
                o = self.offsets(part)
                raise self._out_of_range(part, from_offset, o.low, o.high)
            if status == READ_AT_END:
                if last:
                    if sealed and not out and attempt < 3:
                        raise _Stale  # a move sealed it: the chain has a newer segment
                    return out
                if seg.end is not None and high != seg.end:
                    raise TidegateError(
                        f"segment {seg.seq} of partition {part.path} ends at {high}, "
                        f"its placement says {seg.end}"
                    )
                i += 1
                continue
            if status != READ_OK:
                raise TidegateError(
                    f"hot log of partition {part.path} is inconsistent: no batch holds offset "
                    f"{offset} although it lies in [{low}, {high})"
                )
            batches = [self._batch(entry) for entry in cast("list[Any]", reply[4])]
            self._check_dense(part, offset, batches)
            out.extend(batches)
            offset = batches[-1].next_offset
            records = sum(b.count for b in out) - (from_offset - out[0].base_offset)
            nbytes = sum(len(b.payload) for b in out)
            if records >= max_records or nbytes >= max_bytes or offset < high or last:
                return out
            i += 1

    @staticmethod
    def _out_of_range(part: PartitionId, offset: int, low: int, high: int) -> OffsetOutOfRange:
        return OffsetOutOfRange(
            f"offset {offset} is outside [{low}, {high}] for partition {part.path}",
            offset=offset,
            earliest=low,
            latest=high,
        )

    @staticmethod
    def _check_dense(part: PartitionId, from_offset: int, batches: list[StoredBatch]) -> None:
        first = batches[0]
        if not first.base_offset <= from_offset < first.next_offset:
            raise TidegateError(
                f"hot log of partition {part.path} is inconsistent: offset {from_offset} "
                f"falls in a gap before {first.next_offset}"
            )
        for prev, nxt in itertools.pairwise(batches):
            if nxt.base_offset != prev.next_offset:
                raise TidegateError(
                    f"hot log of partition {part.path} is inconsistent: gap between "
                    f"offsets {prev.next_offset} and {nxt.base_offset}"
                )

    @staticmethod
    def _batch(entry: Any) -> StoredBatch:
        entry_id, raw_fields = cast("tuple[bytes, list[bytes]]", entry)
        fields = dict(zip(raw_fields[::2], raw_fields[1::2], strict=True))
        return StoredBatch(
            base_offset=int(entry_id.split(b"-", 1)[0]),
            count=int(fields[b"count"]),
            timestamp_us=int(fields[b"timestamp_us"]),
            payload=bytes(fields[b"payload"]),
        )

    def offsets(self, part: PartitionId) -> LogOffsets:
        for attempt in range(4):
            chain = self.chain(part, refresh=attempt > 0)
            try:
                metas = [
                    self._shard(seg.shard).meta(partition_keys(part, seg.seq))
                    for seg in chain.segments
                ]
            except Unavailable:
                if attempt > 0 or self._placements is None:
                    raise
                continue  # as in read(): reload the chain once before giving up
            found = _offsets_of(chain, metas, final=attempt >= 3)
            if found is None:
                if attempt == 2:
                    self._settle(part, chain)
                continue
            return found
        raise Unavailable(f"the placement of {part.path} keeps changing", backend="redis")

    def offsets_many(self, parts: Sequence[PartitionId]) -> list[LogOffsets]:
        # Every segment's meta in one pipeline per shard; a partition whose chain turns out
        # stale (a move under way) is looked at again alone, as offsets() does.
        chains = [self.chain(part) for part in parts]
        by_shard: dict[str, list[tuple[int, int, str]]] = {}
        for i, (part, chain) in enumerate(zip(parts, chains, strict=True)):
            for j, seg in enumerate(chain.segments):
                by_shard.setdefault(seg.shard, []).append((i, j, partition_keys(part, seg.seq)[1]))
        metas: list[list[Any]] = [[None] * len(c.segments) for c in chains]
        try:
            for name, items in by_shard.items():
                shard = self._shard(name)
                replies = shard.call(
                    "offsets",
                    functools.partial(_hmget_all, shard.client, [k for _, _, k in items]),
                    retry=True,
                )
                for (i, j, _), reply in zip(items, replies, strict=True):
                    metas[i][j] = reply
        except Unavailable:
            if self._placements is None:
                raise
            return [self.offsets(part) for part in parts]
        out = []
        for part, chain, m in zip(parts, chains, metas, strict=True):
            found = _offsets_of(chain, m, final=False)
            out.append(found if found is not None else self.offsets(part))
        return out


_META_FIELDS = ["low", "hw", "bytes", "sealed", "dropped"]


def _hmget_all(client: Any, keys: Sequence[str]) -> list[Any]:
    """``[low, hw, bytes, sealed, dropped]`` of each segment meta key, in one pipeline."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, _META_FIELDS)
    return cast("list[Any]", pipe.execute())


def _offsets_of(chain: Chain, metas: Sequence[Any], *, final: bool) -> LogOffsets | None:
    """A partition's offsets from its chain's segment metas, or None when the chain is
    stale (a segment dropped, sealed by a move, or newer than the chain knows) and not
    ``final``."""
    stale = any(
        m[4] is not None or (seg.end is not None and m[3] is None)
        for seg, m in zip(chain.segments, metas, strict=True)
    )
    if metas[-1][3] is not None:
        stale = True  # the active segment was sealed by a move
    if stale and not final:
        return None
    low = 0 if metas[0][0] is None else to_int(metas[0][0])
    for before, after in itertools.pairwise(metas):
        start = 0 if after[0] is None else to_int(after[0])
        if start > (0 if before[1] is None else to_int(before[1])):
            # A segment that starts above the end of the one before (started over after
            # lost state, or trimmed into): nothing below it is read.
            low = start
    high = 0 if metas[-1][1] is None else to_int(metas[-1][1])
    size = sum(0 if m[2] is None else to_int(m[2]) for m in metas)
    return LogOffsets(low=low, high=high, size_bytes=size)
