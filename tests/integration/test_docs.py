"""The README, run as its reader runs it (issue 32): every block of the sections that use a
gateway, in README order, in one terminal of a fresh clone against a gateway started as
`make run` starts it, Python with the interpreter the README names. Each block's exit code
and output are checked, so an example that breaks the next one (a table left in a state
the next example does not expect) fails here. Every other code block of the README and
docs/ is run by the test named in :data:`ELSEWHERE`, or says there why no test runs it.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.client import Client
from tests.integration.docs_runner import (
    Ran,
    Served,
    Shell,
    blocks,
    expected_output,
    pages,
)
from tests.services import REPO_ROOT

# The walk (a gateway, some thirty commands, a Spark job) is made once, by the first test
# that needs it: minutes on a busy machine, so more than the default per-test timeout.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.timeout(2400),
]

README = REPO_ROOT / "README.md"
#: The README's sections whose blocks the walk-through runs, in this order (the README's).
WALKED = (
    "Get a key",
    "Use it",
    "Evolve a schema",
    "Tiering",
    "Query it from any engine",
    "Spark",
)
#: Code blocks not run by the walk-through: (page, heading) -> the test that runs them, or
#: why none does. tests/integration/test_docs_pages.py runs docs/client.md and
#: docs/engines.md's pyiceberg and DuckDB blocks the same way.
ELSEWHERE = {
    ("README.md", "Quick start"): "tests/test_repo.py runs `make run` "
    "(test_run_command_serves_on_embedded_defaults); `make test` is what .ci/run runs",
    ("README.md", "Install from a wheel"): "tests/test_package.py runs these steps: make "
    "dist's build, a fresh virtualenv, pip install of the wheel (from the wheelhouse, "
    "offline), tidegate --version and serve",
    ("README.md", "Install on Kubernetes"): "tests/helm/test_readme_install.py renders the "
    "release these commands install (no Docker daemon, registry or cluster here)",
    ("README.md", "Benchmarks"): "no test: `make bench` is the twenty-minute benchmark suite; "
    ".ci/run runs its smoke mode, make bench-smoke",
    ("docs/architecture.md", "The import rule"): "a listing, not a command: "
    "test_the_architecture_listing_is_the_import_contract checks it",
    ("docs/durability.md", "How the fault suite checks it"): "tests/faults/test_commands.py "
    "checks each `make` line runs the fault suite's entry point (make -n); make test runs "
    "seeds 1 to 4",
    ("docs/engines.md", "Spark with Iceberg's runtime"): "no test: spark-sql --packages "
    "downloads Iceberg's jars from Maven Central, which this project's machines cannot reach",
    ("docs/engines.md", "Trino"): "no test: a Trino server's catalog file; no Trino here",
    ("docs/spark.md", ""): "tests/spark/test_docs.py, in the test session's SparkSession",
    **{
        ("docs/kafka.md", heading): "tests/kafka/test_docs.py runs the page's blocks in order"
        for heading in (
            "A table to use",
            "confluent-kafka (librdkafka)",
            "A consumer group (group.protocol=consumer)",
            "kafka-python",
            "aiokafka",
            "kcat",
            "Admin clients",
        )
    },
    ("docs/spark.md", "Writes"): "tests/spark/test_docs.py runs the page's snippets in order "
    "as one program, this one after the first",
}
#: (page, heading) of the blocks tests/integration/test_docs_pages.py runs.
CLIENT_GUIDE = ("Connect", "Tables", "Produce", "Consume", "Primary-key tables", "asyncio")
CLIENT_GUIDE += ("Scans that read the lake", "Bulk reads over Arrow Flight")
PAGES_RUN = {("docs/client.md", heading) for heading in CLIENT_GUIDE} | {
    ("docs/engines.md", "pyiceberg"),
    ("docs/engines.md", "DuckDB"),
}


@dataclass
class Walk:
    shell: Shell
    served: Served

    def ran(self, heading: str, lang: str | None = None) -> list[Ran]:
        return [
            r
            for r in self.shell.ran
            if r.block.heading == heading and (lang is None or r.block.lang == lang)
        ]

    def client(self) -> Client:
        return Client(self.served.grpc_target, api_key=self.shell.env["TIDEGATE_API_KEY"])


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    """The README, walked once: `make run` in a fresh clone (tiering every half second
    instead of 30 s), then each block of :data:`WALKED` in one terminal, in order. A block
    that fails is recorded and the walk goes on, as a reader would (the tests below say
    which failed and why)."""
    folder = tmp_path_factory.mktemp("clone")
    served = Served(
        folder,
        {"TIDEGATE_TIERING__INTERVAL_S": "0.5", "TIDEGATE_TIERING__HOT_RETENTION_S": "0"},
    )
    http = served.http_address
    shell = Shell(
        folder,
        replace={
            "127.0.0.1:50051": served.grpc_target,
            "localhost:8080": http,
            "127.0.0.1:8080": http,
            "sleep 35": "sleep 10",  # one tiering interval of this gateway, with room
        },
        # The CLI's gateway: the default address, had it been free.
        env={"TIDEGATE_TARGET": served.grpc_target},
    )
    try:
        for n, block in enumerate(b for b in blocks(README) if b.heading in WALKED):
            if block.lang == "sh":
                shell.sh(block)
            elif block.lang == "python":
                # A Spark job starts a JVM: minutes on a machine as busy as CI's can be.
                shell.python(block, f"example{n}.py", timeout=900)
            else:  # pragma: no cover - a new kind of block needs a way to run it
                raise AssertionError(f"how does a reader run a {block.lang!r} block? {block}")
        yield Walk(shell, served)
    finally:
        served.stop()


def _show(r: Ran) -> str:
    return f"{r.block.page}:{r.block.line} ({r.block.heading})\n{r.out[-1500:]}\n{r.err[-3000:]}"


def test_every_readme_block_runs_clean_in_readme_order(walk: Walk) -> None:
    walked = [b for b in blocks(README) if b.heading in WALKED]
    assert [r.block for r in walk.shell.ran] == walked
    assert {b.heading for b in walked} == set(WALKED)
    for r in walk.shell.ran:
        assert r.ok(), _show(r)
        assert "Traceback" not in r.err, _show(r)


def test_get_a_key_and_use_it(walk: Walk) -> None:
    (key,) = walk.ran("Get a key")
    assert walk.shell.env["TIDEGATE_API_KEY"].startswith("tg_"), key.err
    curl, cli = walk.ran("Use it", "sh")
    answers = curl.out.replace(" ", "")
    # The append lands where the text says, and the read it shows returns that row.
    assert '"partition":1,"base_offset":0' in answers
    assert '"customer":"ada"' in answers
    (python,) = walk.ran("Use it", "python")
    assert "AppendRange(partition=0, base_offset=0, count=2, duplicate=False)" in python.out
    assert "RecordMetadata(partition=0, offset=2)" in python.out
    assert "2 view 3" in python.out
    assert "[{'kind': 'buy'}]" in python.out
    assert "appended 2 records to shop.clicks" in cli.out
    read_all = [json.loads(line) for line in cli.out.splitlines() if line.startswith("{")]
    assert sorted(r["user"] for r in read_all[:2]) == ["ada", "alan"]  # both partitions
    with walk.client() as c:
        assert sum(c.describe_table("shop.orders").high_watermarks) == 1
        assert sum(c.describe_table("shop.clicks").high_watermarks) == 2


def test_item1_the_duckdb_example_runs_offline(walk: Walk) -> None:
    """Issue 32, item 1: the example installs DuckDB's extensions from their PyPI packages
    (a fresh home had none), and reads the tiered rows through the REST catalog."""
    (ran,) = walk.ran("Query it from any engine")
    assert ran.ok(), _show(ran)
    assert ran.out.splitlines() == expected_output(ran.block)
    assert "INSTALL iceberg" not in ran.block.text  # DuckDB's own INSTALL downloads
    home = Path(walk.shell.env["HOME"])
    assert list(home.glob(".duckdb/extensions/*/*/iceberg.duckdb_extension"))


def test_item2_the_schema_examples_apply_in_readme_order(walk: Walk) -> None:
    """Issue 32, item 2: `--widen n:int64 --optional n` on the table the Use-it example
    made (n an int32 there) applies, with the changes before it."""
    for ran in walk.ran("Evolve a schema"):
        assert ran.ok(), _show(ran)
    assert "--widen n:int64 --optional n" in walk.ran("Evolve a schema")[0].block.text
    with walk.client() as c:
        events = {f.name: f for f in c.describe_table("shop.events").fields}
        assert events["n"].type == "int64" and events["n"].nullable
        orders = {f.name: f for f in c.describe_table("shop.orders").fields}
        assert orders["coupon"].added and orders["amount"].doc == "total, tax included"
        clicks = {f.name: f for f in c.describe_table("shop.clicks").fields}
        assert clicks["referrer"].added and clicks["page"].doc == "path of the page"


def test_item3_python_examples_run_with_the_interpreter_the_readme_names(walk: Walk) -> None:
    """Issue 32, item 3: the README names the interpreter (the virtualenv's `python`, and
    `python3`, once Get a key's exports ran) and the import name; both run the example.
    Without those exports the system's python3 fails as the README says it does."""
    readme = README.read_text()
    assert "The distribution is `tidegate`, its Python package `gateway`" in readme
    assert "i.e. `.venv/bin/python`" in readme
    (python,) = walk.ran("Use it", "python")
    assert python.ok(), _show(python)
    name = next(p.name for p in walk.shell.folder.glob("example*.py") if "shop.events" in
                p.read_text() and "producer" in p.read_text())  # fmt: skip
    for interpreter in ("python3", ".venv/bin/python"):
        for _ in range(3):
            again = subprocess.run(
                ["bash", "-c", f"{interpreter} {name}"],
                cwd=walk.shell.folder,
                env=walk.shell.env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            # The example keeps the SDK's 5 s first contact, which a loaded machine (the
            # suite's workers beside this walk's gateway) may pass: that alone is tried
            # again; what this test is about (the interpreter, the import) is not.
            if "cannot reach a Tidegate gateway" not in again.stderr:
                break
        assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
        assert "RecordMetadata(partition=0, offset=" in again.stdout  # it appended again
    bare = {**walk.shell.env, "PATH": "/usr/local/bin:/usr/bin:/bin"}
    system = subprocess.run(
        ["bash", "-c", f"python3 {name}"],
        cwd=walk.shell.folder,
        env=bare,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert system.returncode != 0 and "No module named 'gateway'" in system.stderr


def test_tiering_and_spark(walk: Walk) -> None:
    (commands,) = walk.ran("Tiering")
    lines = commands.out.splitlines()
    # The last partition-0 row is describe's (create printed one before the appends).
    part0 = [line.split() for line in lines if line.strip().startswith("0 ")][-1]
    assert part0[:6] == ["0", "0", "2", "2", "0", "0"]  # HW 2, T 2, no lag
    read = [json.loads(line) for line in lines if line.startswith("{")]
    assert [(r["page"], r["_tier"]) for r in read] == [("/", "iceberg"), ("/buy", "iceberg")]
    assert any(line.split()[2:4] == ["append", "2"] for line in lines if line[:1].isdigit())
    (spark,) = walk.ran("Spark")
    # Offsets 1 and 2 of shop.events in README order: Use it's second row and the
    # producer's; the filter pushed to the plan leaves offset 0 out.
    assert "| buy|  2|" in spark.out and "|view|  3|" in spark.out, _show(spark)
    assert "|view|  1|" not in spark.out, _show(spark)


def test_every_snippet_is_run_or_accounted_for() -> None:
    """Every code block of the README and docs/ is run by the walk-through, by
    test_docs_pages.py, or by the test :data:`ELSEWHERE` names (or says why none can)."""
    found = {(b.page, b.heading) for page in pages() for b in blocks(page)}
    walked = {("README.md", h) for h in WALKED}
    missing = found - walked - PAGES_RUN - set(ELSEWHERE)
    assert not missing, f"code blocks no test runs: {sorted(missing)}"
    assert not (set(ELSEWHERE) | PAGES_RUN | walked) - found, "stale entries"
    for why in ELSEWHERE.values():
        for named in re.findall(r"tests/[\w/]+\.py", why):
            assert (REPO_ROOT / named).exists(), named
    decisions = [b for b in found if b[0].startswith("docs/decisions/")]
    assert not decisions, "the design log holds no code to run"


def test_the_architecture_listing_is_the_import_contract() -> None:
    """docs/architecture.md's layer listing is pyproject.toml's import-linter layers."""
    import tomllib

    (listing,) = blocks(REPO_ROOT / "docs" / "architecture.md")
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["id"] == "layers"]
    assert listing.text.splitlines() == layers
