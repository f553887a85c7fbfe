"""Issue 17: the operator console, in Debian's Chromium against a live gateway.

One gateway (Redis hot tier, no embedded tiering: `tidegate tier` runs beside it, as a
CronJob would) and one browser serve the whole module. The walk-through signs in as the
operator and as a tenant, watches a table's lag rise and fall without a reload, and browses
records on both sides of the tiered watermark; the security tests send what a browser
would not (no cookie, a forged cookie, another tenant's id, a cross-site form). Screenshots
are kept under the walk-through's temporary folder.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.server.http.console.session import Sessions
from tests.integration.conftest import gateway_env
from tests.services import REPO_ROOT, GatewayProcess, RedisServer, connect, running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: An address no test serves: a cross-site page is fulfilled there by the browser itself.
EVIL = "http://evil.example"
#: The width the console is designed for, and its committed screenshots are taken at.
WIDTH = 1400
VIEWPORT = {"width": WIDTH, "height": 900}
#: Committed screenshots of every console page (issue 32): name -> the tallest it may be.
SCREENSHOTS = REPO_ROOT / "docs" / "console"
#: What an empty value shows (an en dash) in the console's numbers and legends.
NO_VALUE = "\u2013"
PAGES = {
    "login": 900,
    "tenants": 900,
    "tenant": 1800,
    "key": 900,
    "table": 1800,
    "records": 1400,
    "groups": 900,
    "shards": 900,
}
ASSET = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(https?:)?//""", re.IGNORECASE)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Any]:
    env = {
        **gateway_env("redis", redis_server),
        "TIDEGATE_TIERING__ENABLED": "false",  # `tidegate tier` runs beside it
        "TIDEGATE_METERING__FLUSH_INTERVAL_S": "1",
    }
    proc = GatewayProcess(tmp_path_factory.mktemp("console-gw"), env).start()
    with running(proc):
        yield proc


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def wait_lag(page: Any, records: int) -> None:
    """Wait until the table page shows this total lag (the page refreshes it by itself)."""
    page.wait_for_function(
        "n => document.getElementById('total-lag-records').textContent === n", arg=str(records)
    )


def offline(html: str) -> None:
    """A console page loads nothing from another host."""
    assert not ASSET.search(html), ASSET.search(html)


class Session:
    """An httpx client signed in to the console (as a browser would: a login form)."""

    def __init__(self, gw: GatewayProcess, key: str | None) -> None:
        self.http = httpx.Client(base_url=gw.http_url, timeout=30)
        self.csrf = ""
        if key is not None:
            token = self.token(self.http.get("/console/login").text)
            r = self.http.post("/console/login", data={"csrf": token, "key": key})
            assert r.status_code == 303, r.text
            cookie = next(h for h in r.headers.get_list("set-cookie") if "tidegate_console=" in h)
            assert (
                "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
            )
            self.refresh()

    @staticmethod
    def token(html: str) -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', html)
        assert found, html
        return found.group(1)

    def refresh(self) -> None:
        r = self.http.get("/console/tenants", follow_redirects=True)
        assert r.status_code == 200, r.text
        self.csrf = self.token(r.text)

    def post(self, path: str, **data: str) -> httpx.Response:
        return self.http.post(path, data={"csrf": self.csrf, **data})


@pytest.fixture
def signed_in(gw: GatewayProcess) -> Iterator[Callable[[str | None], Session]]:
    """Makes signed-in console sessions (None: not signed in), closed after the test."""
    made: list[Session] = []

    def make(key: str | None) -> Session:
        made.append(Session(gw, key))
        return made[-1]

    yield make
    for session in made:
        session.http.close()


# The security tests set up and check through the JSON API (one HTTP connection each):
# a gRPC channel's first connection is what a loaded machine delays most.
def admin_get(gw: GatewayProcess, path: str) -> Any:
    with gw.http_client(api_key=gw.operator_key) as h:
        r = h.get(f"/v1/admin{path}")
        assert r.status_code == 200, r.text
        return r.json()


def tenant_names(gw: GatewayProcess) -> set[str]:
    return {t["name"] for t in admin_get(gw, "/tenants")["tenants"]}


def new_tenant(gw: GatewayProcess) -> tuple[str, str]:
    name = f"t{secrets.token_hex(5)}"
    with gw.http_client(api_key=gw.operator_key) as h:
        assert h.post("/v1/admin/tenants", json={"name": name}).status_code == 201
        return name, h.post(f"/v1/admin/tenants/{name}/keys").json()["api_key"]


def table_with_rows(
    gw: GatewayProcess, key: str, table: str, fields: list[Any], rows: list[Any]
) -> None:
    """``web.<table>`` of the key's tenant, holding ``rows``, made over the JSON API."""
    with gw.http_client(api_key=key) as h:
        body = {"namespace": "web", "name": table, "schema": fields}
        assert h.post("/v1/tables", json=body).status_code == 201
        r = h.post(f"/v1/tables/web/{table}/records", json={"rows": rows})
        assert r.status_code == 200, r.text


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height, from its header."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def charts_fill_their_width(page: Any) -> None:
    """Every chart's canvas is as wide as the chart's box (it was half the page)."""
    sizes = page.eval_on_selector_all(
        ".chart",
        "els => els.map(e => [e.clientWidth, e.querySelector('.uplot').clientWidth])",
    )
    assert sizes
    for box, plot in sizes:
        assert box > 300 and abs(box - plot) <= 2, sizes


def at_a_glance(page: Any) -> None:
    """Issue 32, item 11: a table's page leads with what an operator acts on. At 1400 px
    the first screen holds the lag, freshness, errors and smoothed throughput, and both
    charts, each on its own axis, filling its half; file lists and raw snapshot summaries
    are folded away; the charts' legends show the latest values without hovering."""
    first_screen = VIEWPORT["height"]
    for tile in ("#tile-lag", "#tile-freshness", "#tile-errors", "#tile-throughput"):
        box = page.locator(tile).bounding_box()
        assert box is not None and box["y"] + box["height"] <= first_screen, tile
    for chart in ("[data-chart=throughput]", "[data-chart=lag]"):
        box = page.locator(chart).bounding_box()
        assert box is not None and box["y"] < first_screen and box["width"] > 600, chart
    charts_fill_their_width(page)
    for fold in ("#files-fold", "#snapshots-fold", "#lake", "#engines", "#drop-fold"):
        assert page.locator(fold).get_attribute("open") is None, fold
    assert not page.locator("#files").is_visible()
    legends = page.locator("[data-chart=throughput] .legend b").all_text_contents()
    assert len(legends) == 2 and NO_VALUE not in legends, legends
    assert page.text_content("#rate-in") != NO_VALUE
    assert page.text_content("#failures-count") == "0"
    assert "ago" in page.text_content("#last-tiered")


def test_the_committed_screenshots_show_every_page_at_1400_px() -> None:
    """docs/console/ holds a screenshot of each console page, taken by the walk-through
    at 1400 px wide (TIDEGATE_UPDATE_SCREENSHOTS=1 retakes them)."""
    found = {p.stem for p in SCREENSHOTS.glob("*.png")}
    assert found == set(PAGES)
    for name, tallest in PAGES.items():
        width, height = png_size(SCREENSHOTS / f"{name}.png")
        assert width == WIDTH and 300 < height <= tallest, (name, width, height)
    readme = (REPO_ROOT / "README.md").read_text()
    assert "![A table's page in the console](docs/console/table.png)" in readme


# The walk-through, in the browser -----------------------------------------------------------
def test_operator_and_tenant_in_the_browser(
    gw: GatewayProcess, browser: Any, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    origin = gw.http_url
    requested: list[str] = []
    names = {"tenant": f"shop{secrets.token_hex(3)}", "table": "clicks"}

    def shot(page: Any, name: str, committed: str | None = None) -> None:
        """A full-page screenshot in the test's folder; for a page of :data:`PAGES`, its
        size checked, and kept as the committed one when TIDEGATE_UPDATE_SCREENSHOTS=1."""
        path = shots / f"{len(list(shots.iterdir())):02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        if committed is not None:
            width, height = png_size(path)
            assert width == WIDTH and height <= PAGES[committed], (committed, width, height)
            if os.environ.get("TIDEGATE_UPDATE_SCREENSHOTS") == "1":
                SCREENSHOTS.mkdir(exist_ok=True)
                (SCREENSHOTS / f"{committed}.png").write_bytes(path.read_bytes())

    def watch(page: Any) -> Any:
        page.on("request", lambda r: requested.append(r.url))
        page.set_default_timeout(30_000)
        return page

    operator = browser.new_context(viewport=VIEWPORT)
    page = watch(operator.new_page())
    page.goto(f"{origin}/console")
    assert page.url == f"{origin}/console/login"
    shot(page, "login", "login")
    page.fill("#key", gw.operator_key)
    page.click("#sign-in")
    assert page.url == f"{origin}/console/tenants"
    assert page.text_content("#who") == "operator"
    shot(page, "tenants", "tenants")
    page.fill("#tenant-name", names["tenant"])
    page.click("#create-tenant")
    assert page.url == f"{origin}/console/tenants/{names['tenant']}"
    assert page.text_content("#tenant-status") == "active"
    page.click("#issue-key")
    key = page.text_content("#new-key").strip()
    assert key.startswith("tg_")
    shot(page, "new-key", "key")
    page.goto(f"{origin}/console/tenants/{names['tenant']}")
    assert page.locator("#keys tr[data-key-id]").count() == 1  # by id; the key is not shown
    assert key not in page.content()

    tenant_ctx = browser.new_context(viewport=VIEWPORT)
    page = watch(tenant_ctx.new_page())
    page.goto(f"{origin}/console/login")
    page.fill("#key", key)
    page.click("#sign-in")
    assert page.url == f"{origin}/console/tenants/{names['tenant']}"
    assert page.text_content("#who") == f"tenant {names['tenant']}"
    assert page.locator("#issue-key").count() == 0  # read-only but for its tables
    page.click("#create-table-card summary")
    form = page.locator("#create-table")
    form.locator("[name=namespace]").fill("web")
    form.locator("[name=name]").fill(names["table"])
    form.locator("[name=partitions]").fill("2")
    form.locator("[name=schema]").fill("page:string,ms:int64")
    form.locator("button[type=submit]").click()
    table_url = f"{origin}/console/tenants/{names['tenant']}/tables/web/{names['table']}"
    assert page.url == table_url
    page.wait_for_function("() => Number(document.body.dataset.liveTicks) >= 1")
    page.evaluate("window.__sameDocument = 'yes'")  # gone if the page reloads

    hostile = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
    with connect(gw.grpc_target, api_key=key) as client:
        table = f"web.{names['table']}"
        client.append(table, [{"page": f"/p{i}", "ms": i} for i in range(30)], partition=0)
        client.append(table, [{"page": hostile, "ms": i} for i in range(20)], partition=1)
        wait_lag(page, 50)
        shot(page, "lag-up")
        tier = subprocess.run(
            [str(Path(sys.executable).parent / "tidegate"), "tier"],
            env={**gw.env(), "PATH": os.environ.get("PATH", "")},
            cwd=str(REPO_ROOT),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert tier.returncode == 0, tier.stderr
        wait_lag(page, 0)
        row = page.locator("#partitions tr[data-partition='0']")
        assert row.locator("[data-field=tiered_watermark]").text_content() == "30"
        shot(page, "lag-down")
        between = dt.datetime.now(dt.UTC)
        client.append(table, [{"page": f"/q{i}", "ms": 100 + i} for i in range(5)], partition=0)
        wait_lag(page, 5)
        assert page.evaluate("window.__sameDocument") == "yes"  # all of it without a reload
        client.commit_offsets("dashboard", table, {0: 10})

    # The table's page, reloaded: data files and the tiering snapshot.
    page.reload()
    assert page.locator("#files tbody tr").count() == 2
    assert "tiering" in page.text_content("#snapshots")
    assert "added-records 50" in page.text_content("#last-tiering")
    # File paths are shown under the table's folder, never as absolute file:// paths.
    assert "file://" not in page.text_content("#files")
    page.wait_for_function("() => Number(document.body.dataset.liveTicks) >= 12")
    at_a_glance(page)
    assert "dashboard" in page.content()
    shot(page, "table-after-tiering", "table")

    # Records on both sides of the tiered watermark, and which tier served each.
    page.fill("#browse [name=offset]", "25")
    with page.expect_navigation():  # the records are read from the page the form loads
        page.click("#browse button[type=submit]")
    offsets = page.locator("#records tbody tr").evaluate_all("rs => rs.map(r => r.dataset.offset)")
    assert offsets == [str(o) for o in range(25, 35)]
    tiers = page.locator("#records td[data-column=_tier]").all_text_contents()
    assert tiers == ["iceberg"] * 5 + ["hot"] * 5
    assert page.text_content("#tiered-watermark") == "30"
    shot(page, "records-across-the-watermark", "records")
    page.fill("#browse [name=offset]", "")
    page.fill("#browse [name=time]", between.isoformat())
    with page.expect_navigation():
        page.click("#browse button[type=submit]")
    assert page.locator("#records tbody tr").first.get_attribute("data-offset") == "30"

    # A value holding HTML is shown as text, and nothing of it runs.
    page.goto(f"{table_url}/records?partition=1&offset=0&limit=3")
    cells = page.locator("#records td[data-column=page]").all_text_contents()
    assert cells == [hostile] * 3
    assert page.evaluate("window.__xss") is None
    shot(page, "html-as-text")

    # Consumer groups with their lag per partition.
    page.goto(f"{origin}/console/tenants/{names['tenant']}/groups")
    group = page.locator("section[data-group=dashboard]")
    assert group.locator("tr[data-partition='0'] [data-field=lag]").text_content() == "25"
    assert group.locator("tr[data-partition='1'] [data-field=lag]").text_content() == "20"
    assert group.locator("[data-field=state]").text_content() == "empty"
    # A group with a live member: its partitions, generation and the member of each.
    with (
        connect(gw.grpc_target, api_key=key) as client,
        client.consumer(
            f"web.{names['table']}", group="live", session_timeout=60, client_id="worker-1"
        ) as member,
    ):
        page.goto(f"{origin}/console/tenants/{names['tenant']}/groups")
        live = page.locator("section[data-group=live]")
        assert live.locator("[data-field=state]").text_content() == "stable"
        row = live.locator(f"tr[data-member='{member.member_id}']")
        assert "worker-1" in row.text_content()
        assert row.locator("[data-field=partitions]").text_content() == "0,1"
        assert row.locator("[data-field=generation]").text_content() == str(member.generation)
        holders = live.locator("tr[data-partition] [data-field=member]").all_text_contents()
        assert holders == [member.member_id] * 2
        shot(page, "groups", "groups")

    # Usage charts (the operator's view of the tenant), drawn from the metered minutes.
    page = operator.pages[0]
    page.goto(f"{origin}/console/tenants/{names['tenant']}")
    assert page.locator("[data-usage-url]").count() == 1, page.content()
    page.wait_for_function(
        "() => Number(document.querySelector('[data-usage-url]').dataset.loaded) > 0"
    )
    assert page.locator(".uplot").count() == 3
    charts_fill_their_width(page)
    # Each legend shows the latest minute's values, not a dash until hovered.
    legends = page.locator(".chart .legend b").all_text_contents()
    assert legends and all(v not in ("", NO_VALUE, "--") for v in legends[:2]), legends
    shot(page, "tenant-usage", "tenant")
    page.goto(f"{origin}/console/shards")
    shot(page, "shards", "shards")

    # Drop asks for the table's name again.
    page = tenant_ctx.pages[0]
    page.goto(table_url)
    page.click("#drop-fold summary")  # folded away until asked for
    page.fill("#drop-confirm", "clicks")
    page.click("#drop-table")
    assert "type its name web.clicks again" in page.text_content("#error")
    page.goto(table_url)
    page.click("#drop-fold summary")
    page.fill("#drop-confirm", f"web.{names['table']}")
    page.click("#drop-table")
    assert page.url == f"{origin}/console/tenants/{names['tenant']}"
    assert "No table yet." in page.text_content("#tables")

    # The operator's actions, as the tenant's session sees them.
    tenant_url = f"{origin}/console/tenants/{names['tenant']}"
    page = operator.pages[0]
    page.goto(tenant_url)
    page.fill("#quota [name=max_tables]", "3")
    page.click("#set-quota")
    assert page.input_value("#quota [name=max_tables]") == "3"
    page.click("#toggle-status")
    assert page.text_content("#tenant-status") == "suspended"
    seen = tenant_ctx.pages[0]
    seen.goto(tenant_url)
    assert "suspended" in seen.text_content("#error")
    shot(seen, "suspended")
    page.click("#toggle-status")
    assert page.text_content("#tenant-status") == "active"
    seen.goto(tenant_url)
    assert "max_tables 3" in " ".join(seen.text_content("#quota").split())
    page.click("#keys tr[data-key-id] button")  # revoke the tenant's key
    assert page.locator("#keys tr[data-key-id] td").nth(2).text_content() == "revoked"
    seen.reload()
    assert seen.url == f"{origin}/console/login"  # that session is over

    # Nothing secret in URLs or browser storage; nothing fetched from another host.
    for ctx in (operator, tenant_ctx):
        storage = ctx.pages[0].evaluate("[localStorage.length, sessionStorage.length]")
        assert storage == [0, 0]
        cookies = {c["name"]: c for c in ctx.cookies()}
        session = cookies["tidegate_console"]
        assert session["httpOnly"] and session["sameSite"] == "Strict"
        assert key not in session["value"] and gw.operator_key not in session["value"]
    assert requested and all(u.startswith(f"{origin}/console") for u in requested), requested
    assert not [u for u in requested if key in u or gw.operator_key in u]
    page = operator.pages[0]
    page.goto(f"{origin}/console/tenants")
    page.click("#sign-out")
    page.goto(f"{origin}/console/tenants")
    assert page.url == f"{origin}/console/login"
    assert "tidegate_console" not in {c["name"] for c in operator.cookies()}
    operator.close()
    tenant_ctx.close()
    assert len(list(shots.glob("*.png"))) == 12


def test_a_cross_site_form_is_refused(gw: GatewayProcess, browser: Any) -> None:
    """A page of another site that posts to the console, in the operator's signed-in
    browser: the session cookie does not go with it (SameSite=Strict), and without the
    session's CSRF token the action would be refused anyway."""
    victim = f"v{secrets.token_hex(4)}"
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{gw.http_url}/console/login")
    page.fill("#key", gw.operator_key)
    page.click("#sign-in")
    forged = (
        f'<form id="f" method="post" action="{gw.http_url}/console/tenants">'
        f'<input name="name" value="{victim}"></form>'
    )
    context.route(f"{EVIL}/**", lambda route: route.fulfill(content_type="text/html", body=forged))
    page.goto(f"{EVIL}/")
    with page.expect_navigation():
        page.evaluate("document.getElementById('f').submit()")
    assert page.url == f"{gw.http_url}/console/tenants"
    assert page.locator("#error").count() == 1  # refused, with a sentence
    assert victim not in tenant_names(gw)
    context.close()


# What a browser would not send ----------------------------------------------------------------
def test_no_page_or_action_without_a_key(
    gw: GatewayProcess, signed_in: Callable[[str | None], Session]
) -> None:
    tenant, _ = new_tenant(gw)
    base = f"/console/tenants/{tenant}"
    pages = [
        "/console/tenants",
        "/console/shards",
        base,
        f"{base}/groups",
        f"{base}/tables/web/clicks",
        f"{base}/tables/web/clicks/records?partition=0&offset=0",
    ]
    api = [f"/console/api/tenants/{tenant}/usage", f"/console/api/tenants/{tenant}/tables/w/t/live"]
    actions = [
        "/console/tenants",
        f"{base}/suspend",
        f"{base}/keys",
        f"{base}/quota",
        f"{base}/tables",
        f"{base}/tables/web/clicks/drop",
    ]
    # No cookie, garbage, and a well-formed session sealed with a key this gateway does not
    # hold (around a valid operator key).
    made_up = Sessions(b"k" * 32, b"c" * 32, 3600).seal(gw.operator_key)
    for cookie in (None, "forged", made_up):
        with httpx.Client(base_url=gw.http_url, timeout=30) as h:
            if cookie is not None:
                h.cookies.set("tidegate_console", cookie, path="/console")
            for path in pages:
                r = h.get(path)
                assert (r.status_code, r.headers["location"]) == (303, "/console/login"), path
            for path in api:
                r = h.get(path)
                assert r.status_code == 401 and r.json()["error"]["reason"] == "UNAUTHENTICATED"
            for path in actions:
                r = h.post(path, data={"name": "x", "csrf": "x"})
                assert r.status_code == 401, (path, r.status_code)
                assert tenant not in r.text
    assert admin_get(gw, f"/tenants/{tenant}")["status"] == "active"
    assert len(admin_get(gw, f"/tenants/{tenant}/keys")["keys"]) == 1
    # A wrong key at the sign-in form: one sentence, no session.
    s = signed_in(None)
    token = s.token(s.http.get("/console/login").text)
    r = s.http.post("/console/login", data={"csrf": token, "key": "tg_0000000000000000_nope"})
    assert r.status_code == 401 and "invalid API key" in r.text
    assert "tidegate_console" not in s.http.cookies


def test_a_tenant_sees_only_itself(
    gw: GatewayProcess, signed_in: Callable[[str | None], Session]
) -> None:
    mine, my_key = new_tenant(gw)
    other, other_key = new_tenant(gw)
    page = [{"name": "page", "type": "string"}]
    table_with_rows(gw, other_key, "secret", page, [{"page": "/private"}])
    s = signed_in(my_key)
    assert s.http.get("/console/tenants").headers["location"] == f"/console/tenants/{mine}"
    base = f"/console/tenants/{other}"
    missing = f"/console/tenants/t{secrets.token_hex(5)}"
    for suffix in (
        "",
        "/groups",
        "/tables/web/secret",
        "/tables/web/secret/records?partition=0&offset=0",
    ):
        for tenant_url in (base, missing):  # another tenant looks like no tenant at all
            r = s.http.get(tenant_url + suffix)
            assert r.status_code == 404 and "TENANT_NOT_FOUND" in r.text, (tenant_url, suffix)
            assert "/private" not in r.text
    for path in (
        f"/console/api/tenants/{other}/usage",
        f"/console/api/tenants/{other}/tables/web/secret/live",
    ):
        r = s.http.get(path)
        assert r.status_code == 404 and r.json()["error"]["reason"] == "TENANT_NOT_FOUND"
    r = s.post(f"{base}/tables", namespace="web", name="planted", schema="a:int64")
    assert r.status_code == 404
    r = s.post(f"{base}/tables/web/secret/drop", confirm="web.secret")
    assert r.status_code == 404
    # Operator-only actions, even on its own tenant.
    for action in ("suspend", "keys", "quota"):
        r = s.post(f"/console/tenants/{mine}/{action}")
        assert r.status_code == 403 and "only the operator" in r.text, action
    with gw.http_client(api_key=other_key) as h:
        assert [t["name"] for t in h.get("/v1/tables").json()["tables"]] == ["secret"]
    assert admin_get(gw, f"/tenants/{mine}")["status"] == "active"
    assert len(admin_get(gw, f"/tenants/{mine}/keys")["keys"]) == 1


def test_shards_and_placements_show_each_viewer_its_own(
    gw: GatewayProcess, signed_in: Callable[[str | None], Session]
) -> None:
    mine, my_key = new_tenant(gw)
    other, other_key = new_tenant(gw)
    page = [{"name": "page", "type": "string"}]
    table_with_rows(gw, my_key, "mine", page, [{"page": "/a"}])
    table_with_rows(gw, other_key, "theirs", page, [{"page": "/b"}])
    placed = {
        (p["tenant"], p["table"]): p["shard"]
        for p in admin_get(gw, f"/placements?tenant={mine}")["placements"]
    }
    assert placed == {(mine, "web.mine"): "default"}  # one Redis URL: the shard "default"
    operator = signed_in(gw.operator_key).http.get("/console/shards")
    assert operator.status_code == 200, operator.text
    assert 'data-shard="default"' in operator.text
    assert 'data-table="web.mine"' in operator.text and 'data-table="web.theirs"' in operator.text
    tenant = signed_in(my_key).http.get("/console/shards")
    assert tenant.status_code == 200, tenant.text
    assert 'data-table="web.mine"' in tenant.text
    assert "web.theirs" not in tenant.text and other not in tenant.text
    offline(tenant.text)


def test_forged_posts_are_refused(
    gw: GatewayProcess, signed_in: Callable[[str | None], Session]
) -> None:
    s = signed_in(gw.operator_key)
    victim = f"v{secrets.token_hex(4)}"
    attempts = [
        ({}, {"name": victim}),  # no token
        ({}, {"name": victim, "csrf": "A" * 43}),  # a made-up token
        ({"origin": EVIL}, {"name": victim, "csrf": s.csrf}),  # the token, from another site
        ({"origin": "null"}, {"name": victim, "csrf": s.csrf}),
        ({"sec-fetch-site": "cross-site"}, {"name": victim, "csrf": s.csrf}),
    ]
    for headers, data in attempts:
        r = s.http.post("/console/tenants", data=data, headers=headers)
        assert r.status_code == 403 and "PERMISSION_DENIED" in r.text, (headers, data)
    # Another session's token does not fit this one.
    other = signed_in(gw.operator_key)
    r = s.http.post("/console/tenants", data={"name": victim, "csrf": other.csrf})
    assert r.status_code == 403
    assert victim not in tenant_names(gw)
    r = s.post("/console/tenants", name=victim)
    assert r.status_code == 303  # the same form with this session's token goes through


def test_names_with_html_are_text(
    gw: GatewayProcess, signed_in: Callable[[str | None], Session]
) -> None:
    s = signed_in(gw.operator_key)
    r = s.post("/console/tenants", name="<script>alert(1)</script>")
    assert r.status_code == 400
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
    assert "<script>alert" not in r.text
    offline(r.text)
    r = s.http.get('/console/tenants/<b id="x">t')
    assert r.status_code == 400 and '<b id="x">' not in r.text
    tenant, _ = new_tenant(gw)
    r = s.post(f"/console/tenants/{tenant}/quota", max_tables="ten")
    assert (
        r.status_code == 400
        and "quota max_tables must be a whole number, got &#39;ten&#39;" in r.text
    )
    r = s.post(
        f"/console/tenants/{tenant}/tables", namespace="web", name="t1", schema="a:int64,<b>"
    )
    assert r.status_code == 400 and "expected name:type, got &#39;&lt;b&gt;&#39;" in r.text


def test_every_page_loads_only_what_the_gateway_serves(
    gw: GatewayProcess, signed_in: Callable[[str | None], Session]
) -> None:
    tenant, key = new_tenant(gw)
    fields = [{"name": "page", "type": "string"}, {"name": "tags", "type": "list<string>"}]
    table_with_rows(gw, key, "t", fields, [{"page": "/", "tags": ["a", "<b>"]}])
    with gw.http_client(api_key=key) as h:
        offsets = {"offsets": [{"partition": 0, "offset": 1}]}
        assert h.post("/v1/groups/g/tables/web/t/offsets", json=offsets).status_code == 200
    s = signed_in(gw.operator_key)
    base = f"/console/tenants/{tenant}"
    assets: set[str] = set()
    pages: dict[str, str] = {}
    for path in (
        "/console/login",
        "/console/tenants",
        base,
        f"{base}/groups",
        f"{base}/tables/web/t",
        f"{base}/tables/web/t/records?partition=0&offset=0",
        f"{base}/tables/web/nope",  # an error page
    ):
        r = s.http.get(path)
        pages[path] = r.text
        assert r.status_code in (200, 404), path
        assert r.headers["content-security-policy"].startswith("default-src 'none'")
        offline(r.text)
        assets |= set(re.findall(r'(?:src|href)="(/console/static/[^"]+)"', r.text))
    # The table's lake health (files, small files, snapshots, leases) is on its page.
    assert 'id="lake-health"' in pages[f"{base}/tables/web/t"]
    # A list is shown as JSON, escaped like every value.
    records = pages[f"{base}/tables/web/t/records?partition=0&offset=0"]
    assert "[&#34;a&#34;, &#34;&lt;b&gt;&#34;]" in records
    assert len(assets) == 5, assets  # the script, the styles, the icon and uPlot's two files
    for asset in assets:
        got = s.http.get(asset)
        assert got.status_code == 200 and len(got.content) > 200, asset


def test_the_table_page_gives_the_catalog_and_snippets_that_run(
    gw: GatewayProcess, signed_in: Callable[[str | None], Session]
) -> None:
    """Issue 27: the page names the Iceberg catalog and shows DuckDB, pyiceberg and Spark
    code with a placeholder for the key (never the key); the first two, once the key is
    pasted in, read the table's tiered rows."""
    import html

    from tests.integration.iceberg_catalog import duckdb_with_extensions, pyiceberg_catalog, tier

    tenant, key = new_tenant(gw)
    table_with_rows(gw, key, "shown", [{"name": "page", "type": "string"}], [{"page": "/a"}])
    tier(gw)
    page = signed_in(key).http.get(f"/console/tenants/{tenant}/tables/web/shown").text
    assert key not in page
    uri = re.search(r'id="catalog-uri">([^<]+)<', page)
    assert uri is not None and uri.group(1) == f"{gw.http_url}/iceberg"
    snippets = {
        name: html.unescape(m.group(1)).replace("<your API key>", key)
        for name, m in (
            (n, re.search(rf'id="snippet-{n}"><code>(.*?)</code>', page, re.DOTALL))
            for n in ("duckdb", "pyiceberg", "spark")
        )
        if m is not None
    }
    assert set(snippets) == {"duckdb", "pyiceberg", "spark"}
    assert f"spark.sql.catalog.tg.uri={gw.http_url}/iceberg" in snippets["spark"]
    scope: dict[str, Any] = {}
    exec(snippets["pyiceberg"], scope)  # the page's code, as a user would paste it
    assert scope["rows"].column("page").to_pylist() == ["/a"]
    con = duckdb_with_extensions()  # what INSTALL would fetch, from the PyPI packages
    try:
        statements = [s for s in snippets["duckdb"].split(";") if s.strip()]
        assert statements[0].strip() == "INSTALL iceberg"
        for statement in statements[2:-1]:
            con.execute(statement)
        got = con.sql(statements[-1]).arrow().read_all()  # (no pytz for fetchall)
    finally:
        con.close()
    assert got.column("page").to_pylist() == ["/a"]
    assert pyiceberg_catalog(gw, token=key).table_exists("web.shown")


def test_many_tenants_and_tables_are_paged_and_found_by_search(
    tmp_path_factory: pytest.TempPathFactory, browser: Any
) -> None:
    """Issue 30.4: with more tenants and tables than a page holds, the console lists one
    page (in name order) with a link to the next, and its search box finds one by name."""
    env = {"TIDEGATE_HOT__TYPE": "disk", "TIDEGATE_TIERING__ENABLED": "false"}
    proc = GatewayProcess(tmp_path_factory.mktemp("console-many"), env)
    proc.tenant = "a-bootstrap"  # sorts before the tenants made here
    with running(proc.start()):
        made = [f"m{i:03d}" for i in range(120)]
        with proc.http_client(api_key=proc.operator_key) as h:
            for name in made:
                assert h.post("/v1/admin/tenants", json={"name": name}).status_code == 201
            key = h.post("/v1/admin/tenants/m077/keys").json()["api_key"]
        tables = [f"p{i:02d}" for i in range(60)]
        with proc.http_client(api_key=key) as h:
            for name in tables:
                body = {
                    "namespace": "web",
                    "name": name,
                    "schema": [{"name": "a", "type": "int64"}],
                }
                assert h.post("/v1/tables", json=body).status_code == 201
        everyone = [proc.tenant, *made]

        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        page.set_default_timeout(30_000)
        origin = proc.http_url
        page.goto(f"{origin}/console/login")
        page.fill("#key", proc.operator_key)
        page.click("#sign-in")
        assert page.url == f"{origin}/console/tenants"

        def listed(selector: str) -> list[str]:
            return [
                t.strip()
                for t in page.locator(f"{selector} tbody td:first-child").all_text_contents()
            ]

        def follow(selector: str) -> None:
            # Each of these clicks loads a new page: the listing is read once it has loaded,
            # never from the page being left or one still arriving.
            with page.expect_navigation():
                page.click(selector)

        assert listed("#tenants") == everyone[:50]
        follow("#next-tenants")
        assert listed("#tenants") == everyone[50:100]
        follow("#next-tenants")
        assert listed("#tenants") == everyone[100:]
        assert page.locator("#next-tenants").count() == 0
        page.fill("#search-tenants", "M07")
        follow("#search-tenants-go")
        assert listed("#tenants") == [f"m07{i}" for i in range(10)]
        follow("text=m077")
        assert page.url == f"{origin}/console/tenants/m077"
        assert listed("#tables") == [f"web.{t}" for t in tables[:50]]
        follow("#next-tables")
        assert listed("#tables") == [f"web.{t}" for t in tables[50:]]
        page.fill("#search-tables", "p42")
        follow("#search-tables-go")
        assert listed("#tables") == ["web.p42"]
        page.fill("#search-tables", "nothing-like-it")
        follow("#search-tables-go")
        assert "No table's name holds" in page.text_content("#tables")
        context.close()
