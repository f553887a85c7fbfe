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
import secrets
import time
from dataclasses import dataclass

from gateway.tenancy.tokens import SealedKeys

__all__ = ["LOGIN_COOKIE", "SESSION_COOKIE", "Sealed", "Sessions"]

SESSION_COOKIE = "tidegate_console"
#: Holds the login form's CSRF token (no session exists yet to derive it from).
LOGIN_COOKIE = "tidegate_console_login"
_AAD = b"tidegate console session v1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True, slots=True)
class Sealed:
    """An opened session: the key signed in with and the cookie it came in."""

    key: str
    cookie: str


class Sessions:
    """Seals keys into cookie values and opens them again; makes and checks CSRF tokens."""

    def __init__(self, seal_key: bytes, csrf_key: bytes, max_age_s: int) -> None:
        self._sealed = SealedKeys(seal_key, _AAD)
        self._csrf_key = csrf_key
        self.max_age_s = max_age_s

    def seal(self, key: str, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + self.max_age_s)
        return self._sealed.seal(key, expires)

    def open(self, cookie: str | None, now: float | None = None) -> Sealed | None:
        """The session in ``cookie``; None when absent, forged, altered or expired."""
        key = self._sealed.open(cookie, now or time.time())
        return None if key is None or cookie is None else Sealed(key, cookie)

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
