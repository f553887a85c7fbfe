"""Who is calling: API keys and the operator key.

Authentication reads the key and its tenant's status from the metadata store (one indexed
query) and reuses what it read for ``auth.key_cache_ttl_s`` (1 s): the secret is still
checked against the stored digest on every request. A revoked key or a suspended tenant is
refused at once by the replica that revoked or suspended it (it drops what it cached) and by
every other replica within the TTL.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from gateway.config import Settings
from gateway.meta.tenants import KeyRecordView, TenantStore
from gateway.tenancy import keys
from gateway.wire.errors import TenantSuspended, Unauthenticated

__all__ = ["OPERATOR_KEY_FILE", "Authenticator", "Principal", "bearer_key", "load_operator_key"]

P = ParamSpec("P")
R = TypeVar("R")

OPERATOR_KEY_FILE = "operator.key"
#: Most API keys whose lookup a gateway keeps (``auth.key_cache_ttl_s``); past it the
#: oldest go first.
_KEY_CACHE_MAX = 10_000


def load_operator_key(settings: Settings) -> tuple[str, bool]:
    """The operator key and whether it was generated just now.

    From ``auth.operator_key`` when configured; otherwise read from
    ``<data_dir>/operator.key``, which is created (mode 0600) at first start.
    """
    if settings.auth.operator_key:
        return settings.auth.operator_key, False
    path = Path(settings.data_dir) / OPERATOR_KEY_FILE
    try:
        return path.read_text().strip(), False
    except FileNotFoundError:
        pass
    key = f"tgop_{secrets.token_urlsafe(32)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{OPERATOR_KEY_FILE}.{secrets.token_hex(4)}")
    tmp.touch(mode=0o600)
    tmp.write_text(key + "\n")
    try:
        os.link(tmp, path)  # atomic, and refuses to replace a key another process wrote
    except FileExistsError:
        tmp.unlink()
        return path.read_text().strip(), False
    tmp.unlink()
    return key, True


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: a tenant, or the operator (``tenant is None``)."""

    tenant: str | None

    @property
    def is_operator(self) -> bool:
        return self.tenant is None


def bearer_key(authorization: str | None) -> str:
    """The key of an ``authorization: Bearer <key>`` value.

    Raises: Unauthenticated: missing or not a bearer credential.
    """
    if not authorization:
        raise Unauthenticated("authentication required: send 'authorization: Bearer <key>'")
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthenticated("the authorization header must be 'Bearer <key>'")
    return key.strip()


async def run_blocking(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn`` on the default thread pool (metadata store calls block)."""
    return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs))


class Authenticator:
    """Resolves ``authorization: Bearer <key>`` to a tenant or the operator."""

    def __init__(
        self,
        tenants: TenantStore,
        operator_key: str,
        key_cache_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tenants = tenants
        self._operator_key = operator_key
        self.key_cache_ttl_s = key_cache_ttl_s
        #: Monotonic seconds; the key cache's TTL is measured with it.
        self._clock = clock
        #: key_id -> (expiry, what the store said). Never a secret: every request's secret
        #: is checked against the cached digest. Misses (unknown ids) are not cached.
        self._keys: dict[str, tuple[float, KeyRecordView]] = {}
        #: Lookups under way, shared by concurrent requests of the same key.
        self._key_lookups: dict[str, asyncio.Task[KeyRecordView | None]] = {}
        #: Bumped when the cache is dropped, so a lookup that started before cannot refill it.
        self._keys_generation = 0

    def derive_secret(self, purpose: str) -> bytes:
        """A 32-byte secret for ``purpose`` derived from the operator key (HMAC-SHA256), the
        same on every replica that holds that key; it changes when the key changes."""
        return hmac.new(
            self._operator_key.encode(), f"tidegate/{purpose}".encode(), "sha256"
        ).digest()

    async def authenticate(self, authorization: str | None) -> Principal:
        """Resolve a credential to a tenant or the operator.

        Raises:
            Unauthenticated: missing, malformed, unknown, wrong or revoked key.
            TenantSuspended: the key's tenant is suspended.
        """
        key = bearer_key(authorization)
        if hmac.compare_digest(key.encode(), self._operator_key.encode()):
            return Principal(None)
        parsed = keys.parse(key)
        if parsed is None:
            raise Unauthenticated("invalid API key")
        key_id, secret = parsed
        record = await self._key_record(key_id)
        if record is None or not keys.verify(secret, record.salt, record.digest):
            raise Unauthenticated("invalid API key")
        if record.revoked:
            raise Unauthenticated("invalid API key")
        if record.tenant_status != "active":
            raise TenantSuspended(f"tenant {record.tenant!r} is suspended")
        return Principal(record.tenant)

    async def _key_record(self, key_id: str) -> KeyRecordView | None:
        """What the store says about ``key_id``, reused for ``auth.key_cache_ttl_s``."""
        if self.key_cache_ttl_s <= 0:
            return await run_blocking(self.tenants.key_for_auth, key_id)
        hit = self._keys.get(key_id)
        if hit is not None and hit[0] > self._clock():
            return hit[1]
        lookup = self._key_lookups.get(key_id)
        if lookup is None:
            lookup = asyncio.create_task(self._look_up_key(key_id))
            # Retrieve a failure even when every waiter was cancelled (no asyncio warning).
            lookup.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._key_lookups[key_id] = lookup
        # Shielded: a cancelled request must not cancel the lookup other requests share.
        return await asyncio.shield(lookup)

    async def _look_up_key(self, key_id: str) -> KeyRecordView | None:
        generation = self._keys_generation
        # The expiry counts from before the read: the entry is never older than the TTL.
        expires = self._clock() + self.key_cache_ttl_s
        try:
            record = await run_blocking(self.tenants.key_for_auth, key_id)
        finally:
            if self._key_lookups.get(key_id) is asyncio.current_task():
                del self._key_lookups[key_id]
        if record is not None and generation == self._keys_generation:
            self._keys.pop(key_id, None)  # re-inserted last: the oldest entries come first
            self._keys[key_id] = (expires, record)
            self._prune_keys()
        return record

    def _prune_keys(self) -> None:
        """Drop the oldest entries while they are expired or the cache is over
        ``_KEY_CACHE_MAX``; an expired entry further on is replaced at its next lookup."""
        now = self._clock()
        while self._keys:
            key_id, (expires, _) = next(iter(self._keys.items()))
            if expires > now and len(self._keys) <= _KEY_CACHE_MAX:
                return
            del self._keys[key_id]

    def forget_keys(self) -> None:
        """Drop everything cached about keys: the next request of any key reads the store.

        Called after every change of a key or a tenant's status made through this
        gateway, so this gateway applies it from its next request on.
        """
        self._keys.clear()
        self._key_lookups.clear()
        self._keys_generation += 1
