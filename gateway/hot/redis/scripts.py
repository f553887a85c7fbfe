"""The Redis hot tier's Lua scripts, their reply codes and the keys they use: the names of a
segment's keys, of a partition's and of a tenant's (see :mod:`gateway.hot.redis` for the
layout)."""

from __future__ import annotations

from gateway.hot.base import PartitionId

__all__ = [
    "APPEND_DUPLICATE",
    "APPEND_HIGH_MOVED",
    "APPEND_LUA",
    "APPEND_NO_STATE",
    "APPEND_OK",
    "APPEND_SEALED",
    "COUNT_MISMATCH",
    "DROP_SEGMENT_LUA",
    "LOOKUP_LUA",
    "MAX_SEQUENCE",
    "OPEN_LUA",
    "OUT_OF_ORDER",
    "PRUNE_LUA",
    "READ_AT_END",
    "READ_BROKEN",
    "READ_CHUNK",
    "READ_LUA",
    "READ_OK",
    "READ_OUT_OF_RANGE",
    "REOPEN_LUA",
    "SEAL_LUA",
    "TOO_OLD",
    "TRIM_CHUNK",
    "TRIM_LUA",
    "UNKNOWN_PRODUCER",
    "partition_key_pattern",
    "partition_keys",
    "segment_keys",
    "tenant_key_pattern",
]

#: Sequences are compared as Lua numbers (doubles) inside the scripts: keep them exact.
MAX_SEQUENCE = 2**53 - 1
#: Entries removed per trim script call, so one trim never blocks Redis for long.
TRIM_CHUNK = 1024
#: Entries fetched per XRANGE call inside the read script.
READ_CHUNK = 256

APPEND_OK, APPEND_DUPLICATE, OUT_OF_ORDER, TOO_OLD, COUNT_MISMATCH = 0, 1, 2, 3, 4
APPEND_SEALED, APPEND_NO_STATE, UNKNOWN_PRODUCER, APPEND_HIGH_MOVED = 5, 6, 7, 8
READ_OUT_OF_RANGE, READ_AT_END, READ_OK, READ_BROKEN = -1, 0, 1, -2

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

APPEND_LUA = """
-- KEYS: log, meta, keys
-- ARGV: payload, count, timestamp_us, has_producer ('1'/'0'), producer_id, sequence, window,
--       floor, expect_high, counts_records ('1': a batch's sequence is the previous one's
--       plus its record count, modulo 2^31, Kafka's; '0': plus one; 'r': plus one, and a
--       retry is recognised by its sequence alone, whatever its count: a key-table's batch,
--       resolved again on a retry), then (key, position in the batch) pairs: each key's
--       last change
-- A count of 0 (with a producer) stores no entry: the producer's sequence advances alone.
-- With `expect_high` >= 0, refuses with {8, hw} when the high watermark is another (after
-- the producer's checks: a duplicate is answered as one). Each key of the pairs gets the
-- offset hw + position in the `keys` hash, with the batch: the index never differs from it.
-- (With `expect_high` the base is known, and the pairs carry the offsets: set as they are.)
-- With `floor` >= 0, refuses with {6, hw} when the segment has no state (never opened, or
-- lost with an emptied Redis) or its high watermark is below `floor` (rolled back):
-- offsets are never assigned from a state that may have forgotten some. With `floor` -1
-- (a caller that knows nothing of it) a segment without state starts at 0.
-- A producer the segment holds no state of may only start at sequence 0: {7} otherwise
-- (its earlier batches' state is unknown here, e.g. lost with an emptied Redis).
local log, meta = KEYS[1], KEYS[2]
local count = tonumber(ARGV[2])
local floor = tonumber(ARGV[8])
local head = redis.call('HMGET', meta, 'hw', 'sealed')
local hw = head[1]
if head[2] then return {5, hw or '0', '0'} end
if not hw then
  if floor >= 0 then return {6, '-1', '0'} end
  hw = '0'
end
if tonumber(hw) < floor then return {6, hw, '0'} end
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
    local expected = last + 1
    if ARGV[10] == '1' then
      expected = (last + tonumber(state[#state][3])) % 2147483648
    end
    if seq ~= expected then
      for i = #state, 1, -1 do
        local e = state[i]
        if tonumber(e[1]) == seq then
          if tonumber(e[3]) ~= count and ARGV[10] ~= 'r' then
            return {4, e[2], e[3]}
          end
          return {1, e[2], e[3]}
        end
      end
      if seq > expected then
        return {2, state[#state][1], state[#state][3]}
      end
      return {3, state[#state][1], state[1][1]}
    end
  elseif seq > 0 then
    return {7, '0', '0'}
  end
end
local expect = tonumber(ARGV[9] or '-1')
if expect >= 0 and tonumber(hw) ~= expect then return {8, hw, '0'} end
if count > 0 then
  redis.call('XADD', log, hw .. '-1', 'payload', ARGV[1], 'count', ARGV[2],
             'timestamp_us', ARGV[3])
end
if #ARGV > 10 and expect >= 0 then
  -- The base is known: the pairs carry the offsets themselves.
  for i = 11, #ARGV, 1000 do
    local j = i + 999
    if j > #ARGV then j = #ARGV end
    redis.call('HSET', KEYS[3], unpack(ARGV, i, j))
  end
elseif #ARGV > 10 then
  local base = tonumber(hw)
  local fields = {}
  for i = 11, #ARGV, 2 do
    fields[#fields + 1] = ARGV[i]
    fields[#fields + 1] = string.format('%.0f', base + tonumber(ARGV[i + 1]))
    if #fields >= 1000 then
      redis.call('HSET', KEYS[3], unpack(fields))
      fields = {}
    end
  end
  if #fields > 0 then redis.call('HSET', KEYS[3], unpack(fields)) end
end
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

READ_LUA = (
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
local held = tonumber(field(e, 'count'))
local records = tonumber(base_of(e[1])) + held - from
local size = string.len(field(e, 'payload'))
-- Records and bytes of the entries taken, whole: their averages say how many entries
-- the rest of the read (up to the high watermark) needs, so no XRANGE fetches (and
-- copies into Lua) entries the read does not answer with.
local taken_bytes = size
local cursor = e[1]
local more = true
while more and records < max_records and size < max_bytes do
  local n = #out
  local left = max_records - records
  if hw - from - records < left then left = hw - from - records end
  local want = math.ceil(left * n / held)
  local by_bytes = math.ceil((max_bytes - size) * n / math.max(taken_bytes, 1))
  if by_bytes < want then want = by_bytes end
  if want > chunk then want = chunk end
  if want < 1 then want = 1 end
  local batch = redis.call('XRANGE', log, '(' .. cursor, '+', 'COUNT', want)
  if #batch < want then more = false end
  for _, b in ipairs(batch) do
    out[#out + 1] = b
    cursor = b[1]
    local c = tonumber(field(b, 'count'))
    local l = string.len(field(b, 'payload'))
    held = held + c
    taken_bytes = taken_bytes + l
    records = records + c
    size = size + l
    if records >= max_records or size >= max_bytes then
      more = false
      break
    end
  end
end
return {1, low_s, hw_s, sealed, out}
"""
)

SEAL_LUA = """
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

OPEN_LUA = """
-- KEYS: log, meta
-- ARGV: start, field, value, ... (producer state carried from the sealed segment, then
-- the new segment's incarnation, as for the reopen script)
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

REOPEN_LUA = """
-- KEYS: log, meta, keys (the key index; optional)
-- ARGV: floor, incarnation
-- Opens a segment that has no state at `floor`, or starts it over, empty, at `floor` when
-- its high watermark is below (a rolled-back Redis: its entries and producer states are
-- from before what was acknowledged). A segment (re)started gets `incarnation`, a token
-- new to it, which key lookups answer: a process caching batches by offset learns that
-- the offsets now hold other records. Returns {1, hw}; {0, hw} for a sealed segment, left
-- alone (a move made a newer one).
local log, meta = KEYS[1], KEYS[2]
local m = redis.call('HMGET', meta, 'hw', 'sealed')
if m[2] then return {0, m[1] or '0'} end
if m[1] and tonumber(m[1]) >= tonumber(ARGV[1]) then return {1, m[1]} end
redis.call('DEL', log, meta)
if KEYS[3] then redis.call('DEL', KEYS[3]) end
redis.call('HSET', meta, 'start', ARGV[1], 'hw', ARGV[1], 'low', ARGV[1], 'bytes', '0',
           'inc', ARGV[2])
return {1, ARGV[1]}
"""

DROP_SEGMENT_LUA = """
-- KEYS: log, meta, keys (the key index; optional)
-- ARGV: end
-- Drops a sealed segment's data and key index, leaving a tombstone so that a gateway
-- holding an old placement can neither append to it nor read a wrong (empty) state from it.
redis.call('DEL', KEYS[1], KEYS[2])
if KEYS[3] then redis.call('DEL', KEYS[3]) end
redis.call('HSET', KEYS[2], 'sealed', '1', 'dropped', '1', 'hw', ARGV[1], 'low', ARGV[1],
           'bytes', '0')
return 1
"""

LOOKUP_LUA = """
-- KEYS: keys, meta
-- ARGV: key, ...
-- Returns {low, hw, state, offsets, incarnation}: state 0 open, 1 sealed, 2 dropped (no
-- offsets then); offsets in the order of ARGV, nil where the segment's index has none.
local m = redis.call('HMGET', KEYS[2], 'low', 'hw', 'sealed', 'dropped', 'inc')
local low, hw, inc = m[1] or '0', m[2] or '0', m[5] or ''
if m[4] then return {low, hw, 2, {}, inc} end
local state = 0
if m[3] then state = 1 end
local out = {}
local n = #ARGV
for i = 1, n, 1000 do
  local j = i + 999
  if j > n then j = n end
  local got = redis.call('HMGET', KEYS[1], unpack(ARGV, i, j))
  for k = 1, #got do out[#out + 1] = got[k] end
end
return {low, hw, state, out, inc}
"""

PRUNE_LUA = """
-- KEYS: keys, meta
-- ARGV: cursor, count
-- One HSCAN step over the key index, deleting entries below the segment's low mark (their
-- batches are trimmed). Returns the next cursor ('0' when the scan is over).
local low = tonumber(redis.call('HGET', KEYS[2], 'low') or '0')
local r = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local kv = r[2]
for i = 1, #kv, 2 do
  if tonumber(kv[i + 1]) < low then redis.call('HDEL', KEYS[1], kv[i]) end
end
return r[1]
"""

TRIM_LUA = (
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


def _escape(path: str) -> str:
    # A '}' inside the hash tag would end it early; '%' is escaped so the mapping stays 1:1.
    return path.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def partition_keys(part: PartitionId, seq: int = 0) -> tuple[str, str]:
    """The ``(log, meta)`` keys of a partition's segment ``seq`` (segment 0 keeps the keys
    from before sharding); both hash to the same cluster slot."""
    tag = _escape(part.path) + (f"@{seq}" if seq else "")
    return f"tg:{{{tag}}}:log", f"tg:{{{tag}}}:meta"


def segment_keys(part: PartitionId, seq: int = 0) -> tuple[str, str, str]:
    """The ``(log, meta, keys)`` keys of segment ``seq``: :func:`partition_keys` and the
    segment's key index (a primary-key table's hash: key bytes -> offset of its latest
    change in the segment), all three in one cluster slot."""
    log, meta = partition_keys(part, seq)
    return log, meta, meta[: -len("meta")] + "keys"


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


def tenant_key_pattern(tenant: str) -> str:
    """A SCAN pattern matching every key of the tenant's partitions."""
    return _pattern(f"tg:{{{_escape(f'{tenant}/')}")
