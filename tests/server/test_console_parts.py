"""The console's parts that need no gateway: its session cookie, and its files shipping in
the wheel (the browser tests run from the source tree, where a file missing from the
package data would still be found)."""

from __future__ import annotations

import tomllib

from gateway.server.http.console.session import Sessions
from tests.services import REPO_ROOT

CONSOLE = REPO_ROOT / "gateway" / "server" / "http" / "console"


def test_a_session_opens_only_as_it_was_sealed() -> None:
    sessions = Sessions(b"s" * 32, b"c" * 32, max_age_s=60)
    cookie = sessions.seal("tg_0123456789abcdef_secret", now=1000)
    assert "secret" not in cookie  # sealed, not merely encoded
    opened = sessions.open(cookie, now=1059)
    assert opened is not None and opened.key == "tg_0123456789abcdef_secret"
    assert sessions.open(cookie, now=1060) is None  # expired
    flipped = cookie[:10] + ("A" if cookie[10] != "A" else "B") + cookie[11:]
    assert sessions.open(flipped, now=1000) is None
    assert Sessions(b"t" * 32, b"c" * 32, 60).open(cookie, now=1000) is None  # other replica key
    for junk in ("", "x", "!!!", "A" * 5000):
        assert sessions.open(junk, now=1000) is None


def test_csrf_tokens_belong_to_one_session() -> None:
    sessions = Sessions(b"s" * 32, b"c" * 32, max_age_s=60)
    one, two = sessions.seal("k1"), sessions.seal("k1")
    assert sessions.csrf_ok(one, sessions.csrf(one))
    assert not sessions.csrf_ok(one, sessions.csrf(two))
    assert not sessions.csrf_ok(one, "")
    assert not sessions.csrf_ok(one, None)


def test_every_console_file_is_package_data() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["gateway"]
    files = [
        p.relative_to(REPO_ROOT / "gateway").as_posix()
        for folder in ("templates", "static")
        for p in (CONSOLE / folder).rglob("*")
        if p.is_file()
    ]
    assert len(files) >= 12, files
    # Globbed as setuptools globs them ("*" stays inside one folder).
    gateway = REPO_ROOT / "gateway"
    shipped = {p.relative_to(gateway).as_posix() for pat in patterns for p in gateway.glob(pat)}
    assert sorted(set(files) - shipped) == []
    assert "server/http/console/static/vendor/uPlot.LICENSE" in shipped
