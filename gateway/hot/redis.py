"""The Redis hot tier: one stream per table partition, offsets assigned server-side.

Key layout, per partition (``<path>`` is :attr:`PartitionId.path`, hash-tagged so that every
key of a partition lives in one Redis Cluster slot)::

    tg:{<path>}:log    stream, one entry per appended batch
                       ID ``<base_offset>-1``; fields payload, count, timestamp_us
    tg:{<path>}:meta   hash
                       hw      high watermark (next offset to assign)
                       low     hot low mark (earliest offset still stored)
                       bytes   payload bytes stored
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

import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import redis
import redis.exceptions as rex
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from gateway.config import RedisHotConfig, Settings
from gateway.hot.base import (
    AppendResult,
    HotLog,
    LogOffsets,
    PartitionId,
    ProducerSequence,
    StoredBatch,
)
from gateway.wire.errors import (
    InvalidIdempotentAppend,
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

_APPEND_OK, _APPEND_DUPLICATE, _OUT_OF_ORDER, _TOO_OLD, _COUNT_MISMATCH = 0, 1, 2, 3, 4
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
local hw = redis.call('HGET', meta, 'hw') or '0'
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
-- Returns {status, low, hw, entries}; status -1 out of range, 0 at the end, 1 ok,
-- -2 when no stored batch holds from_offset although low <= from_offset < hw.
local log, meta = KEYS[1], KEYS[2]
local m = redis.call('HMGET', meta, 'hw', 'low')
local hw_s, low_s = m[1] or '0', m[2] or '0'
local hw, low, from = tonumber(hw_s), tonumber(low_s), tonumber(ARGV[1])
if from < low or from > hw then return {-1, low_s, hw_s} end
if from == hw then return {0, low_s, hw_s} end
local first = redis.call('XREVRANGE', log, ARGV[1] .. '-1', '-', 'COUNT', 1)
if #first == 0 then return {-2, low_s, hw_s} end
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
return {1, low_s, hw_s, out}
"""
)

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


def partition_keys(part: PartitionId) -> tuple[str, str]:
    """The ``(log, meta)`` keys of a partition; both hash to the same cluster slot."""
    tag = _escape(part.path)
    return f"tg:{{{tag}}}:log", f"tg:{{{tag}}}:meta"


def partition_key_pattern(part: PartitionId) -> str:
    """A SCAN/KEYS pattern matching every key of the partition and nothing else."""
    tag = _escape(part.path)
    for ch in "\\*?[]":
        tag = tag.replace(ch, "\\" + ch)
    return f"tg:{{{tag}}}:*"


def _int(value: Any) -> int:
    return int(cast("bytes | int", value))


class RedisHotLog(HotLog):
    """A :class:`HotLog` on Redis streams, safe to share between gateway processes.

    Appends are sent once and never retried automatically: a lost reply leaves it unknown
    whether the batch was stored, and only an idempotent producer can resend it safely.
    Reads, offsets, trims and drops are retried a couple of times on connection errors.
    """

    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        socket_timeout_s: float = 5.0,
        producer_window: int = 16,
        read_retries: int = 2,
        trim_chunk: int = TRIM_CHUNK,
    ) -> None:
        if producer_window < 1:
            raise ValueError("producer_window must be >= 1")
        if trim_chunk < 1:
            raise ValueError("trim_chunk must be >= 1")
        self._producer_window = producer_window
        self._trim_chunk = trim_chunk
        self._pool = redis.ConnectionPool.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        self._client = redis.Redis(connection_pool=self._pool)
        self._safe_retry = Retry(
            ExponentialBackoff(cap=0.5, base=0.05),
            read_retries,
            supported_errors=(rex.ConnectionError,),
        )
        kw = self._pool.connection_kwargs
        where = kw.get("path") or f"{kw.get('host', '?')}:{kw.get('port', '?')}"
        self._where = f"{where}/{kw.get('db', 0)}"
        self._append_script = self._client.register_script(_APPEND_LUA)
        self._read_script = self._client.register_script(_READ_LUA)
        self._trim_script = self._client.register_script(_TRIM_LUA)

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisHotLog:
        cfg = settings.hot
        if not isinstance(cfg, RedisHotConfig):
            raise TypeError(f"the redis hot tier needs a redis hot section, not {cfg.type!r}")
        return cls(
            cfg.url,
            socket_timeout_s=cfg.socket_timeout_s,
            producer_window=cfg.producer_window,
        )

    # Plumbing ---------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T], *, retry: bool) -> T:
        """Run ``fn`` and translate redis-py errors into Tidegate errors."""
        try:
            if retry:
                return self._safe_retry.call_with_retry(fn, lambda _exc: None)
            return fn()
        except (rex.ConnectionError, rex.TimeoutError) as exc:
            # Without a reply a write may or may not have been applied.
            maybe = "" if retry else " (it may have been applied; resend it idempotently)"
            raise Unavailable(
                f"Redis hot tier at {self._where} is unavailable during {what}{maybe}: {exc}",
                backend="redis",
            ) from exc
        except rex.ResponseError as exc:
            text = str(exc)
            if isinstance(exc, _RETRYABLE_REPLIES) or text.startswith(_RETRYABLE_REPLY_PREFIXES):
                raise Unavailable(
                    f"Redis hot tier at {self._where} cannot serve {what} now: {text}",
                    backend="redis",
                ) from exc
            raise TidegateError(f"Redis hot tier error during {what}: {text}") from exc

    def _run(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        # Script.__call__ does EVALSHA and reloads the script after NOSCRIPT (e.g. a restart).
        return cast("list[Any]", script(keys=keys, args=args, client=self._client))

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
        keys = partition_keys(part)
        reply = self._call(
            f"append to {part.path}",
            lambda: self._run(self._append_script, keys, args),
            retry=False,
        )
        status = _int(reply[0])
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
        keys = partition_keys(part)
        args = [from_offset, max(max_records, 1), max(max_bytes, 1), READ_CHUNK]
        reply = self._call(
            f"read of {part.path}",
            lambda: self._run(self._read_script, keys, args),
            retry=True,
        )
        status, low, high = _int(reply[0]), _int(reply[1]), _int(reply[2])
        if status == _READ_OUT_OF_RANGE:
            raise OffsetOutOfRange(
                f"offset {from_offset} is outside [{low}, {high}] for partition {part.path}",
                offset=from_offset,
                earliest=low,
                latest=high,
            )
        if status == _READ_AT_END:
            return []
        if status != _READ_OK:
            raise TidegateError(
                f"hot log of partition {part.path} is inconsistent: no batch holds offset "
                f"{from_offset} although it lies in [{low}, {high})"
            )
        batches = [self._batch(entry) for entry in cast("list[Any]", reply[3])]
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
        return batches

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
        _, meta = partition_keys(part)
        reply = self._call(
            f"offsets of {part.path}",
            lambda: cast("list[Any]", self._client.hmget(meta, ["low", "hw", "bytes"])),
            retry=True,
        )
        low, high, size = (0 if v is None else _int(v) for v in reply)
        return LogOffsets(low=low, high=high, size_bytes=size)

    def trim(self, part: PartitionId, below_offset: int) -> int:
        keys = partition_keys(part)
        while True:
            reply = self._call(
                f"trim of {part.path}",
                lambda: self._run(self._trim_script, keys, [below_offset, self._trim_chunk]),
                retry=True,
            )
            low, done = _int(reply[0]), _int(reply[1])
            if done:
                return low

    def drop(self, part: PartitionId) -> None:
        keys = partition_keys(part)
        # One DEL: the keys share a slot, and a reader never sees half a partition.
        self._call(f"drop of {part.path}", lambda: self._client.delete(*keys), retry=True)

    def drop_tenant(self, tenant: str) -> None:
        tag = _escape(f"{tenant}/")
        for ch in "\\*?[]":
            tag = tag.replace(ch, "\\" + ch)
        pattern = f"tg:{{{tag}*"

        def sweep() -> None:
            for key in list(self._client.scan_iter(match=pattern, count=500)):
                self._client.delete(key)

        self._call(f"drop of tenant {tenant}", sweep, retry=True)

    def close(self) -> None:
        self._client.close()
        self._pool.disconnect()
