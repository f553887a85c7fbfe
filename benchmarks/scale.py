"""What a gateway costs as tables accumulate (issue 30.5): N tables across M tenants on
each hot tier, every table written once then idle, a few of them active.

    python -m benchmarks.scale [--mode quick|full] [--sizes 10,100,1000]
                               [--hot disk,redis] [--root DIR] [--label NAME] [--out DIR]

For each hot tier (disk, and Redis on a redis-server of the run's own) one gateway is
started with the tiering interval at 10 s (the issue's "before" setup). Tables are created
through the HTTP API (4 partitions, one record appended to each), ``tables_per_tenant`` per
tenant, until each size is reached; then, at that size:

- **create**: on the idle gateway (last, after the active phase's records are tiered), 20
  more tables created and appended to once, one after another: the ms of the create alone
  and of the new table's first append alone;
- **list**: one page of 100 of a tenant's tables (``GET /v1/tables?page_size=100``; a
  gateway without pagination answers the whole list, 100 tables per tenant here), and one
  page of 100 tenants (``GET /v1/admin/tenants?page_size=100``);
- **idle**: once the new tables have been tiered (the tiering lag metric at 0 and no
  table visited by tiering over an interval, twice; then one more interval), the
  gateway's CPU share of one core over ``idle_s`` with no request at all, its open
  descriptors and RSS;
- **active**: ``active`` tables appended to at ``rate`` batches/s each for ``active_s``:
  the append p50 and p99 (HTTP), and every acknowledged record's freshness (seconds from
  its acknowledgement until ``T(p)`` covers it, as describe read every 0.5 s shows).

``--root`` runs the gateway of another checkout (e.g. ``git archive main`` unpacked) with
this one's benchmark, so a "before" is measured the same way in the same run. Results go
to ``<out>/<label>.json`` and a table in ``<out>/summary.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "scale"

MODES: dict[str, dict[str, Any]] = {
    "quick": {"sizes": [10, 100, 1000], "idle_s": 20.0, "active_s": 15.0},
    "full": {"sizes": [10, 1000, 10000, 50000], "idle_s": 60.0, "active_s": 30.0},
    "smoke": {"sizes": [5, 20], "idle_s": 3.0, "active_s": 3.0},
}
TABLES_PER_TENANT = 100
PARTITIONS = 4
INTERVAL_S = 10.0
ACTIVE = 5
RATE = 5.0
POLL_S = 0.5
CREATES = 20
FIELDS = [{"name": "k", "type": "string"}, {"name": "n", "type": "int64"}]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Scale:
    """One gateway and the tenants and tables made on it so far."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.keys: list[str] = []
        self.tables: list[tuple[str, str]] = []  # (key, name)
        self._clients: dict[str, httpx.Client] = {}
        self._lock = threading.Lock()

    def client(self, key: str) -> httpx.Client:
        ident = f"{key}:{threading.get_ident()}"
        with self._lock:
            c = self._clients.get(ident)
            if c is None:
                c = self._clients[ident] = httpx.Client(
                    base_url=self.gw.http_url,
                    headers={"authorization": f"Bearer {key}"},
                    timeout=120,
                )
            return c

    def close(self) -> None:
        for c in self._clients.values():
            c.close()

    def _key_for(self, index: int) -> str:
        while len(self.keys) <= index // TABLES_PER_TENANT:
            # Over HTTP, retried: a loaded machine delays a gRPC channel's first contact
            # past its timeout (a full run died so at 1,000 tables).
            name = f"s{uuid.uuid4().hex[:8]}"
            op = self.client(self.gw.operator_key)
            made = _retried(op.post, "/v1/admin/tenants", json={"name": name})
            assert made.status_code in (201, 409), made.text
            key = _retried(op.post, f"/v1/admin/tenants/{name}/keys")
            key.raise_for_status()
            self.keys.append(key.json()["api_key"])
        return self.keys[index // TABLES_PER_TENANT]

    def create(self, index: int) -> tuple[float, float]:
        """Create table ``index`` and append one record to it; seconds each took."""
        key = self._key_for(index)
        name = f"t{index}"
        h = self.client(key)
        started = time.perf_counter()
        r = _retried(
            h.post,
            "/v1/tables",
            json={"namespace": "ns", "name": name, "schema": FIELDS, "partitions": PARTITIONS},
        )
        assert r.status_code in (201, 409), r.text
        made = time.perf_counter()
        r = _retried(h.post, f"/v1/tables/ns/{name}/records", json={"rows": [{"k": "x", "n": 1}]})
        r.raise_for_status()
        appended = time.perf_counter()
        with self._lock:
            self.tables.append((key, name))
        return made - started, appended - made

    def creates(self, count: int) -> dict[str, float]:
        """``count`` more tables made one after another on the idle gateway: the p50 and
        p90 ms of a create alone, of the new table's first append alone, and of both."""
        took = [self.create(len(self.tables)) for _ in range(count)]
        made = [a * 1000 for a, _ in took]
        first = [b * 1000 for _, b in took]
        both = [(a + b) * 1000 for a, b in took]
        return {
            "create_ms_p50": round(pct(made, 0.5), 1),
            "create_ms_p90": round(pct(made, 0.9), 1),
            "first_append_ms_p50": round(pct(first, 0.5), 1),
            "create_append_ms_p50": round(pct(both, 0.5), 1),
            "create_append_ms_p90": round(pct(both, 0.9), 1),
        }

    def grow_to(self, n: int, threads: int = 6) -> None:
        start = len(self.tables)
        if n <= start:
            return
        # Each tenant's first table alone (a gateway before 7f74820 failed two first
        # creates of a tenant at once), the rest in parallel.
        firsts = [i for i in range(start, n) if i % TABLES_PER_TENANT == 0]
        for i in firsts:
            self.create(i)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(self.create, [i for i in range(start, n) if i not in set(firsts)]))

    def list_ms(self, tries: int = 5) -> float:
        """Median ms of one page of 100 tables of the last tenant."""
        return self._median_get(self.client(self.keys[-1]), "/v1/tables", tries)

    def list_tenants_ms(self, tries: int = 5) -> float:
        """Median ms of one page of 100 tenants (the operator's listing)."""
        h = self.client(self.gw.operator_key)
        return self._median_get(h, "/v1/admin/tenants", tries)

    @staticmethod
    def _median_get(h: httpx.Client, path: str, tries: int) -> float:
        took = []
        for _ in range(tries):
            started = time.perf_counter()
            r = h.get(path, params={"page_size": 100})
            r.raise_for_status()
            took.append((time.perf_counter() - started) * 1000)
        return statistics.median(took)

    def idle(self, seconds: float) -> dict[str, float]:
        pid = self.gw.proc.pid
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(seconds)
        share = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
        return {
            "idle_cpu_pct": round(100 * share, 2),
            "descriptors": descriptors(pid),
            "rss_mib": round(rss_mib(pid), 1),
        }

    def active(self, seconds: float) -> dict[str, float]:
        """``ACTIVE`` tables appended to at ``RATE`` batches/s each for ``seconds``: the
        append p50 and p99, and the freshness of every acknowledged record (seconds from
        its acknowledgement until describe shows ``T(p)`` past it, describe read every
        ``POLL_S`` per table until all are tiered): p50, p99 and max over them all."""
        chosen = self.tables[:ACTIVE]
        latencies: list[float] = []
        acked: dict[str, list[tuple[int, int, float]]] = {n: [] for _, n in chosen}
        stop = time.monotonic() + seconds

        def writer(key: str, name: str) -> None:
            h = self.client(key)
            i = 0
            while time.monotonic() < stop:
                started = time.perf_counter()
                r = h.post(f"/v1/tables/ns/{name}/records", json={"rows": [{"k": "a", "n": i}]})
                r.raise_for_status()
                now = time.monotonic()
                latencies.append((time.perf_counter() - started) * 1000)
                for rng in r.json()["ranges"]:
                    acked[name].append((rng["partition"], rng["base_offset"] + rng["count"], now))
                i += 1
                time.sleep(max(0.0, 1 / RATE - (time.perf_counter() - started)))

        fresh_s: list[float] = []

        def watcher(key: str, name: str) -> None:
            h = self.client(key)
            deadline = stop + 10 * INTERVAL_S
            pending = acked[name]
            while time.monotonic() < deadline:
                d = h.get(f"/v1/tables/ns/{name}").json()
                seen = time.monotonic()
                tiered = {p["partition"]: p["tiered_watermark"] for p in d["partition_info"]}
                done = [a for a in list(pending) if tiered.get(a[0], 0) >= a[1]]
                for a in done:
                    pending.remove(a)
                    fresh_s.append(seen - a[2])
                if not pending and time.monotonic() > stop:
                    return
                time.sleep(POLL_S)
            fresh_s.extend(deadline - a[2] for a in pending)  # never tiered: the bound

        passes0 = _tiering_runs(self.gw)
        threads = [threading.Thread(target=writer, args=t) for t in chosen]
        threads += [threading.Thread(target=watcher, args=t) for t in chosen]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        passes1 = _tiering_runs(self.gw)
        runs = passes1[0] - passes0[0]
        return {
            # The tiering runs meanwhile: a record waits for at most an interval after a
            # run ends plus the runs around it, so these say what the freshness is made of.
            "tiering_runs": int(runs),
            "tiering_run_mean_s": round((passes1[1] - passes0[1]) / runs, 2) if runs else None,
            "append_p99_ms": round(pct(latencies, 0.99), 1),
            "append_p50_ms": round(pct(latencies, 0.5), 1),
            "freshness_p50_s": round(pct(fresh_s, 0.5), 1),
            "freshness_p99_s": round(pct(fresh_s, 0.99), 1),
            "freshness_max_s": round(max(fresh_s), 1),
            "freshness_samples": len(fresh_s),
        }


def _tiering_runs(gw: Any) -> tuple[float, float]:
    """The gateway's tiering runs so far: their count and their seconds in all."""
    text = _retried(httpx.get, f"{gw.http_url}/metrics", timeout=120).text
    got = {"count": 0.0, "sum": 0.0}
    for line in text.splitlines():
        for k in got:
            if line.startswith(f"tidegate_tiering_run_duration_seconds_{k} "):
                got[k] = float(line.split()[-1])
    return got["count"], got["sum"]


def _retried(call: Any, *args: Any, tries: int = 5, **kwargs: Any) -> httpx.Response:
    """``call(*args, **kwargs)`` again after a timeout or a lost connection (a loaded
    machine; a create retried after its answer was lost is answered 409)."""
    for attempt in range(tries):
        try:
            return call(*args, **kwargs)  # type: ignore[no-any-return]
        except httpx.TransportError:
            if attempt == tries - 1:
                raise
            time.sleep(2.0)
    raise AssertionError("unreachable")


def settle(gw: Any, deadline_s: float = 1800.0) -> None:
    """Wait until the gateway has tiered every record and its tiering passes visit no
    table any more: its ``tidegate_tiering_lag_records`` at 0 and its
    ``tidegate_tiering_tables_total`` unchanged over a tiering interval, on two reads in a
    row; then one more interval. The idle window must not measure the tiering of the
    tables just created: a pass over 1,000 new tables takes 30 to 40 s on 2 cores, longer
    than the interval, and the lag gauge is only set when a pass ends, so a zero lag alone
    was read while the next pass was still at work (81% of a core "idle" at 1,000
    tables). A gateway whose passes kept visiting idle tables would never settle: the
    deadline then fails the run rather than measure it."""
    stop = time.monotonic() + deadline_s
    quiet = 0
    visited = None
    while quiet < 2:
        if time.monotonic() > stop:
            raise TimeoutError(f"the gateway kept tiering for {deadline_s:.0f} s")
        text = _retried(httpx.get, f"{gw.http_url}/metrics", timeout=120).text
        lines = text.splitlines()
        lag = [float(x.split()[-1]) for x in lines if x.startswith("tidegate_tiering_lag_records ")]
        tables = sum(
            float(x.split()[-1]) for x in lines if x.startswith("tidegate_tiering_tables_total{")
        )
        quiet = quiet + 1 if lag == [0.0] and tables == visited else 0
        visited = tables
        time.sleep(INTERVAL_S)
    time.sleep(INTERVAL_S)


@contextmanager
def gateway(root: Path | None, kind: str, redis_url: str | None, workdir: Path) -> Iterator[Any]:
    import tests.services as services

    if root is not None:
        services.REPO_ROOT = root
    env = {
        "TIDEGATE_HOT__TYPE": kind,
        "TIDEGATE_TIERING__INTERVAL_S": str(INTERVAL_S),
        "TIDEGATE_LOG__LEVEL": "WARNING",
    }
    if redis_url:
        env["TIDEGATE_HOT__URL"] = redis_url
    gw = services.GatewayProcess(workdir / f"gw-{kind}", env).start()
    try:
        yield gw
    finally:
        gw.stop()


def _deadline_s(n: int) -> float:
    """How long :func:`settle` waits at ``n`` tables: 30 minutes, or 5 first tierings a
    second if that is longer (50,000 new tables on 2 cores)."""
    return max(1800.0, n / 5)


def _measured(
    s: Scale, kind: str, n: int, filled: float, listed: tuple[float, float], idle_s: float,
    active_s: float,
) -> dict[str, Any]:  # fmt: skip
    """One size's row, on a gateway whose tables are all tiered."""
    row: dict[str, Any] = {
        "hot": kind,
        "tables": len(s.tables),
        "tenants": len(s.keys),
        "fill_s": round(filled, 1),
        "list_ms": round(listed[0], 1),
        "list_tenants_ms": round(listed[1], 1),
        "load_avg_1m": round(os.getloadavg()[0], 1),
    }
    row.update(s.idle(idle_s))
    # A few busy tables among the idle ones, as at every size (the tables made below
    # would add their first tiering to it).
    row.update(s.active(active_s))
    # What one more table costs at this size, once the active phase's appends are
    # tiered (the creates run on an idle gateway).
    settle(s.gw, _deadline_s(n))
    row.update(s.creates(CREATES if n > 2 * CREATES else 2))
    return row


def _keep(row: dict[str, Any], rows: list[dict[str, Any]], out: Path | None) -> None:
    print(json.dumps(row), flush=True)
    rows.append(row)
    if out is not None:  # each size kept as soon as it is measured
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")


def run(
    root: Path | None,
    sizes: list[int],
    idle_s: float,
    active_s: float,
    workdir: Path,
    kinds: list[str],
    out: Path | None = None,
    together: bool = False,
) -> list[dict[str, Any]]:
    """Each size on each hot tier: one tier after another, or (``together``) the hot
    tiers' gateways filled and tiering side by side, then measured one at a time while
    the others are idle (their idle CPU is a share of a core each; what the heavy
    phases cost each other is only their duration)."""
    from tests.services import RedisServer

    rows: list[dict[str, Any]] = []
    redis = RedisServer(workdir / "redis").start()
    try:
        with ExitStack() as stack:
            if together:
                scales = {k: _open(stack, root, k, redis.url, workdir) for k in kinds}
                for n in sizes:
                    with ThreadPoolExecutor(len(kinds)) as pool:
                        jobs = {k: pool.submit(_fill_and_settle, scales[k], n) for k in kinds}
                        fills = {k: job.result() for k, job in jobs.items()}
                    for k in kinds:
                        s = scales[k]
                        listed = (s.list_ms(), s.list_tenants_ms())
                        row = _measured(s, k, n, fills[k], listed, idle_s, active_s)
                        row["side_by_side"] = kinds
                        _keep(row, rows, out)
                return rows
            for kind in kinds:
                with ExitStack() as one:
                    s = _open(one, root, kind, redis.url, workdir)
                    for n in sizes:
                        filled = _fill(s, n)
                        listed = (s.list_ms(), s.list_tenants_ms())
                        settle(s.gw, _deadline_s(n))  # the new tables tiered, then idle
                        _keep(_measured(s, kind, n, filled, listed, idle_s, active_s), rows, out)
    finally:
        redis.stop()
    return rows


def _open(stack: ExitStack, root: Path | None, kind: str, redis_url: str, workdir: Path) -> Scale:
    gw = stack.enter_context(gateway(root, kind, redis_url if kind == "redis" else None, workdir))
    s = Scale(gw)
    stack.callback(s.close)
    return s


def _fill(s: Scale, n: int) -> float:
    started = time.monotonic()
    s.grow_to(n)
    return time.monotonic() - started


def _fill_and_settle(s: Scale, n: int) -> float:
    filled = _fill(s, n)
    settle(s.gw, _deadline_s(n))
    return filled


def summary(out: Path) -> None:
    lines = [
        "# Scale: a gateway's cost against the number of tables (issue 30)",
        "",
        "Written by `python -m benchmarks.scale`; one gateway per hot tier, 4 partitions per "
        "table, one record appended to each, tiering every 10 s; 5 active tables append "
        "5 batches/s each during the active phase. Idle CPU is a share of one core.",
        "",
    ]
    for path in sorted(out.glob("*.json")):
        doc = json.loads(path.read_text())
        lines += [
            f"## {doc['label']} ({doc['mode']}, commit {doc['commit']}, {doc['date']}, "
            f"load average at start {doc['load_avg_1m']})",
            "",
            "| hot | tables | idle CPU % | fds | RSS MiB | create ms p50 | first append ms "
            "p50 | create+append ms p50 | list ms | tenants list ms | append p99 ms "
            "| freshness s p50 / p99 / max | load |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in doc["rows"]:
            # Rows before the create was timed apart have only the two together, in
            # create_ms_p50, and one freshness sample.
            apart = "first_append_ms_p50" in r
            fresh = (
                f"{r['freshness_p50_s']} / {r['freshness_p99_s']} / {r['freshness_max_s']}"
                if "freshness_p99_s" in r
                else f"- / - / {r['freshness_max_s']}"
            )
            lines.append(
                f"| {r['hot']} | {r['tables']} | {r['idle_cpu_pct']} | {r['descriptors']} | "
                f"{r['rss_mib']} | {r['create_ms_p50'] if apart else '-'} | "
                f"{r['first_append_ms_p50'] if apart else '-'} | "
                f"{r['create_append_ms_p50'] if apart else r['create_ms_p50']} | "
                f"{r['list_ms']} | {r.get('list_tenants_ms', '-')} | {r['append_p99_ms']} | "
                f"{fresh} | {r.get('load_avg_1m', '-')} |"
            )
        lines.append("")
    (out / "summary.md").write_text("\n".join(lines))


def main() -> int:
    import subprocess

    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    parser.add_argument("--sizes", default=None, help="comma-separated table counts")
    parser.add_argument("--hot", default="disk,redis", help="comma-separated hot tiers")
    parser.add_argument("--root", type=Path, default=None, help="checkout whose gateway runs")
    parser.add_argument("--label", default="after")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--together",
        action="store_true",
        help="fill and tier the hot tiers' gateways side by side, then measure one at a time",
    )
    ns = parser.parse_args()
    mode = MODES[ns.mode]
    sizes = [int(x) for x in ns.sizes.split(",")] if ns.sizes else mode["sizes"]
    root = ns.root.resolve() if ns.root else None
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        cwd=root or HERE.parent,
    ).stdout.strip() or (root.name if root else "?")
    workdir = Path(tempfile.mkdtemp(prefix="tidegate-scale-"))
    load = round(os.getloadavg()[0], 1)
    kinds = ns.hot.split(",")
    suffix = "" if kinds == ["disk", "redis"] else "-" + "-".join(kinds)
    try:
        partial = None
        if ns.mode != "smoke":
            ns.out.mkdir(parents=True, exist_ok=True)
            partial = ns.out / f"{ns.label}-{ns.mode}{suffix}.rows.jsonl"
        rows = run(
            root, sizes, mode["idle_s"], mode["active_s"], workdir, kinds, partial, ns.together
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if ns.mode == "smoke":
        return 0
    ns.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "label": ns.label,
        "mode": ns.mode,
        "commit": commit,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_1m": load,
        "cores": os.cpu_count(),
        "rows": rows,
    }
    (ns.out / f"{ns.label}-{ns.mode}{suffix}.json").write_text(json.dumps(doc, indent=2))
    summary(ns.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
