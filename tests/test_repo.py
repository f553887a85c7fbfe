"""Repository-level checks: generated stubs, the README quick start, packaging."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.services import REPO_ROOT, free_port, wait_for_port


def test_grpc_stubs_match_proto() -> None:
    proc = subprocess.run(
        [sys.executable, "scripts/gen_proto.py", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def quickstart_commands() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:sh|bash|console)?\n(.*?)```", section, re.S)
    assert block, "the quick start must hold one code block"
    return [
        line.split("#")[0].strip()
        for line in block.group(1).splitlines()
        if line.split("#")[0].strip()
    ]


def test_readme_quick_start_is_two_commands() -> None:
    assert quickstart_commands() == ["make run", "make test"]
    # ... and ends with what to do next: the console with the operator key, and the two
    # commands that get a tenant's key (issue 32).
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    last = section.strip().split("\n\n")[-1]
    assert "<http://127.0.0.1:8080/console>" in last and "operator key" in last
    assert "`tidegate tenant create shop`" in last and "`tidegate tenant key issue shop`" in last
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def _make_dry_run(venv: Path, target: str, *variables: str) -> list[str]:
    """The commands `make <target> [NAME=value...]` would run with the virtualenv at ``venv``."""
    env = {k: v for k, v in os.environ.items() if k not in _MAKE_VARS}
    env["LC_ALL"] = "C"  # make's own messages in English
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", f"VENV={venv}", target, *variables],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


_MAKE_VARS = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "EXTRAS", "RUN_EXTRAS", "VENV", "PYTHON"}


def test_make_run_installs_only_what_serving_needs(tmp_path: Path) -> None:
    """Issue 16, item 8: `make run` installs the server extra alone and says so; `make test`
    installs everything, and either may come first in one checkout."""
    venv = tmp_path / "venv"
    py = f"{venv}/bin/python"
    run = _make_dry_run(venv, "run")
    assert [ln for ln in run if " -e " in ln] == [f"{py} -m pip install -e '.[server]'"]
    assert any(ln.startswith('echo "tidegate: installing tidegate[server]') for ln in run)
    assert run[-1] == f"{venv}/bin/tidegate serve"
    full = _make_dry_run(venv, "setup")
    assert [ln for ln in full if " -e " in ln] == [
        f"{py} -m pip install -e '.[server,postgres,spark,bench,dev]'"
    ]
    assert not [ln for ln in run + full if "pip install" in ln and " -e " in ln and "-q" in ln]

    # `make run`, then `make test`: the server-only install does not count for the tests.
    venv.mkdir()
    (venv / ".installed-run").touch()
    assert _make_dry_run(venv, "run") == [f"{venv}/bin/tidegate serve"]
    assert f"{py} -m pip install -e '.[server,postgres,spark,bench,dev]'" in _make_dry_run(
        venv, "setup"
    )
    # `make test` first: its install stamps both, so `make run` installs nothing more.
    assert full[-1] == f"touch {venv}/.installed {venv}/.installed-run"
    (venv / ".installed").touch()
    assert _make_dry_run(venv, "run") == [f"{venv}/bin/tidegate serve"]
    assert _make_dry_run(venv, "setup") == ["make: Nothing to be done for 'setup'."]


def test_without_pyspark_the_spark_runner_says_what_to_install(tmp_path: Path) -> None:
    """`make run` installs no pyspark: asking for the Spark runner then names the extra
    (and the runner that needs none) instead of a traceback."""
    code = (
        "import sys; sys.modules['pyspark'] = None\n"  # as if not installed
        "from gateway.cli import main\n"
        f"sys.argv = ['tidegate', 'tier', '--runner', 'spark', '--data-dir', {str(tmp_path)!r}]\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "pip install 'tidegate[spark]'" in out.stderr and "--runner local" in out.stderr


def test_pyproject_licence_is_an_spdx_expression() -> None:
    """Issue 16, item 8: the TOML-table licence made setuptools print deprecation warnings
    on every install (PEP 639: an SPDX string, no licence classifiers)."""
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]


@pytest.mark.integration
def test_run_command_serves_on_embedded_defaults(tmp_path: Path) -> None:
    """`make run` (the README's first command) starts a working gateway with no services."""
    http_port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    env.update(
        TIDEGATE_SERVER__HTTP_PORT=str(http_port),
        TIDEGATE_SERVER__GRPC_PORT=str(grpc_port),
        TIDEGATE_KAFKA__PORT=str(free_port()),
        TIDEGATE_DATA_DIR=str(tmp_path / "data"),
    )
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "run"],
        cwd=REPO_ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(http_port, 120, proc)  # type: ignore[arg-type]
        base = f"http://127.0.0.1:{http_port}"
        with httpx.Client(base_url=base, timeout=10) as c:
            for _ in range(100):
                if c.get("/readyz").status_code == 200:
                    break
            # The operator key was generated at first start and kept in the data folder.
            operator = (tmp_path / "data" / "operator.key").read_text().strip()
            admin = {"authorization": f"Bearer {operator}"}
            assert c.get("/v1/tables").status_code == 401
            assert c.post("/v1/admin/tenants", json={"name": "demo"}, headers=admin).is_success
            issued = c.post("/v1/admin/tenants/demo/keys", headers=admin)
            assert issued.status_code == 201, issued.text
            c.headers["authorization"] = f"Bearer {issued.json()['api_key']}"
            created = c.post(
                "/v1/tables",
                json={"namespace": "demo", "name": "t", "schema": {"v": "int64"}, "partitions": 1},
            )
            assert created.status_code == 201, created.text
            assert c.post("/v1/tables/demo/t/records", json={"rows": [{"v": 7}]}).status_code == 200
            got = c.get("/v1/tables/demo/t/partitions/0/records", params={"offset": 0}).json()
            assert [r["v"] for r in got["records"]] == [7]
        assert (tmp_path / "data" / "metadata.db").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert b"stopped" in out, out.decode(errors="replace")[-2000:]
    assert operator.encode() in out, "the generated operator key is printed at first start"
    # It ends its start with the next steps: the console and a tenant's key (issue 32).
    assert f"http://127.0.0.1:{http_port}/console".encode() in out
    assert b"tenant key issue shop" in out


def test_design_log_is_one_copy_with_unique_dated_headings() -> None:
    """Every design decision is recorded once: ``##`` headings are unique across the pages
    of ``docs/decisions/``, each dated, and the index links every page."""
    pages = sorted((REPO_ROOT / "docs" / "decisions").glob("*.md"))
    assert pages, "docs/decisions/ holds the design log"
    index = (REPO_ROOT / "docs" / "design-choices.md").read_text()
    seen: dict[str, str] = {}
    for page in pages:
        assert f"(decisions/{page.name})" in index, f"docs/design-choices.md must link {page.name}"
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("## "):
                continue
            heading = line[3:].strip()
            assert heading not in seen, f"{heading!r} is in {seen.get(heading)} and {page.name}"
            seen[heading] = page.name
            assert i + 1 < len(lines) and re.fullmatch(
                r"\*Recorded \d{4}-\d{2}-\d{2}\.\*", lines[i + 1]
            ), f"{page.name}: {heading!r} must be followed by its '*Recorded YYYY-MM-DD.*' line"
    assert "\n## " not in index, "decisions go in docs/decisions/, the index holds none"
