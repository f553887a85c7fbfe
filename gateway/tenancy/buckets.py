"""Token buckets for per-tenant rates: in-process, or in Redis shared by every replica.

A bucket holds up to ``burst`` tokens and refills at ``rate`` tokens per second. ``take``
admits a request of ``amount`` tokens when the bucket holds at least ``min(amount,
burst)`` (so a request larger than the burst is admitted from a full bucket and leaves it
in debt), and otherwise answers how long to wait. ``force`` charges without asking, for
costs known only afterwards (bytes a read returned): the debt delays later requests.

The Redis backend runs one Lua script per call (refill, decide, charge atomically), with
Redis's clock, so replicas never disagree about time. Keys are ``tg:quota:{<tenant>}:<kind>``
with a TTL of a few refill periods: an idle tenant holds nothing.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

from gateway.core.base import LruDict
from gateway.wire.errors import Unavailable

__all__ = ["BUCKETS_MAX", "LocalBuckets", "RedisBuckets", "TokenBuckets", "bucket_key"]

#: In-process token buckets kept at most (tenant x kind).
BUCKETS_MAX = 16384


def bucket_key(tenant: str, kind: str) -> str:
    return f"tg:quota:{{{tenant}}}:{kind}"


class TokenBuckets(ABC):
    @abstractmethod
    def take(
        self, tenant: str, kind: str, amount: float, rate: float, burst: float, force: bool = False
    ) -> int:
        """Take ``amount`` tokens; 0 when admitted, else milliseconds to wait (>= 1).

        Raises: Unavailable: the shared store cannot be reached.
        """

    @abstractmethod
    def forget(self, tenant: str) -> None:
        """Delete every bucket of the tenant."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


def _decide(
    tokens: float, amount: float, rate: float, burst: float, force: bool
) -> tuple[float, int]:
    need = min(amount, burst)
    if force or tokens >= need:
        return tokens - amount, 0
    return tokens, max(1, math.ceil((need - tokens) * 1000 / rate))


class LocalBuckets(TokenBuckets):
    """Buckets in this process (a single gateway, or no Redis configured)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # The least recently used bucket goes past the bound: the one idle longest, whose
        # tokens have most likely refilled to the burst anyway.
        self._buckets: LruDict[tuple[str, str], tuple[float, float]] = LruDict(BUCKETS_MAX)

    def take(
        self, tenant: str, kind: str, amount: float, rate: float, burst: float, force: bool = False
    ) -> int:
        now = time.monotonic()
        with self._lock:
            tokens, ts = self._buckets.get((tenant, kind), (burst, now))
            tokens = min(burst, tokens + max(0.0, now - ts) * rate)
            tokens, wait = _decide(tokens, amount, rate, burst, force)
            self._buckets[(tenant, kind)] = (tokens, now)
            return wait

    def forget(self, tenant: str) -> None:
        with self._lock:
            for key in [k for k in self._buckets if k[0] == tenant]:
                del self._buckets[key]


_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local amount = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local force = ARGV[4] == '1'
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1])
local ts = tonumber(b[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
local elapsed = now - ts
if elapsed < 0 then elapsed = 0 end
tokens = math.min(burst, tokens + elapsed * rate / 1000000)
local need = math.min(amount, burst)
local wait = 0
if force or tokens >= need then
  tokens = tokens - amount
else
  wait = math.max(1, math.ceil((need - tokens) * 1000 / rate))
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'ts', tostring(now))
local refill_ms = math.ceil((burst - math.min(tokens, 0)) * 1000 / rate)
redis.call('PEXPIRE', KEYS[1], refill_ms + 60000)
return wait
"""


class RedisBuckets(TokenBuckets):
    """Buckets in Redis, shared by every gateway replica that uses the same Redis."""

    def __init__(self, url: str, socket_timeout_s: float = 5.0) -> None:
        import redis

        self._redis: Any = redis.Redis.from_url(
            url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s
        )
        self._script = self._redis.register_script(_TAKE)

    def take(
        self, tenant: str, kind: str, amount: float, rate: float, burst: float, force: bool = False
    ) -> int:
        import redis

        try:
            return int(
                self._script(
                    keys=[bucket_key(tenant, kind)],
                    args=[
                        repr(float(amount)),
                        repr(float(rate)),
                        repr(float(burst)),
                        "1" if force else "0",
                    ],
                )
            )
        except redis.RedisError as exc:
            raise Unavailable(f"the quota store is unavailable: {exc}", backend="redis") from exc

    def forget(self, tenant: str) -> None:
        import redis

        try:
            keys = list(self._redis.scan_iter(match=bucket_key(tenant, "*"), count=500))
            if keys:
                self._redis.delete(*keys)
        except redis.RedisError as exc:
            raise Unavailable(f"the quota store is unavailable: {exc}", backend="redis") from exc

    def close(self) -> None:
        self._redis.close()
