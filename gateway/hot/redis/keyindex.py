"""The key index of a Redis hot tier partition (a primary-key table's): one hash per
segment, ``tg:{<tag>}:keys`` beside the segment's stream and meta (one cluster slot), field
= a key's routing bytes, value = the offset of its latest change in that segment. The
append script writes it with the batch (:data:`~gateway.hot.redis.scripts.APPEND_LUA`), so
the log and the index never differ.

A shard move opens the next segment with an empty index and copies nothing: a lookup asks
the segments newest first, and a key found in a newer one is answered from it. A sealed
segment dropped after tiering takes its index along (the drop script), a forced drain
copies it with the segment (:meth:`ShardMoves.copy_segment`), and a trim prunes the entries
below the new low mark. :class:`RedisKeyIndex` is the part of
:class:`~gateway.hot.redis.RedisHotLog` that answers lookups and counts.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

from gateway.hot.base import PartitionId
from gateway.hot.placement import Chain, Segment
from gateway.hot.redis.reads import ShardReads, _Stale
from gateway.hot.redis.scripts import segment_keys
from gateway.hot.redis.shard import to_int

__all__ = ["PRUNE_CHUNK", "RedisKeyIndex"]

#: Index entries looked at per prune step (one script call) after a trim.
PRUNE_CHUNK = 1024

#: The lookup script's segment states.
_OPEN, _SEALED, _DROPPED = 0, 1, 2


class RedisKeyIndex(ShardReads):
    """Lookups and counts of the key index, over the chains and shards of
    :class:`~gateway.hot.redis.reads.ShardReads`."""

    def latest_offsets(self, part: PartitionId, keys: Sequence[bytes]) -> list[int | None]:
        return self.key_offsets(part, keys)[0]

    def key_offsets(
        self, part: PartitionId, keys: Sequence[bytes]
    ) -> tuple[list[int | None], str | None]:
        wanted = [bytes(k) for k in keys]
        if not wanted:
            return [], None
        return self._on_chain(
            part, lambda chain, attempt: self._lookup(part, chain, wanted, final=attempt == 3)
        )

    def _lookup(
        self, part: PartitionId, chain: Chain, keys: list[bytes], *, final: bool
    ) -> tuple[list[int | None], str]:
        """Ask the chain's segments newest first, each for the keys no newer one holds;
        an entry below the low mark is trimmed (None), and so is every entry of a segment
        the log cannot be read in any more (a later one starts above its end). With the
        newest segment's incarnation. Raises _Stale when the chain is not what the shards
        hold, unless ``final`` (then what they hold is answered, as :meth:`offsets` does)."""
        out: list[int | None] = [None] * len(keys)
        pending = list(range(len(keys)))
        later_low: int | None = None
        incarnation = ""
        for i in range(len(chain.segments) - 1, -1, -1):
            seg = chain.segments[i]
            shard = self._shard(seg.shard)
            reply = shard.run(
                f"key lookup in {part.path}",
                shard.lookup,
                _index_and_meta(part, seg),
                [keys[j] for j in pending],
                retry=True,
            )
            low, high, state = to_int(reply[0]), to_int(reply[1]), to_int(reply[2])
            newest = i == len(chain.segments) - 1
            if newest:
                incarnation = _text(reply[4])
            if not final and (
                state == _DROPPED
                or (newest and state == _SEALED)
                or (seg.end is not None and state == _OPEN)
            ):
                # A move sealed it, tiering dropped it, or the chain is newer than this
                # one's knowledge of it.
                raise _Stale
            if later_low is not None and later_low > high:
                break  # the log starts over above this segment: nothing below is read
            values = cast("list[Any]", reply[3]) if state != _DROPPED else [None] * len(pending)
            left: list[int] = []
            for j, value in zip(pending, values, strict=True):
                if value is None:
                    left.append(j)
                elif (offset := to_int(value)) >= low:
                    out[j] = offset
                # else: the key's latest change is trimmed away; older segments are older.
            pending, later_low = left, low
            if not pending:
                break
        return out, incarnation

    def key_count(self, part: PartitionId) -> int:
        return self.key_counts([part])[0]

    def key_counts(self, parts: Sequence[PartitionId]) -> list[int]:
        # HLEN of every segment's hash, in one pipeline per shard.
        by_shard: dict[str, list[tuple[int, str]]] = {}
        for i, (part, chain) in enumerate(zip(parts, self.chains(parts), strict=True)):
            for seg in chain.segments:
                by_shard.setdefault(seg.shard, []).append((i, segment_keys(part, seg.seq)[2]))
        out = [0] * len(parts)
        for name, items in by_shard.items():
            shard = self._shard(name)
            keys = [key for _, key in items]
            counts = shard.call(
                "key counts", functools.partial(_hlen_all, shard.client, keys), retry=True
            )
            for (i, _), n in zip(items, counts, strict=True):
                out[i] += int(n)
        return out

    def _prune(self, part: PartitionId, seg: Segment) -> None:
        """Delete the segment's index entries below its low mark, one HSCAN step per
        script call (each short, so Redis never blocks long): after a trim moved it."""
        shard = self._shard(seg.shard)
        keys = _index_and_meta(part, seg)
        cursor: Any = "0"
        while True:
            cursor = shard.run(
                f"pruning the key index of {part.path}",
                shard.prune,
                keys,
                [cursor, PRUNE_CHUNK],
                retry=True,
            )
            if to_int(cursor) == 0:
                return


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _hlen_all(client: Any, keys: Sequence[str]) -> list[Any]:
    """``HLEN`` of each hash of ``keys``, in one pipeline."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hlen(key)
    return cast("list[Any]", pipe.execute())


def _index_and_meta(part: PartitionId, seg: Segment) -> list[str]:
    _, meta, index = segment_keys(part, seg.seq)
    return [index, meta]
