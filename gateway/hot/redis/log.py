"""The Redis hot tier's :class:`~gateway.hot.HotLog`, :class:`RedisHotLog`: appends, reads,
offsets, trims and drops over the chain of each partition's segments (the placement and the
shard moves it inherits from :class:`~gateway.hot.redis.moves.ShardMoves`)."""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, cast

from gateway import metrics
from gateway.config import RedisHotConfig, RedisShardConfig, Settings
from gateway.hot.base import (
    AppendResult,
    LogOffsets,
    PartitionId,
    ProducerSequence,
    StoredBatch,
)
from gateway.hot.placement import Chain
from gateway.hot.redis.moves import ShardMoves
from gateway.hot.redis.scripts import (
    APPEND_DUPLICATE,
    APPEND_NO_STATE,
    APPEND_OK,
    APPEND_SEALED,
    COUNT_MISMATCH,
    MAX_SEQUENCE,
    OUT_OF_ORDER,
    READ_AT_END,
    READ_CHUNK,
    READ_OK,
    READ_OUT_OF_RANGE,
    TOO_OLD,
    TRIM_CHUNK,
    UNKNOWN_PRODUCER,
    partition_keys,
    tenant_key_pattern,
)
from gateway.hot.redis.shard import Shard, to_int
from gateway.wire.errors import (
    HotStateLost,
    InvalidIdempotentAppend,
    OffsetOutOfRange,
    OutOfOrderSequence,
    TidegateError,
    Unavailable,
)

__all__ = ["RedisHotLog"]


log = logging.getLogger(__name__)

#: Partitions whose highest high watermark :class:`RedisHotLog` remembers.
_SEEN_LIMIT = 65536


class _Stale(Exception):
    """The cached chain no longer matches what the shards hold: reload it."""


class RedisHotLog(ShardMoves):
    """A :class:`HotLog` on Redis streams over named shards, safe to share between gateway
    processes.

    Each partition is a virtual log (:mod:`gateway.hot.placement`) whose chain comes from
    the placement store bound with :meth:`bind_placements` and is cached; a shard that
    refuses an append to a sealed segment makes the chain reload, and the append go to the
    new active segment. Without a placement store (one shard, as before sharding) every
    partition is segment 0 on the one shard.

    Appends are sent once and never retried automatically when the reply is lost: it is
    then unknown whether the batch was stored, and only an idempotent producer can resend
    it safely. An append refused by a sealed segment was not applied and is sent again.
    Reads, offsets, trims and drops are retried a couple of times on connection errors.
    """

    name = "redis"

    def __init__(
        self,
        url: str | None = None,
        *,
        shards: Sequence[RedisShardConfig] = (),
        socket_timeout_s: float = 5.0,
        producer_window: int = 16,
        read_retries: int = 2,
        trim_chunk: int = TRIM_CHUNK,
        sealed_retries: int = 50,
    ) -> None:
        if producer_window < 1:
            raise ValueError("producer_window must be >= 1")
        if trim_chunk < 1:
            raise ValueError("trim_chunk must be >= 1")
        if not shards:
            if url is None:
                raise ValueError("a Redis hot tier needs a URL or shards")
            shards = [RedisShardConfig(name="default", url=url)]
        self._producer_window = producer_window
        self._trim_chunk = trim_chunk
        self._sealed_retries = sealed_retries
        self._shards = {}
        try:
            for cfg in shards:
                self._shards[cfg.name] = Shard(
                    cfg.name,
                    cfg.url,
                    cluster=cfg.cluster,
                    socket_timeout_s=socket_timeout_s,
                    read_retries=read_retries,
                )
        except BaseException:
            self.close()
            raise
        self._placements = None
        self._chains = {}
        self._home = "default" if "default" in self._shards else next(iter(self._shards))
        #: Partition -> the highest high watermark this process saw it reach (its appends),
        #: most recent last: an append is refused by a segment below it (a rolled-back
        #: Redis). Bounded; a partition forgotten is still guarded by the tiered watermark.
        self._seen: OrderedDict[PartitionId, int] = OrderedDict()

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisHotLog:
        cfg = settings.hot
        if not isinstance(cfg, RedisHotConfig):
            raise TypeError(f"the redis hot tier needs a redis hot section, not {cfg.type!r}")
        hot = cls(
            shards=cfg.shard_list(),
            socket_timeout_s=cfg.socket_timeout_s,
            producer_window=cfg.producer_window,
        )
        for shard in hot._shards.values():
            lost = shard.durability()
            if lost:
                log.warning(
                    "%s. Tidegate then never assigns an offset twice (it re-seeds the "
                    "partitions above every offset it knows was assigned), but acknowledged "
                    "records are gone: run Redis with appendonly yes and appendfsync always "
                    "to keep them (docs/durability.md)",
                    lost,
                )
        return hot

    # HotLog -----------------------------------------------------------------------------
    def append(
        self,
        part: PartitionId,
        payload: bytes,
        count: int,
        timestamp_us: int,
        producer: ProducerSequence | None = None,
        *,
        floor: int | None = None,
    ) -> AppendResult:
        if count < 1:
            raise ValueError(f"a batch holds at least one record, not {count}")
        args: list[Any] = [bytes(payload), count, timestamp_us]
        if producer is None:
            args += ["0", "", "0", self._producer_window]
        else:
            if not 0 <= producer.sequence <= MAX_SEQUENCE:
                raise InvalidIdempotentAppend(
                    f"producer sequence must be in [0, {MAX_SEQUENCE}], not {producer.sequence}",
                    producer_id=producer.producer_id,
                    sequence=producer.sequence,
                )
            args += ["1", producer.producer_id, producer.sequence, self._producer_window]
        seen = self._seen.get(part)
        args.append(-1 if floor is None and seen is None else max(floor or 0, seen or 0))
        chain = self.chain(part)
        for attempt in range(self._sealed_retries + 1):
            seg = chain.active
            shard = self._shard(seg.shard)
            reply = shard.run(
                f"append to {part.path}",
                shard.append,
                partition_keys(part, seg.seq),
                args,
                retry=False,
            )
            status = to_int(reply[0])
            if status == APPEND_NO_STATE:
                hw = to_int(reply[1])
                raise HotStateLost(
                    f"the Redis hot tier shard {seg.shard!r} holds "
                    + ("no state" if hw < 0 else f"an older state (high watermark {hw})")
                    + f" for partition {part.path}; it was emptied or rolled back",
                    backend="redis",
                )
            if status != APPEND_SEALED:
                result = self._append_result(part, status, reply, count, producer)
                if not result.duplicate:
                    metrics.record_shard_append(seg.shard, count, len(payload))
                self._saw(part, result.base_offset + result.count)
                return result
            # Refused, so not applied: safe to send again to the new active segment.
            metrics.record_sealed_retry(seg.shard)
            chain = self._settle(part, chain)
            if chain.active == seg:
                time.sleep(min(0.002 * (attempt + 1), 0.05))
        raise Unavailable(
            f"partition {part.path} is being moved; try again", backend="redis", retry_after_ms=100
        )

    def _saw(self, part: PartitionId, high: int) -> None:
        seen = self._seen
        if seen.get(part, -1) < high:
            seen[part] = high
        seen.move_to_end(part)
        if len(seen) > _SEEN_LIMIT:
            seen.popitem(last=False)

    def open_partition(self, part: PartitionId, floor: int) -> int:
        floor = max(floor, self._seen.get(part, 0))
        for attempt in range(self._sealed_retries + 1):
            chain = self.chain(part, refresh=attempt > 0)
            seg = chain.active
            shard = self._shard(seg.shard)
            start = max(floor, seg.start)
            reply = shard.run(
                f"opening {part.path}",
                shard.reopen,
                partition_keys(part, seg.seq),
                [start],
                retry=True,
            )
            if to_int(reply[0]):
                hw = to_int(reply[1])
                self._saw(part, hw)
                return hw
            self._settle(part, chain)  # sealed: a move made a newer segment
        raise Unavailable(f"the placement of {part.path} keeps changing", backend="redis")

    def open_partitions(self, parts: Sequence[PartitionId]) -> None:
        by_shard: dict[str, list[tuple[str, str]]] = {}
        for part, chain in zip(parts, self.chains(parts), strict=True):
            seg = chain.active
            by_shard.setdefault(seg.shard, []).append(partition_keys(part, seg.seq))
        for name, keys in by_shard.items():
            self._shard(name).reopen_many(keys, 0)

    @staticmethod
    def _append_result(
        part: PartitionId,
        status: int,
        reply: list[Any],
        count: int,
        producer: ProducerSequence | None,
    ) -> AppendResult:
        if status in (APPEND_OK, APPEND_DUPLICATE):
            return AppendResult(
                base_offset=to_int(reply[1]),
                count=to_int(reply[2]),
                duplicate=status == APPEND_DUPLICATE,
            )
        assert producer is not None
        pid, seq = producer.producer_id, producer.sequence
        if status == OUT_OF_ORDER:
            last = to_int(reply[1])
            raise OutOfOrderSequence(
                f"producer {pid!r} sent sequence {seq} to partition {part.path}, "
                f"expected {last + 1}: resend the missing batches first",
                producer_id=pid,
                sequence=seq,
                expected_sequence=last + 1,
            )
        if status == UNKNOWN_PRODUCER:
            raise producer.unknown(part.path)
        if status == TOO_OLD:
            last, oldest = to_int(reply[1]), to_int(reply[2])
            raise InvalidIdempotentAppend(
                f"producer {pid!r} sent sequence {seq} to partition {part.path}, older than "
                f"the de-duplication window [{oldest}, {last}]",
                producer_id=pid,
                sequence=seq,
                last_sequence=last,
            )
        if status == COUNT_MISMATCH:
            stored = to_int(reply[2])
            raise InvalidIdempotentAppend(
                f"producer {pid!r} resent sequence {seq} to partition {part.path} with "
                f"{count} records, but the stored batch holds {stored}",
                producer_id=pid,
                sequence=seq,
            )
        raise TidegateError(f"unexpected reply from the append script: {reply!r}")

    def read(
        self, part: PartitionId, from_offset: int, max_records: int, max_bytes: int
    ) -> list[StoredBatch]:
        for attempt in range(4):
            chain = self.chain(part, refresh=attempt > 0)
            try:
                return self._read_chain(
                    part, chain, from_offset, max(max_records, 1), max(max_bytes, 1), attempt
                )
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

    def needs_trim(self, part: PartitionId, below_offset: int) -> bool:
        # A sealed segment emptied by trims before its seal still waits to be dropped.
        chain = self.chain(part, refresh=self._placements is not None)
        if any(s.end is not None and s.end <= below_offset for s in chain.segments[:-1]):
            return True
        return super().needs_trim(part, below_offset)

    def trim(self, part: PartitionId, below_offset: int) -> int:
        for _ in range(20):
            chain = self.chain(part, refresh=self._placements is not None)
            segs = list(chain.segments)
            done = [s for s in segs[:-1] if s.end is not None and s.end <= below_offset]
            if done:
                rows = [s.row for s in segs[len(done) :]]
                store = self._placement_store()
                if not store.replace_chain(part.table_id, part.partition, chain.epoch, rows, False):
                    continue
                # Only once no placement names them: a gateway with an older one finds a
                # tombstone and reloads.
                for s in done:
                    shard = self._shard(s.shard)
                    shard.run(
                        f"drop of {part.path}@{s.seq}",
                        shard.drop_segment,
                        partition_keys(part, s.seq),
                        [s.end],
                        retry=True,
                    )
                segs = segs[len(done) :]
                self.chain(part, refresh=True)
            first = segs[0]
            shard = self._shard(first.shard)
            keys = partition_keys(part, first.seq)
            while True:
                reply = shard.run(
                    f"trim of {part.path}",
                    shard.trim,
                    keys,
                    [below_offset, self._trim_chunk],
                    retry=True,
                )
                low, finished = to_int(reply[0]), to_int(reply[1])
                if finished:
                    return low
        raise Unavailable(f"the placement of {part.path} keeps changing", backend="redis")

    def drop(self, part: PartitionId) -> None:
        self._chains.pop(part, None)
        self._seen.pop(part, None)
        # Segments are numbered 0, 1, 2... and each leaves at least its meta hash (a
        # tombstone once dropped) until now, so deleting them in order until a number no
        # shard holds finds them all, without the placement (gone first) or a SCAN.
        seq = 0
        while True:
            keys = partition_keys(part, seq)
            # One DEL per shard: a segment's keys share a slot.
            found = [shard.delete(keys, f"drop of {part.path}") for shard in self._shards.values()]
            if seq > 0 and not any(found):
                return
            seq += 1

    def drop_tenant(self, tenant: str) -> None:
        pattern = tenant_key_pattern(tenant)
        for shard in self._shards.values():
            shard.sweep(pattern, f"drop of tenant {tenant}")

    def close(self) -> None:
        for shard in self._shards.values():
            shard.close()


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
