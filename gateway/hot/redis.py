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
                       p:<id>  idempotence state of producer <id>: its last batches as
                               ``seq,base,count;seq,base,count;...`` (oldest first)

The stream entry ID carries the batch's base offset, so the batch that contains offset ``o``
is the last entry whose ID is ``<= o-1``: ``XREVRANGE log o-1 - COUNT 1``.

Everything that assigns offsets or changes the low mark happens inside a Lua script, so
several gateway processes can share one Redis. Reads run a read-only script as well, so the
low mark, the high watermark and the entries they return are one consistent snapshot.
Durability is Redis's: run it with ``appendonly yes`` and ``appendfsync always`` for an
acknowledged batch to survive a crash of Redis itself.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import redis
import redis.exceptions as rex
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.retry import Retry

from gateway import metrics
from gateway.config import RedisHotConfig, RedisShardConfig, Settings
from gateway.hot.base import (
    AppendResult,
    HotLog,
    LogOffsets,
    PartitionId,
    ProducerSequence,
    StoredBatch,
)
from gateway.hot.placement import Chain, PlacementStore, Segment
from gateway.wire.errors import (
    InvalidIdempotentAppend,
    InvalidRequest,
    OffsetOutOfRange,
    OutOfOrderSequence,
    TidegateError,
    Unavailable,
)

__all__ = ["RedisHotLog", "partition_keys"]

T = TypeVar("T")

#: Sequences are compared as Lua numbers (doubles) inside the scripts: keep them exact.
MAX_SEQUENCE = 2**53 - 1
#: Entries removed per trim script call, so one trim never blocks Redis for long.
TRIM_CHUNK = 1024
#: Entries fetched per XRANGE call inside the read script.
READ_CHUNK = 256
#: Batches copied per round trip when a sealed segment is copied off a failing shard.
COPY_CHUNK = 128

_APPEND_OK, _APPEND_DUPLICATE, _OUT_OF_ORDER, _TOO_OLD, _COUNT_MISMATCH = 0, 1, 2, 3, 4
_APPEND_SEALED = 5
_READ_OUT_OF_RANGE, _READ_AT_END, _READ_OK, _READ_BROKEN = -1, 0, 1, -2

# Numbers travel as decimal strings and are never formatted by Lua (``tostring`` would
# switch to exponent notation above 1e14): IDs and stored fields reuse the input strings.
_LUA_COMMON = """
local function field(entry, name)
  local kv = entry[2]
  for i = 1, #kv, 2 do
    if kv[i] == name then return kv[i + 1] end
  end
  return nil
end
local function base_of(id)
  return string.match(id, '^(%d+)%-')
end
"""

_APPEND_LUA = """
-- KEYS: log, meta
-- ARGV: payload, count, timestamp_us, has_producer ('1'/'0'), producer_id, sequence, window
local log, meta = KEYS[1], KEYS[2]
local count = tonumber(ARGV[2])
local head = redis.call('HMGET', meta, 'hw', 'sealed')
local hw = head[1] or '0'
if head[2] then return {5, hw, '0'} end
local pfield, state, seq_s
if ARGV[4] == '1' then
  pfield = 'p:' .. ARGV[5]
  seq_s = ARGV[6]
  local seq = tonumber(seq_s)
  state = {}
  local raw = redis.call('HGET', meta, pfield)
  if raw then
    for s, b, c in string.gmatch(raw, '(%d+),(%d+),(%d+)') do
      state[#state + 1] = {s, b, c}
    end
  end
  if #state > 0 then
    local last = tonumber(state[#state][1])
    if seq > last + 1 then
      return {2, state[#state][1], state[1][1]}
    end
    if seq <= last then
      for _, e in ipairs(state) do
        if tonumber(e[1]) == seq then
          if tonumber(e[3]) ~= count then
            return {4, e[2], e[3]}
          end
          return {1, e[2], e[3]}
        end
      end
      return {3, state[#state][1], state[1][1]}
    end
  end
end
redis.call('XADD', log, hw .. '-1', 'payload', ARGV[1], 'count', ARGV[2],
           'timestamp_us', ARGV[3])
redis.call('HINCRBY', meta, 'hw', count)
redis.call('HINCRBY', meta, 'bytes', string.len(ARGV[1]))
if pfield then
  state[#state + 1] = {seq_s, hw, ARGV[2]}
  local window = tonumber(ARGV[7])
  local first = 1
  if #state > window then first = #state - window + 1 end
  local parts = {}
  for i = first, #state do
    parts[#parts + 1] = state[i][1] .. ',' .. state[i][2] .. ',' .. state[i][3]
  end
  redis.call('HSET', meta, pfield, table.concat(parts, ';'))
end
return {0, hw, ARGV[2]}
"""

_READ_LUA = (
    _LUA_COMMON
    + """
-- KEYS: log, meta
-- ARGV: from_offset, max_records, max_bytes, chunk
-- Returns {status, low, hw, sealed, entries}; status -1 out of range, 0 at the end, 1 ok,
-- -2 when no stored batch holds from_offset although low <= from_offset < hw.
local log, meta = KEYS[1], KEYS[2]
local m = redis.call('HMGET', meta, 'hw', 'low', 'sealed', 'dropped')
local hw_s, low_s = m[1] or '0', m[2] or '0'
local sealed = '0'
if m[4] then sealed = '2' elseif m[3] then sealed = '1' end
local hw, low, from = tonumber(hw_s), tonumber(low_s), tonumber(ARGV[1])
if from < low or from > hw then return {-1, low_s, hw_s, sealed} end
if from == hw then return {0, low_s, hw_s, sealed} end
local first = redis.call('XREVRANGE', log, ARGV[1] .. '-1', '-', 'COUNT', 1)
if #first == 0 then return {-2, low_s, hw_s, sealed} end
local e = first[1]
local max_records, max_bytes = tonumber(ARGV[2]), tonumber(ARGV[3])
local chunk = tonumber(ARGV[4])
local out = {e}
local records = tonumber(base_of(e[1])) + tonumber(field(e, 'count')) - from
local size = string.len(field(e, 'payload'))
local cursor = e[1]
local more = true
while more and records < max_records and size < max_bytes do
  local want = max_records - records
  if want > chunk then want = chunk end
  local batch = redis.call('XRANGE', log, '(' .. cursor, '+', 'COUNT', want)
  if #batch < want then more = false end
  for _, b in ipairs(batch) do
    out[#out + 1] = b
    cursor = b[1]
    records = records + tonumber(field(b, 'count'))
    size = size + string.len(field(b, 'payload'))
    if records >= max_records or size >= max_bytes then break end
  end
end
return {1, low_s, hw_s, sealed, out}
"""
)

_SEAL_LUA = """
-- KEYS: log, meta
-- ARGV: must_exist ('1': the segment was opened by a move, its meta cannot be missing)
-- Seals the segment (idempotent) and returns {hw, field, value, ...} with every producer's
-- de-duplication state, frozen from now on; {-1} when the segment is gone.
local meta = KEYS[2]
if ARGV[1] == '1' and redis.call('EXISTS', meta) == 0 then return {'-1'} end
redis.call('HSET', meta, 'sealed', '1')
local out = {redis.call('HGET', meta, 'hw') or '0'}
local all = redis.call('HGETALL', meta)
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'p:' then
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
"""

_OPEN_LUA = """
-- KEYS: log, meta
-- ARGV: start, field, value, ... (producer state carried from the sealed segment)
-- Opens the segment at `start` unless it exists; returns its start.
local meta = KEYS[2]
local start = redis.call('HGET', meta, 'start')
if start then return start end
redis.call('HSET', meta, 'start', ARGV[1], 'hw', ARGV[1], 'low', ARGV[1], 'bytes', '0')
for i = 2, #ARGV, 2 do
  redis.call('HSET', meta, ARGV[i], ARGV[i + 1])
end
return ARGV[1]
"""

_DROP_SEGMENT_LUA = """
-- KEYS: log, meta
-- ARGV: end
-- Drops a sealed segment's data, leaving a tombstone so that a gateway holding an old
-- placement can neither append to it nor read a wrong (empty) state from it.
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[2], 'sealed', '1', 'dropped', '1', 'hw', ARGV[1], 'low', ARGV[1],
           'bytes', '0')
return 1
"""

_TRIM_LUA = (
    _LUA_COMMON
    + """
-- KEYS: log, meta
-- ARGV: below_offset, limit
-- Removes at most `limit` whole batches ending at or below `below_offset`.
-- Returns {new_low, done}; done is 0 when batches to remove remain.
local log, meta = KEYS[1], KEYS[2]
local m = redis.call('HMGET', meta, 'hw', 'low')
local hw_s, low_s = m[1] or '0', m[2] or '0'
local hw, low, below = tonumber(hw_s), tonumber(low_s), tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
if below <= low then return {low_s, 1} end
local target_s = hw_s
if below < hw then
  local holder = redis.call('XREVRANGE', log, ARGV[1] .. '-1', '-', 'COUNT', 1)
  if #holder == 0 then
    return redis.error_reply('TIDEGATE no stored batch holds offset ' .. ARGV[1])
  end
  target_s = base_of(holder[1][1])
end
if tonumber(target_s) <= low then return {low_s, 1} end
local entries = redis.call('XRANGE', log, '-', '(' .. target_s .. '-1', 'COUNT', limit + 1)
local new_low_s, done, n = target_s, 1, #entries
if n > limit then
  new_low_s = base_of(entries[limit + 1][1])
  done = 0
  n = limit
end
local freed = 0
for i = 1, n do
  freed = freed + string.len(field(entries[i], 'payload'))
end
redis.call('XTRIM', log, 'MINID', new_low_s .. '-1')
redis.call('HINCRBY', meta, 'bytes', -freed)
redis.call('HSET', meta, 'low', new_low_s)
return {new_low_s, done}
"""
)

#: Server-side conditions that mean "try again later" rather than "your request is wrong".
_RETRYABLE_REPLIES = (
    rex.OutOfMemoryError,
    rex.ReadOnlyError,
    rex.TryAgainError,
    rex.ClusterDownError,
)
_RETRYABLE_REPLY_PREFIXES = ("OOM", "READONLY", "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN")


def _escape(path: str) -> str:
    # A '}' inside the hash tag would end it early; '%' is escaped so the mapping stays 1:1.
    return path.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def partition_keys(part: PartitionId, seq: int = 0) -> tuple[str, str]:
    """The ``(log, meta)`` keys of a partition's segment ``seq`` (segment 0 keeps the keys
    from before sharding); both hash to the same cluster slot."""
    tag = _escape(part.path) + (f"@{seq}" if seq else "")
    return f"tg:{{{tag}}}:log", f"tg:{{{tag}}}:meta"


def _pattern(prefix: str) -> str:
    for ch in "\\*?[]":
        prefix = prefix.replace(ch, "\\" + ch)
    return prefix + "*"


def partition_key_pattern(part: PartitionId) -> str:
    """A SCAN/KEYS pattern matching every key of the partition and nothing else."""
    tag = _escape(part.path)
    for ch in "\\*?[]":
        tag = tag.replace(ch, "\\" + ch)
    return f"tg:{{{tag}}}:*"


def _int(value: Any) -> int:
    return int(cast("bytes | int", value))


class _Stale(Exception):
    """The cached chain no longer matches what the shards hold: reload it."""


class _Shard:
    """One shard: a Redis server or a Redis Cluster, its scripts and error translation."""

    def __init__(
        self,
        name: str,
        url: str,
        *,
        cluster: bool,
        socket_timeout_s: float,
        read_retries: int,
    ) -> None:
        self.name = name
        client: Any
        if cluster:
            client = RedisCluster.from_url(
                url,
                socket_timeout=socket_timeout_s,
                socket_connect_timeout=socket_timeout_s,
                retry=Retry(NoBackoff(), 0),
            )
            self.where = f"cluster {url.rsplit('@', 1)[-1]}"
        else:
            pool = redis.ConnectionPool.from_url(
                url,
                socket_timeout=socket_timeout_s,
                socket_connect_timeout=socket_timeout_s,
                retry=Retry(NoBackoff(), 0),
            )
            client = redis.Redis(connection_pool=pool)
            kw = pool.connection_kwargs
            where = kw.get("path") or f"{kw.get('host', '?')}:{kw.get('port', '?')}"
            self.where = f"{where}/{kw.get('db', 0)}"
        self.client = client
        self._safe_retry = Retry(
            ExponentialBackoff(cap=0.5, base=0.05),
            read_retries,
            supported_errors=(rex.ConnectionError,),
        )
        self.append = client.register_script(_APPEND_LUA)
        self.read = client.register_script(_READ_LUA)
        self.trim = client.register_script(_TRIM_LUA)
        self.seal = client.register_script(_SEAL_LUA)
        self.open = client.register_script(_OPEN_LUA)
        self.drop_segment = client.register_script(_DROP_SEGMENT_LUA)

    def call(self, what: str, fn: Callable[[], T], *, retry: bool) -> T:
        """Run ``fn`` and translate redis-py errors into Tidegate errors."""
        try:
            if retry:
                return self._safe_retry.call_with_retry(fn, lambda _exc: None)
            return fn()
        except (rex.ConnectionError, rex.TimeoutError) as exc:
            # Without a reply a write may or may not have been applied.
            maybe = "" if retry else " (it may have been applied; resend it idempotently)"
            raise Unavailable(
                f"Redis hot tier shard {self.name!r} at {self.where} is unavailable during "
                f"{what}{maybe}: {exc}",
                backend="redis",
            ) from exc
        except rex.ResponseError as exc:
            text = str(exc)
            if isinstance(exc, _RETRYABLE_REPLIES) or text.startswith(_RETRYABLE_REPLY_PREFIXES):
                raise Unavailable(
                    f"Redis hot tier shard {self.name!r} at {self.where} cannot serve {what} "
                    f"now: {text}",
                    backend="redis",
                ) from exc
            raise TidegateError(f"Redis hot tier error during {what}: {text}") from exc

    def run(
        self, what: str, script: Script, keys: Sequence[str], args: Sequence[Any], *, retry: bool
    ) -> list[Any]:
        # Script.__call__ does EVALSHA and reloads the script after NOSCRIPT (e.g. a restart).
        return self.call(
            what,
            lambda: cast("list[Any]", script(keys=keys, args=args, client=self.client)),
            retry=retry,
        )

    def meta(self, keys: tuple[str, str]) -> list[Any]:
        """``[low, hw, bytes, sealed, dropped]`` of a segment (None where unset)."""
        fields = ["low", "hw", "bytes", "sealed", "dropped"]
        return self.call(
            "offsets",
            lambda: cast("list[Any]", self.client.hmget(keys[1], fields)),
            retry=True,
        )

    def delete(self, keys: Sequence[str], what: str) -> int:
        """Delete ``keys``; returns how many existed."""
        return int(self.call(what, lambda: self.client.delete(*keys), retry=True))

    def sweep(self, pattern: str, what: str) -> None:
        def go() -> None:
            for key in list(self.client.scan_iter(match=pattern, count=500)):
                self.client.delete(key)

        self.call(what, go, retry=True)

    def close(self) -> None:
        self.client.close()
        if isinstance(self.client, redis.Redis):
            self.client.connection_pool.disconnect()


class RedisHotLog(HotLog):
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
        self._shards: dict[str, _Shard] = {}
        try:
            for cfg in shards:
                self._shards[cfg.name] = _Shard(
                    cfg.name,
                    cfg.url,
                    cluster=cfg.cluster,
                    socket_timeout_s=socket_timeout_s,
                    read_retries=read_retries,
                )
        except BaseException:
            self.close()
            raise
        self._placements: PlacementStore | None = None
        self._chains: dict[PartitionId, Chain] = {}
        self._home = "default" if "default" in self._shards else next(iter(self._shards))

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisHotLog:
        cfg = settings.hot
        if not isinstance(cfg, RedisHotConfig):
            raise TypeError(f"the redis hot tier needs a redis hot section, not {cfg.type!r}")
        return cls(
            shards=cfg.shard_list(),
            socket_timeout_s=cfg.socket_timeout_s,
            producer_window=cfg.producer_window,
        )

    # Placement --------------------------------------------------------------------------
    def shard_names(self) -> list[str]:
        return list(self._shards)

    def bind_placements(self, store: PlacementStore) -> None:
        self._placements = store
        self._chains.clear()

    def _shard(self, name: str) -> _Shard:
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
        end = _int(reply[0])
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
        got = _int(
            target.run(
                f"open of {part.path}@{seq}",
                target.open,
                partition_keys(part, seq),
                [start, *producers],
                retry=True,
            )
        )
        if got != start:
            raise TidegateError(
                f"segment {seq} of partition {part.path} on {shard!r} starts at {got}, not {start}"
            )

    def finish_move(self, part: PartitionId) -> Chain:  # type: ignore[override]
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

    def move(self, part: PartitionId, target: str) -> Chain:  # type: ignore[override]
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
                    keys,
                    [seg.end],
                    retry=True,
                )
            return True
        raise Unavailable(f"the placement of {part.path} keeps changing", backend="redis")

    @staticmethod
    def _copied(dest: _Shard, keys: tuple[str, str], end: int) -> bool:
        """Whether ``dest`` holds a finished copy of a segment ending at ``end``."""
        _, hw, _, sealed, dropped = dest.meta(keys)
        return sealed is not None and dropped is None and hw is not None and _int(hw) == end

    def _copy_entries(
        self, part: PartitionId, seg: Segment, dest: _Shard, keys: tuple[str, str]
    ) -> bool:
        """Copy the segment's stored batches to ``dest`` afresh, then its meta hash; False
        when the source turned out dropped (the caller reloads the chain)."""
        source = self._shard(seg.shard)
        assert seg.end is not None
        _, hw, _, sealed, dropped = source.meta(keys)
        if dropped is not None:
            return False
        # A segment 0 sealed before its first append has no high watermark field: 0.
        if sealed is None or (0 if hw is None else _int(hw)) != seg.end:
            raise TidegateError(
                f"segment {seg.seq} of partition {part.path} on {seg.shard!r} is not sealed at "
                f"{seg.end} as its placement says: the shard lost data"
            )
        # Whatever the target holds under these keys is an unfinished copy of an earlier run.
        dest.delete(keys, f"copy of {part.path}@{seg.seq}")
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

    def held_bytes(self, segments: Sequence[tuple[PartitionId, int, str]]) -> list[int]:
        out = [0] * len(segments)
        by_shard: dict[str, list[int]] = {}
        for i, (_, _, shard) in enumerate(segments):
            by_shard.setdefault(shard, []).append(i)
        for name, indexes in by_shard.items():
            node = self._shard(name)

            def sizes(node: _Shard = node, indexes: list[int] = indexes) -> list[Any]:
                pipe = node.client.pipeline(transaction=False)
                for i in indexes:
                    part, seq, _ = segments[i]
                    pipe.hget(partition_keys(part, seq)[1], "bytes")
                return cast("list[Any]", pipe.execute())

            values = node.call("segment sizes", sizes, retry=True)
            for i, value in zip(indexes, values, strict=True):
                out[i] = 0 if value is None else _int(value)
        return out

    def _settle(self, part: PartitionId, seen: Chain) -> Chain:
        """Reload a chain after a shard said its active segment is sealed; when the store
        still names that segment active, a move stopped half way: finish it."""
        chain = self.chain(part, refresh=True)
        if chain.active == seen.active and chain.move_target is not None:
            chain = self.finish_move(part)
        return chain

    # HotLog -----------------------------------------------------------------------------
    def append(
        self,
        part: PartitionId,
        payload: bytes,
        count: int,
        timestamp_us: int,
        producer: ProducerSequence | None = None,
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
            status = _int(reply[0])
            if status != _APPEND_SEALED:
                result = self._append_result(part, status, reply, count, producer)
                if not result.duplicate:
                    metrics.record_shard_append(seg.shard, count, len(payload))
                return result
            # Refused, so not applied: safe to send again to the new active segment.
            metrics.record_sealed_retry(seg.shard)
            chain = self._settle(part, chain)
            if chain.active == seg:
                time.sleep(min(0.002 * (attempt + 1), 0.05))
        raise Unavailable(
            f"partition {part.path} is being moved; try again", backend="redis", retry_after_ms=100
        )

    @staticmethod
    def _append_result(
        part: PartitionId,
        status: int,
        reply: list[Any],
        count: int,
        producer: ProducerSequence | None,
    ) -> AppendResult:
        if status in (_APPEND_OK, _APPEND_DUPLICATE):
            return AppendResult(
                base_offset=_int(reply[1]),
                count=_int(reply[2]),
                duplicate=status == _APPEND_DUPLICATE,
            )
        assert producer is not None
        pid, seq = producer.producer_id, producer.sequence
        if status == _OUT_OF_ORDER:
            last = _int(reply[1])
            raise OutOfOrderSequence(
                f"producer {pid!r} sent sequence {seq} to partition {part.path}, "
                f"expected {last + 1}: resend the missing batches first",
                producer_id=pid,
                sequence=seq,
                expected_sequence=last + 1,
            )
        if status == _TOO_OLD:
            last, oldest = _int(reply[1]), _int(reply[2])
            raise InvalidIdempotentAppend(
                f"producer {pid!r} sent sequence {seq} to partition {part.path}, older than "
                f"the de-duplication window [{oldest}, {last}]",
                producer_id=pid,
                sequence=seq,
                last_sequence=last,
            )
        if status == _COUNT_MISMATCH:
            stored = _int(reply[2])
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
            status, low, high = _int(reply[0]), _int(reply[1]), _int(reply[2])
            sealed = _int(reply[3])
            last = i == len(chain.segments) - 1
            if sealed == 2 or (seg.end is not None and sealed == 0):
                raise _Stale  # dropped, or a chain newer than this one's knowledge
            if status == _READ_OUT_OF_RANGE:
                if out:
                    return out
                if attempt == 0:
                    raise _Stale
                o = self.offsets(part)
                raise self._out_of_range(part, from_offset, o.low, o.high)
            if status == _READ_AT_END:
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
            if status != _READ_OK:
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
            stale = any(
                m[4] is not None or (seg.end is not None and m[3] is None)
                for seg, m in zip(chain.segments, metas, strict=True)
            )
            if metas[-1][3] is not None and attempt < 3:
                stale = True  # the active segment was sealed by a move
            if stale and attempt < 3:
                if attempt == 2:
                    self._settle(part, chain)
                continue
            low = 0 if metas[0][0] is None else _int(metas[0][0])
            high = 0 if metas[-1][1] is None else _int(metas[-1][1])
            size = sum(0 if m[2] is None else _int(m[2]) for m in metas)
            return LogOffsets(low=low, high=high, size_bytes=size)
        raise Unavailable(f"the placement of {part.path} keeps changing", backend="redis")

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
                low, finished = _int(reply[0]), _int(reply[1])
                if finished:
                    return low
        raise Unavailable(f"the placement of {part.path} keeps changing", backend="redis")

    def drop(self, part: PartitionId) -> None:
        self._chains.pop(part, None)
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
        pattern = _pattern(f"tg:{{{_escape(f'{tenant}/')}")
        for shard in self._shards.values():
            shard.sweep(pattern, f"drop of tenant {tenant}")

    def close(self) -> None:
        for shard in self._shards.values():
            shard.close()
