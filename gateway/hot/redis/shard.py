"""One named shard of the Redis hot tier: its client (a Redis server or a Redis Cluster), its
registered scripts, the retry of calls that are safe to repeat, the translation of redis-py
errors into Tidegate errors (which replies mean "try again later"), and key sweeps."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import redis
import redis.exceptions as rex
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.retry import Retry

from gateway.hot.redis.scripts import (
    APPEND_LUA,
    DROP_SEGMENT_LUA,
    LOOKUP_LUA,
    OPEN_LUA,
    PRUNE_LUA,
    READ_LUA,
    REOPEN_LUA,
    SEAL_LUA,
    TRIM_LUA,
)
from gateway.wire.errors import TidegateError, Unavailable

__all__ = ["Shard", "new_incarnation", "to_int"]

T = TypeVar("T")

#: Connections one process opens to one Redis shard at most (the gateway's I/O threads,
#: 32 by default, the lake jobs and the follow readers share them).
MAX_CONNECTIONS = 64

#: Server-side conditions that mean "try again later" rather than "your request is wrong".
_RETRYABLE_REPLIES = (
    rex.OutOfMemoryError,
    rex.ReadOnlyError,
    rex.TryAgainError,
    rex.ClusterDownError,
)
_RETRYABLE_REPLY_PREFIXES = ("OOM", "READONLY", "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN")


def new_incarnation() -> str:
    """A token for a segment started (or started over): no other start of any segment
    gets it, so a process that saw another token knows the segment's offsets may now
    hold other records (the reopen and open scripts)."""
    return os.urandom(8).hex()


def to_int(value: Any) -> int:
    """A number in a Redis reply (an integer, or the bytes of a decimal)."""
    return int(cast("bytes | int", value))


class Shard:
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
            # Bounded whatever the number of tenants and tables: a caller past the bound
            # waits for a connection (up to the socket timeout), then is refused as
            # unavailable, instead of opening one more socket.
            pool = redis.BlockingConnectionPool.from_url(
                url,
                socket_timeout=socket_timeout_s,
                socket_connect_timeout=socket_timeout_s,
                retry=Retry(NoBackoff(), 0),
                max_connections=MAX_CONNECTIONS,
                timeout=socket_timeout_s,
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
        self.append = client.register_script(APPEND_LUA)
        self.read = client.register_script(READ_LUA)
        self.trim = client.register_script(TRIM_LUA)
        self.seal = client.register_script(SEAL_LUA)
        self.open = client.register_script(OPEN_LUA)
        self.reopen = client.register_script(REOPEN_LUA)
        self.drop_segment = client.register_script(DROP_SEGMENT_LUA)
        self.lookup = client.register_script(LOOKUP_LUA)
        self.prune = client.register_script(PRUNE_LUA)

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

    def reopen_many(self, keys: Sequence[tuple[str, str, str]], floor: int) -> None:
        """Open the segments named by ``keys`` (their log, meta and key index) at
        ``floor`` (the reopen script), in one pipeline: a new table's partitions. (A Redis
        Cluster runs no script in a pipeline: there, one call each.)"""

        def go() -> None:
            if isinstance(self.client, RedisCluster):
                for segment in keys:
                    self.reopen(
                        keys=list(segment), args=[floor, new_incarnation()], client=self.client
                    )
                return
            pipe = self.client.pipeline(transaction=False)
            for segment in keys:
                self.reopen(keys=list(segment), args=[floor, new_incarnation()], client=pipe)
            pipe.execute()

        self.call("opening partitions", go, retry=True)

    def durability(self) -> str | None:
        """What this shard's server loses when it restarts, in a sentence, from its
        ``CONFIG GET appendonly / appendfsync / save``; None when it keeps every
        acknowledged write (``appendfsync always``) or will not say (CONFIG disabled, a
        cluster)."""
        try:
            raw = self.client.config_get("append*") | self.client.config_get("save")
        except (rex.RedisError, AttributeError, TypeError):
            return None
        config = {
            (k.decode() if isinstance(k, bytes) else str(k)): (
                v.decode() if isinstance(v, bytes) else str(v)
            )
            for k, v in raw.items()
        }
        where = f"Redis hot tier shard {self.name!r} at {self.where}"
        if config.get("appendonly") != "yes":
            save = config.get("save", "").strip()
            if not save:
                return (
                    f"{where} keeps nothing on disk (appendonly no, no RDB snapshots): a "
                    "restart of Redis loses every record not yet tiered"
                )
            return (
                f"{where} keeps only RDB snapshots (appendonly no, save {save!r}): a "
                "restart of Redis loses the records acknowledged since the last snapshot "
                "and not yet tiered"
            )
        if config.get("appendfsync") != "always":
            return (
                f"{where} fsyncs its append-only file {config.get('appendfsync', '?')!r}, not "
                "'always': a crash of its host may lose the last second of records"
            )
        return None

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
