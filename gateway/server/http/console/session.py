"""The console's session cookie and its CSRF tokens.

A session is the key the operator or tenant signed in with, sealed (AES-GCM) into an
``HttpOnly``, ``SameSite=Strict`` cookie scoped to ``/console`` with its expiry inside. The
sealing key is derived from the operator key, so every replica of a deployment opens the
cookies of the others and nothing is kept in a gateway's memory; the key inside is
authenticated by the gate on every request, so a revoked key or a suspended tenant ends its
sessions at once. A CSRF token is an HMAC of the cookie's value: every form that changes
something carries it, and a cross-site page can neither read the cookie nor compute it.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["LOGIN_COOKIE", "SESSION_COOKIE", "Sealed", "Sessions"]

SESSION_COOKIE = "tidegate_console"
#: Holds the login form's CSRF token (no session exists yet to derive it from).
LOGIN_COOKIE = "tidegate_console_login"
_AAD = b"tidegate console session v1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class Sealed:
    """An opened session: the key signed in with and the cookie it came in."""

    key: str
    cookie: str


class Sessions:
    """Seals keys into cookie values and opens them again; makes and checks CSRF tokens."""

    def __init__(self, seal_key: bytes, csrf_key: bytes, max_age_s: int) -> None:
        self._aead = AESGCM(seal_key)
        self._csrf_key = csrf_key
        self.max_age_s = max_age_s

    def seal(self, key: str, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + self.max_age_s)
        nonce = os.urandom(12)
        plain = json.dumps({"k": key, "exp": expires}).encode()
        return _b64(nonce + self._aead.encrypt(nonce, plain, _AAD))

    def open(self, cookie: str | None, now: float | None = None) -> Sealed | None:
        """The session in ``cookie``; None when absent, forged, altered or expired."""
        if not cookie or len(cookie) > 4096:
            return None
        try:
            raw = _unb64(cookie)
            plain = self._aead.decrypt(raw[:12], raw[12:], _AAD)
            doc = json.loads(plain)
        except (ValueError, InvalidTag):
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("k"), str):
            return None
        if not isinstance(doc.get("exp"), int) or doc["exp"] <= (now or time.time()):
            return None
        return Sealed(doc["k"], cookie)

    def csrf(self, cookie: str) -> str:
        """The CSRF token of the session in ``cookie``."""
        return _b64(hmac.new(self._csrf_key, cookie.encode(), "sha256").digest())

    def csrf_ok(self, cookie: str, token: object) -> bool:
        return self.same(self.csrf(cookie), token)

    @staticmethod
    def same(expected: str | None, sent: object) -> bool:
        """Whether ``sent`` is the non-empty token ``expected`` (compared in constant time)."""
        if not expected or not isinstance(sent, str):
            return False
        return hmac.compare_digest(expected.encode(), sent.encode())

    @staticmethod
    def login_token() -> str:
        return secrets.token_urlsafe(24)
