"""The Redis hot tier's :class:`~gateway.hot.HotLog`, :class:`RedisHotLog`: appends, trims
and drops over the chain of each partition's segments (its reads and offsets it inherits from
:class:`~gateway.hot.redis.reads.ShardReads`, the placement and the shard moves from
:class:`~gateway.hot.redis.moves.ShardMoves`)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from gateway import metrics
from gateway.config import RedisHotConfig, RedisShardConfig, Settings
from gateway.hot.base import (
    AppendResult,
    PartitionId,
    ProducerSequence,
    high_moved,
)
from gateway.hot.keyindex import batch_keys, last_changes
from gateway.hot.redis.keyindex import RedisKeyIndex
from gateway.hot.redis.scripts import (
    APPEND_DUPLICATE,
    APPEND_HIGH_MOVED,
    APPEND_NO_STATE,
    APPEND_OK,
    APPEND_SEALED,
    COUNT_MISMATCH,
    MAX_SEQUENCE,
    OUT_OF_ORDER,
    TOO_OLD,
    TRIM_CHUNK,
    UNKNOWN_PRODUCER,
    partition_keys,
    segment_keys,
    tenant_key_pattern,
)
from gateway.hot.redis.shard import Shard, new_incarnation, to_int
from gateway.wire.errors import (
    HotStateLost,
    InvalidIdempotentAppend,
    OutOfOrderSequence,
    TidegateError,
    Unavailable,
)

__all__ = ["RedisHotLog"]


log = logging.getLogger(__name__)

#: Partitions whose highest high watermark :class:`RedisHotLog` remembers.
_SEEN_LIMIT = 65536


class RedisHotLog(RedisKeyIndex):
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
    shared = True

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
        keys: Sequence[bytes] | None = None,
        expect_high: int | None = None,
    ) -> AppendResult:
        if count < (0 if producer is not None else 1):
            raise ValueError(f"a batch holds at least one record, not {count}")
        keyed = batch_keys(keys, count)
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
        args.append(-1 if expect_high is None else expect_high)
        args.append(
            "0"
            if producer is None
            else "1"
            if producer.counts_records
            else "r"
            if producer.resolved
            else "0"
        )
        if keyed is not None:
            # With expect_high the base offset is known: the script sets the offsets as
            # they are (no arithmetic per key in Lua, a third of a keyed append's cost).
            base = 0 if expect_high is None else expect_high
            for key, position in last_changes(keyed).items():
                args += [key, base + position]
        chain = self.chain(part)
        for attempt in range(self._sealed_retries + 1):
            seg = chain.active
            shard = self._shard(seg.shard)
            reply = shard.run(
                f"append to {part.path}",
                shard.append,
                segment_keys(part, seg.seq),
                args,
                retry=False,
            )
            status = to_int(reply[0])
            if status == APPEND_HIGH_MOVED:
                assert expect_high is not None
                raise high_moved(part, expect_high, to_int(reply[1]))
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
                segment_keys(part, seg.seq),
                [start, new_incarnation()],
                retry=True,
            )
            if to_int(reply[0]):
                hw = to_int(reply[1])
                self._saw(part, hw)
                return hw
            self._settle(part, chain)  # sealed: a move made a newer segment
        raise Unavailable(f"the placement of {part.path} keeps changing", backend="redis")

    def open_partitions(self, parts: Sequence[PartitionId]) -> None:
        by_shard: dict[str, list[tuple[str, str, str]]] = {}
        for part, chain in zip(parts, self.chains(parts), strict=True):
            seg = chain.active
            by_shard.setdefault(seg.shard, []).append(segment_keys(part, seg.seq))
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
            expected = producer.expected(to_int(reply[1]), to_int(reply[2]))
            raise OutOfOrderSequence(
                f"producer {pid!r} sent sequence {seq} to partition {part.path}, "
                f"expected {expected}: resend the missing batches first",
                producer_id=pid,
                sequence=seq,
                expected_sequence=expected,
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
                        segment_keys(part, s.seq),
                        [s.end],
                        retry=True,
                    )
                segs = segs[len(done) :]
                self.chain(part, refresh=True)
            first = segs[0]
            shard = self._shard(first.shard)
            keys = partition_keys(part, first.seq)
            before = shard.meta(keys)[0]
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
                    if low > (0 if before is None else to_int(before)):
                        self._prune(part, first)
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
            keys = segment_keys(part, seq)
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
