"""API keys: ``tg_<key_id>_<secret>``, stored only as a salted HMAC of the secret.

``key_id`` is 16 hex digits (it finds the row; it is not a secret), ``secret`` is 32 random
bytes in URL-safe base64. The store keeps ``HMAC-SHA256(salt, secret)`` with a random
per-key salt. A slow password hash would add nothing: the secret has 256 bits of entropy,
so the digest cannot be brute-forced, and every request verifies a key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

__all__ = ["IssuedKey", "digest", "issue", "parse", "verify"]

PREFIX = "tg_"
_ID_LEN = 16


@dataclass(frozen=True, slots=True)
class IssuedKey:
    key_id: str
    #: The full key, shown once to whoever asked for it and never stored.
    key: str
    salt: str
    digest: str


def digest(salt: str, secret: str) -> str:
    return hmac.new(bytes.fromhex(salt), secret.encode(), hashlib.sha256).hexdigest()


def issue() -> IssuedKey:
    key_id = secrets.token_hex(_ID_LEN // 2)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    salt = secrets.token_hex(16)
    return IssuedKey(key_id, f"{PREFIX}{key_id}_{secret}", salt, digest(salt, secret))


def parse(key: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a well-formed key, else None."""
    if not key.startswith(PREFIX) or len(key) < len(PREFIX) + _ID_LEN + 2:
        return None
    key_id = key[len(PREFIX) : len(PREFIX) + _ID_LEN]
    rest = key[len(PREFIX) + _ID_LEN :]
    if not rest.startswith("_") or any(c not in "0123456789abcdef" for c in key_id):
        return None
    return key_id, rest[1:]


def verify(secret: str, salt: str, expected: str) -> bool:
    """Constant-time comparison of the secret's digest with the stored one."""
    try:
        return hmac.compare_digest(digest(salt, secret), expected)
    except ValueError:
        return False
