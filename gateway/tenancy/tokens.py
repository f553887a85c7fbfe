"""Credentials sealed into text a client holds: the console's session cookie and the
access tokens of the Iceberg REST catalog's OAuth2 exchange (``/iceberg/v1/oauth/tokens``).

:class:`SealedKeys` seals an API key (or the operator key) with its expiry (AES-GCM) under
a key derived from the operator key: every replica of a deployment opens what the others
sealed, none keeps state, and whoever holds the text cannot read the key out of it. The
key inside is authenticated on every request, exactly as if the client had sent it, so
what is sealed stays bound to its key's tenant and stops working when the key is revoked
or the tenant suspended (within ``auth.key_cache_ttl_s``), or when it expires.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["TOKEN_PREFIX", "CatalogTokens", "FileTokens", "SealedKeys"]

#: Catalog tokens start with it, so a bearer credential is told from an API key (``tg_``).
TOKEN_PREFIX = "tgcat."
#: Longest sealed text opened (a sealed key is about 150 characters).
_MAX_SEALED = 4096


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SealedKeys:
    """Seals keys with an expiry into URL-safe text and opens them again.

    Args:
        seal_key: 32 bytes (``Authenticator.derive_secret``).
        purpose: bound into every seal (AES-GCM's associated data), so text sealed for
            one purpose (a console cookie) never opens as another (a catalog token).
    """

    def __init__(self, seal_key: bytes, purpose: bytes) -> None:
        self._aead = AESGCM(seal_key)
        self._purpose = purpose

    def seal(self, key: str, expires: int) -> str:
        """``key`` sealed until the Unix time ``expires``."""
        nonce = os.urandom(12)
        plain = json.dumps({"k": key, "exp": expires}).encode()
        return _b64(nonce + self._aead.encrypt(nonce, plain, self._purpose))

    def open(self, text: str | None, now: float) -> str | None:
        """The key sealed in ``text``; None when absent, forged, altered or expired."""
        if not text or len(text) > _MAX_SEALED:
            return None
        try:
            raw = _unb64(text)
            plain = self._aead.decrypt(raw[:12], raw[12:], self._purpose)
            doc = json.loads(plain)
        except (ValueError, InvalidTag):
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("k"), str):
            return None
        expires = doc.get("exp")
        if not isinstance(expires, int) or expires <= now:
            return None
        return str(doc["k"])


class CatalogTokens:
    """The Iceberg catalog's access tokens: tenant keys sealed for ``ttl_s`` seconds."""

    def __init__(self, seal_key: bytes, ttl_s: int, clock: Callable[[], float] = time.time) -> None:
        self._sealed = SealedKeys(seal_key, b"tidegate iceberg catalog token v1")
        self.ttl_s = ttl_s
        self._clock = clock

    def issue(self, key: str) -> str:
        """A token for ``key`` (an authenticated tenant key), valid for :attr:`ttl_s`."""
        return TOKEN_PREFIX + self._sealed.seal(key, int(self._clock()) + self.ttl_s)

    def open(self, token: str) -> str | None:
        """The key sealed in ``token``; None when it is not one of ours, was altered or
        has expired."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        return self._sealed.open(token.removeprefix(TOKEN_PREFIX), self._clock())


class FileTokens:
    """Links to the data files of a local warehouse, for read plans: a tenant and a file's
    path inside the warehouse, sealed until an expiry, so that an executor reads the file
    through the gateway (``GET /v1/files/<token>``) as it reads a presigned URL of object
    storage, and the plan shows no path of the server."""

    def __init__(self, seal_key: bytes, ttl_s: int, clock: Callable[[], float] = time.time) -> None:
        self._sealed = SealedKeys(seal_key, b"tidegate plan file v1")
        self.ttl_s = ttl_s
        self._clock = clock

    def issue(self, tenant: str, path: str) -> tuple[str, int]:
        """A token for the file at ``path`` (inside the warehouse) of ``tenant``'s table,
        and the Unix time it expires."""
        expires = int(self._clock()) + self.ttl_s
        return self._sealed.seal(json.dumps([tenant, path]), expires), expires

    def open(self, token: str) -> tuple[str, str] | None:
        """(tenant, path) of ``token``; None when it is not one of ours, was altered or
        has expired."""
        inner = self._sealed.open(token, self._clock())
        if inner is None:
            return None
        try:
            tenant, path = json.loads(inner)
        except ValueError:
            return None
        return (tenant, path) if isinstance(tenant, str) and isinstance(path, str) else None
