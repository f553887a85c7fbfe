"""Sealed keys: the Iceberg catalog's access tokens and the console's cookies."""

from __future__ import annotations

from gateway.server.http.console.session import Sessions
from gateway.tenancy.tokens import TOKEN_PREFIX, CatalogTokens, SealedKeys

KEY = "tg_0123456789abcdef_secret"


def test_a_token_opens_to_its_key_until_it_expires() -> None:
    now = [1000.0]
    tokens = CatalogTokens(b"s" * 32, ttl_s=60, clock=lambda: now[0])
    token = tokens.issue(KEY)
    assert token.startswith(TOKEN_PREFIX) and KEY not in token
    assert tokens.open(token) == KEY
    now[0] = 1059.0
    assert tokens.open(token) == KEY
    now[0] = 1060.0
    assert tokens.open(token) is None


def test_altered_foreign_or_odd_tokens_do_not_open() -> None:
    tokens = CatalogTokens(b"s" * 32, ttl_s=60)
    token = tokens.issue(KEY)
    flipped = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    other = CatalogTokens(b"o" * 32, ttl_s=60).issue(KEY)
    for bad in (flipped, other, KEY, TOKEN_PREFIX, TOKEN_PREFIX + "!!", TOKEN_PREFIX + "x" * 5000):
        assert tokens.open(bad) is None, bad[:40]


def test_a_console_cookie_is_not_a_catalog_token() -> None:
    """Sealed under the same key, different purposes never open as each other."""
    secret = b"s" * 32
    cookie = Sessions(secret, b"c" * 32, max_age_s=60).seal(KEY)
    assert CatalogTokens(secret, ttl_s=60).open(TOKEN_PREFIX + cookie) is None
    token = CatalogTokens(secret, ttl_s=60).issue(KEY).removeprefix(TOKEN_PREFIX)
    assert Sessions(secret, b"c" * 32, max_age_s=60).open(token) is None
    assert SealedKeys(secret, b"x").open(token, now=0) is None
