"""Where a Redis hot tier partition's segments are, and how they move between shards: the
chain of each partition (cached over the placement store), the steps of a move (begin, seal,
open, finish), the copy of a sealed segment off a failing shard, and the bytes each segment
holds. :class:`ShardMoves` is the part of :class:`~gateway.hot.redis.RedisHotLog` that does
it (see :mod:`gateway.hot.placement` for the model)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Sequence
from typing import Any, cast

from gateway import metrics
from gateway.hot.base import PartitionId, ShardedHotLog
from gateway.hot.placement import Chain, PlacementStore, Segment
from gateway.hot.redis.scripts import partition_keys, segment_keys
from gateway.hot.redis.shard import Shard, new_incarnation, to_int
from gateway.wire.errors import InvalidRequest, TidegateError, Unavailable

__all__ = ["COPY_CHUNK", "ShardMoves"]

#: Batches copied per round trip when a sealed segment is copied off a failing shard.
COPY_CHUNK = 128


class ShardMoves(ShardedHotLog):
    """The placement and shard moves of :class:`~gateway.hot.redis.RedisHotLog`, over its
    shards, its placement store (bound with :meth:`bind_placements`) and its chain cache."""

    # Set by RedisHotLog.__init__.
    _shards: dict[str, Shard]
    _placements: PlacementStore | None
    _chains: dict[PartitionId, Chain]
    _home: str

    # Placement --------------------------------------------------------------------------
    def shard_names(self) -> list[str]:
        return list(self._shards)

    def bind_placements(self, store: PlacementStore) -> None:
        self._placements = store
        self._chains.clear()

    def _shard(self, name: str) -> Shard:
        try:
            return self._shards[name]
        except KeyError:
            raise Unavailable(
                f"hot-tier shard {name!r} is not configured in this process", backend="redis"
            ) from None

    def chain(self, part: PartitionId, *, refresh: bool = False) -> Chain:
        """The partition's chain of segments (cached; ``refresh`` reloads it)."""
        if not refresh:
            cached = self._chains.get(part)
            if cached is not None:
                return cached
        if self._placements is None:
            chain = Chain(0, (Segment(0, self._home, 0, None),))
        else:
            try:
                chain = Chain.of(*self._placements.chain(part.table_id, part.partition))
            except KeyError:  # not (or no longer) in the store: the layout before sharding
                chain = Chain(0, (Segment(0, self._home, 0, None),))
        self._chains[part] = chain
        return chain

    def chains(self, parts: Sequence[PartitionId]) -> list[Chain]:
        """The chains of ``parts`` (cached), those not cached read one table at a time
        (:meth:`PlacementStore.chains`): a new table's partitions cost two queries, not
        two per partition."""
        missing = {p.table_id for p in parts if p not in self._chains}
        if self._placements is not None:
            for table_id in missing:
                found = self._placements.chains(table_id)
                for part in parts:
                    if part.table_id == table_id and part.partition in found:
                        self._chains[part] = Chain.of(*found[part.partition])
        return [self.chain(p) for p in parts]

    def _placement_store(self) -> PlacementStore:
        if self._placements is None:
            raise InvalidRequest("moving partitions needs the metadata store's placements")
        return self._placements

    def begin_move(self, part: PartitionId, target: str) -> str | None:
        """Step 1 of a move: record its target (the intent). Returns the move under way
        (an older, unfinished one wins and is to be finished first); None when there is
        nothing to do (the partition already takes appends on ``target``)."""
        self._shard(target)
        chain = self.chain(part, refresh=True)
        if chain.move_target is None and chain.active.shard == target:
            return None
        return self._placement_store().begin_move(part.table_id, part.partition, target)

    def seal(self, part: PartitionId, segment: Segment) -> tuple[int, list[Any]]:
        """Step 2: seal ``segment`` on its shard (idempotent). From now on the shard refuses
        appends to it. Returns its high watermark and the producers' state."""
        keys = partition_keys(part, segment.seq)
        reply = self._shard(segment.shard).run(
            f"seal of {part.path}@{segment.seq}",
            self._shard(segment.shard).seal,
            keys,
            ["1" if segment.seq else "0"],
            retry=True,
        )
        end = to_int(reply[0])
        if end < 0:
            raise TidegateError(
                f"segment {segment.seq} of partition {part.path} is missing from shard "
                f"{segment.shard!r}: the shard lost data"
            )
        return end, list(reply[1:])

    def open_segment(
        self, part: PartitionId, seq: int, shard: str, start: int, producers: list[Any]
    ) -> None:
        """Step 3: open segment ``seq`` on ``shard`` at ``start`` with the producers'
        de-duplication state (idempotent: an existing segment is left as it is)."""
        target = self._shard(shard)
        got = to_int(
            target.run(
                f"open of {part.path}@{seq}",
                target.open,
                partition_keys(part, seq),
                [start, *producers, "inc", new_incarnation()],
                retry=True,
            )
        )
        if got != start:
            raise TidegateError(
                f"segment {seq} of partition {part.path} on {shard!r} starts at {got}, not {start}"
            )

    def finish_move(self, part: PartitionId) -> Chain:
        """Finish the move under way, whoever started it: seal, open, record the chain
        (step 4, a compare-and-set on the epoch). Every step is idempotent, so a gateway
        that finds a sealed segment, or the next mover after a crash, completes it."""
        store = self._placement_store()
        for _ in range(20):
            chain = self.chain(part, refresh=True)
            target = chain.move_target
            if target is None:
                return chain
            active = chain.active
            end, producers = self.seal(part, active)
            nxt = Segment(active.seq + 1, target, end, None)
            self.open_segment(part, nxt.seq, nxt.shard, end, producers)
            rows = [s.row for s in chain.segments[:-1]]
            rows += [(active.seq, active.shard, active.start, end), nxt.row]
            if store.replace_chain(part.table_id, part.partition, chain.epoch, rows, True):
                return self.chain(part, refresh=True)
        raise Unavailable(f"the placement of {part.path} keeps changing", backend="redis")

    def move(self, part: PartitionId, target: str) -> Chain:
        """Move the partition's appends to ``target`` without copying: seal the active
        segment at its high watermark and continue the log in a new segment there.

        Raises:
            InvalidRequest: no placement store is bound.
            Unavailable: a shard cannot be reached (the move is left under way: run it
                again, or let the gateways finish it).
        """
        started = time.monotonic()
        source = self.chain(part, refresh=True).active.shard
        for _ in range(3):
            pending = self.begin_move(part, target)
            if pending is None:
                return self.chain(part)
            chain = self.finish_move(part)
            if pending == target:
                metrics.record_move(source, target, time.monotonic() - started)
                return chain
        return self.chain(part, refresh=True)

    def copy_segment(self, part: PartitionId, seq: int, target: str) -> bool:
        """Copy sealed segment ``seq`` (what of it is still stored) to shard ``target``
        under the same keys, then name the copy in the chain in its place (a
        compare-and-set on the epoch) and leave a tombstone on the source: the fallback
        that empties a failing shard without waiting for tiering.

        Batches keep their stream IDs (base offsets) and append times; producers'
        de-duplication state is not copied (a sealed segment takes no appends). The copy's
        meta hash is written last, so a crash leaves either no usable copy (the chain still
        names the source; the next run starts the copy again) or a finished one, named by
        the chain or not yet (the next run reuses it). Returns False when there was nothing
        to do (the segment is already on ``target``, or was dropped by trimming).

        Raises:
            InvalidRequest: the segment is the active one (move the partition first), or
                ``target`` is not a shard. Unavailable: a shard cannot be reached.
        """
        store = self._placement_store()
        dest = self._shard(target)
        keys = partition_keys(part, seq)
        for _ in range(20):
            chain = self.chain(part, refresh=True)
            seg = next((s for s in chain.segments if s.seq == seq), None)
            if seg is None or seg.shard == target:
                return False
            if seg.end is None:
                raise InvalidRequest(
                    f"segment {seq} of partition {part.path} is active: move the partition "
                    "before copying it",
                    shard=seg.shard,
                )
            copied = self._copied(dest, keys, seg.end)
            if not copied and not self._copy_entries(part, seg, dest, keys):
                continue  # dropped meanwhile: the chain has changed
            rows = [
                (s.seq, target if s is seg else s.shard, s.start, s.end) for s in chain.segments
            ]
            if not store.replace_chain(part.table_id, part.partition, chain.epoch, rows, False):
                continue
            self.chain(part, refresh=True)
            source = self._shard(seg.shard)
            # A gateway still naming the source finds a tombstone and reloads; a failing
            # shard on its way out may keep its (stale but correct) copy.
            with contextlib.suppress(Unavailable):
                source.run(
                    f"drop of {part.path}@{seq} on {seg.shard}",
                    source.drop_segment,
                    segment_keys(part, seq),
                    [seg.end],
                    retry=True,
                )
            return True
        raise Unavailable(f"the placement of {part.path} keeps changing", backend="redis")

    @staticmethod
    def _copied(dest: Shard, keys: tuple[str, str], end: int) -> bool:
        """Whether ``dest`` holds a finished copy of a segment ending at ``end``."""
        _, hw, _, sealed, dropped = dest.meta(keys)
        return sealed is not None and dropped is None and hw is not None and to_int(hw) == end

    def _copy_entries(
        self, part: PartitionId, seg: Segment, dest: Shard, keys: tuple[str, str]
    ) -> bool:
        """Copy the segment's stored batches to ``dest`` afresh, then its meta hash; False
        when the source turned out dropped (the caller reloads the chain)."""
        source = self._shard(seg.shard)
        assert seg.end is not None
        _, hw, _, sealed, dropped = source.meta(keys)
        if dropped is not None:
            return False
        # A segment 0 sealed before its first append has no high watermark field: 0.
        if sealed is None or (0 if hw is None else to_int(hw)) != seg.end:
            raise TidegateError(
                f"segment {seg.seq} of partition {part.path} on {seg.shard!r} is not sealed at "
                f"{seg.end} as its placement says: the shard lost data"
            )
        # Whatever the target holds under these keys is an unfinished copy of an earlier run.
        index = segment_keys(part, seg.seq)[2]
        dest.delete([*keys, index], f"copy of {part.path}@{seg.seq}")
        first: int | None = None
        nbytes = 0
        cursor = "-"
        while True:

            def fetch(after: str = cursor) -> list[Any]:
                return cast(
                    "list[Any]",
                    source.client.xrange(keys[0], min=after, max="+", count=COPY_CHUNK),
                )

            entries = source.call(f"copy of {part.path}@{seg.seq}", fetch, retry=True)
            if not entries:
                break

            def write(batch: list[Any] = entries) -> None:
                pipe = dest.client.pipeline(transaction=False)
                for entry_id, fields in batch:
                    pipe.xadd(keys[0], fields, id=entry_id)
                pipe.execute()

            dest.call(f"copy of {part.path}@{seg.seq} to {dest.name}", write, retry=False)
            if first is None:
                first = int(entries[0][0].split(b"-", 1)[0])
            nbytes += sum(len(fields[b"payload"]) for _, fields in entries)
            cursor = "(" + entries[-1][0].decode()
            if len(entries) < COPY_CHUNK:
                break
        self._copy_index(part, seg, dest, index)
        meta: dict[str, Any] = {
            "low": seg.end if first is None else first,
            "hw": seg.end,
            "bytes": nbytes,
            "sealed": "1",
        }
        if seg.seq:
            meta["start"] = seg.start
        dest.call(
            f"copy of {part.path}@{seg.seq} to {dest.name}",
            lambda: dest.client.hset(keys[1], mapping=meta),
            retry=True,
        )
        return True

    def _copy_index(self, part: PartitionId, seg: Segment, dest: Shard, index: str) -> None:
        """Copy the segment's key index (a primary-key table's) to ``dest``, before its
        meta hash (what makes the copy usable) is written."""
        source = self._shard(seg.shard)
        what = f"copy of the key index of {part.path}@{seg.seq}"
        cursor: Any = 0
        while True:

            def scan(at: Any = cursor) -> tuple[Any, dict[bytes, bytes]]:
                return cast(
                    "tuple[Any, dict[bytes, bytes]]",
                    source.client.hscan(index, at, count=COPY_CHUNK * 8),
                )

            cursor, fields = source.call(what, scan, retry=True)
            if fields:
                dest.call(
                    what, functools.partial(dest.client.hset, index, mapping=fields), retry=True
                )
            if int(cursor) == 0:
                return

    def held_bytes(self, segments: Sequence[tuple[PartitionId, int, str]]) -> list[int]:
        out = [0] * len(segments)
        by_shard: dict[str, list[int]] = {}
        for i, (_, _, shard) in enumerate(segments):
            by_shard.setdefault(shard, []).append(i)
        for name, indexes in by_shard.items():
            node = self._shard(name)

            def sizes(node: Shard = node, indexes: list[int] = indexes) -> list[Any]:
                pipe = node.client.pipeline(transaction=False)
                for i in indexes:
                    part, seq, _ = segments[i]
                    pipe.hget(partition_keys(part, seq)[1], "bytes")
                return cast("list[Any]", pipe.execute())

            values = node.call("segment sizes", sizes, retry=True)
            for i, value in zip(indexes, values, strict=True):
                out[i] = 0 if value is None else to_int(value)
        return out

    def _settle(self, part: PartitionId, seen: Chain) -> Chain:
        """Reload a chain after a shard said its active segment is sealed; when the store
        still names that segment active, a move stopped half way: finish it."""
        chain = self.chain(part, refresh=True)
        if chain.active == seen.active and chain.move_target is not None:
            chain = self.finish_move(part)
        return chain
