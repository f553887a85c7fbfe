"""The Redis hot tier: named shards, one stream per partition segment, offsets assigned
server-side.

A partition's hot log is a chain of segments (see :mod:`gateway.hot.placement`), each on one
shard. Key layout, per segment (``<tag>`` is :attr:`PartitionId.path` for segment 0, the
layout from before sharding, and ``<path>@<seq>`` for later ones; hash-tagged so that a
segment's keys live in one Redis Cluster slot)::

    tg:{<tag>}:log     stream, one entry per appended batch
                       ID ``<base_offset>-1``; fields payload, count, timestamp_us
    tg:{<path>}:meta   hash
                       hw      high watermark (next offset to assign)
                       low     hot low mark (earliest offset still stored)
                       bytes   payload bytes stored
                       start   first offset of the segment (segments after the first)
                       sealed  '1' once sealed: appends are refused from then on
                       dropped '1' once tiered and dropped (a tombstone: log deleted)
                       inc     the segment's incarnation, new whenever it is (re)started
                               (answered by key lookups, so that a process caching
                               batches by offset sees a re-seed by another)
                       p:<id>  idempotence state of producer <id>: its last batches as
                               ``seq,base,count;seq,base,count;...`` (oldest first)
    tg:{<tag>}:keys    hash, a primary-key table's key index (:mod:`.keyindex`):
                       field = a key's routing bytes, value = the offset of its latest
                       change in this segment; written by the append script with the batch

The stream entry ID carries the batch's base offset, so the batch that contains offset ``o``
is the last entry whose ID is ``<= o-1``: ``XREVRANGE log o-1 - COUNT 1``.

Everything that assigns offsets or changes the low mark happens inside a Lua script, so
several gateway processes can share one Redis. Reads run a read-only script as well, so the
low mark, the high watermark and the entries they return are one consistent snapshot.
Durability is Redis's: run it with ``appendonly yes`` and ``appendfsync always`` for an
acknowledged batch to survive a crash of Redis itself.

Modules, one concern each: :mod:`~gateway.hot.redis.scripts` (the Lua scripts, their reply
codes and the key names above), :mod:`~gateway.hot.redis.shard` (one named shard's client,
retries, error translation and sweeps), :mod:`~gateway.hot.redis.moves` (the chains of
segments and the shard moves and copies) and :mod:`~gateway.hot.redis.log` (the
:class:`RedisHotLog` itself: appends, reads, offsets, trims and drops). The tunables are
read where they are used: set ``gateway.hot.redis.moves.COPY_CHUNK``, not this package's
copy of it.
"""

from gateway.hot.redis.log import RedisHotLog
from gateway.hot.redis.moves import COPY_CHUNK
from gateway.hot.redis.scripts import (
    MAX_SEQUENCE,
    READ_CHUNK,
    TRIM_CHUNK,
    partition_key_pattern,
    partition_keys,
)

__all__ = [
    "COPY_CHUNK",
    "MAX_SEQUENCE",
    "READ_CHUNK",
    "TRIM_CHUNK",
    "RedisHotLog",
    "partition_key_pattern",
    "partition_keys",
]
