"""The package as a user installs it (issue 32, item 4): `make dist` builds a wheel and an
sdist; the wheel, installed into a fresh virtualenv outside the checkout, serves with
`tidegate serve` (the console's files included) and its SDK appends and reads.

The wheel's dependencies come from the wheelhouse `make wheelhouse` keeps in the
virtualenv (`make test` and `make pytest` make it), so the install needs no network."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.services import REPO_ROOT, free_port, wait_for_port
from tests.test_repo import _make_dry_run

WHEELHOUSE = Path(sys.prefix) / "wheelhouse"


def test_make_dist_builds_with_the_venvs_own_setuptools(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    lines = _make_dry_run(venv, "dist")
    assert lines[-1] == f"{venv}/bin/python -m build --no-isolation --outdir dist ."
    # The tests' own run makes the wheelhouse the wheel test installs from.
    pytest_lines = _make_dry_run(venv, "pytest")
    made = [ln for ln in pytest_lines if "pip wheel" in ln]
    assert made and "--wheel-dir" in made[0] and "'.[server]'" in made[0]
    assert pytest_lines.index(made[0]) < len(pytest_lines) - 1  # before pytest runs


def _clean_env(venv: Path, home: Path) -> dict[str, str]:
    """A user's fresh shell with the new virtualenv first on PATH: nothing of the checkout
    (no PYTHONPATH, no TIDEGATE_ setting, no pip configuration of this machine)."""
    home.mkdir(exist_ok=True)
    return {
        "PATH": f"{venv / 'bin'}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> str:
    proc = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


SDK_SCRIPT = """
import os
from gateway.client import Client

with Client(os.environ["TIDEGATE_TARGET"], api_key=os.environ["TIDEGATE_API_KEY"]) as c:
    c.create_table("shop.events", {"kind": "string", "n": "int32"})
    print(c.append("shop.events", [{"kind": "view", "n": 1}]))
    with c.producer("shop.events") as producer:
        sent = producer.send({"kind": "buy", "n": 2})
    print(sent.result())
    print([(r["kind"], r["n"]) for r in c.read("shop.events", partition=0, offset=0).to_pylist()])
"""


@pytest.mark.integration
@pytest.mark.slow
def test_the_wheel_serves_from_a_fresh_venv_outside_the_checkout(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # What `make dist` runs: the sdist first, then the wheel built from the sdist (so a
    # file the sdist forgot would be missing from the wheel, and fail below).
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(REPO_ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("tidegate-*.whl")
    (sdist,) = dist.glob("tidegate-*.tar.gz")
    inside = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "gateway/py.typed",
        "gateway/server/http/console/templates/table.html",
        "gateway/server/http/console/static/console.js",
        "gateway/server/http/console/static/favicon.svg",
        "gateway/server/http/console/static/vendor/uPlot.iife.min.js",
        "gateway/meta/migrations/versions/0001_initial.py",
        "gateway/wire/_proto/tidegate/v1/tidegate_pb2.py",
        "tiering/__main__.py",
    ):
        assert needed in inside, needed
    # The Spark connector's jar travels inside the wheel once the build has made it.
    for jar in (REPO_ROOT / "gateway" / "spark" / "jars").glob("*.jar"):
        assert f"gateway/spark/jars/{jar.name}" in inside, jar.name
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "gateway/meta/migrations/env.py"} <= names

    assert (WHEELHOUSE / ".made").exists(), "no wheelhouse: `make wheelhouse` makes it"
    venv, home, work = tmp_path / "venv", tmp_path / "home", tmp_path / "work"
    work.mkdir()
    env = _clean_env(venv, home)
    _run([sys.executable, "-m", "venv", str(venv)], env, work)
    _run(
        # --no-compile: byte-compiling every dependency doubled the install time.
        [
            "pip",
            "install",
            "--no-compile",
            "--no-index",
            f"--find-links={WHEELHOUSE}",
            f"{wheel}[server]",
        ],
        env,
        work,
        timeout=600,
    )
    assert _run(["tidegate", "--version"], env, work).strip() == "tidegate 0.1.0"
    where = _run(["python", "-c", "import gateway; print(gateway.__file__)"], env, work)
    assert where.startswith(str(venv)), where  # the installed package, not the checkout

    grpc_port, http_port = free_port(), free_port()
    serve = subprocess.Popen(
        [
            "tidegate",
            "serve",
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            str(http_port),
            "--kafka-port",
            str(free_port()),
        ],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for_port(http_port, 120, serve)  # type: ignore[arg-type]
        user = {**env, "TIDEGATE_TARGET": f"127.0.0.1:{grpc_port}"}
        user["TIDEGATE_OPERATOR_KEY"] = (work / "tidegate-data" / "operator.key").read_text()
        _run(["tidegate", "tenant", "create", "shop"], user, work)
        user["TIDEGATE_API_KEY"] = _run(["tidegate", "tenant", "key", "issue", "shop"], user, work)
        user["TIDEGATE_API_KEY"] = user["TIDEGATE_API_KEY"].strip()
        printed = _run(["python", "-c", SDK_SCRIPT], user, work).splitlines()
        assert printed == [
            "[AppendRange(partition=0, base_offset=0, count=1, duplicate=False)]",
            "RecordMetadata(partition=0, offset=1)",
            "[('view', 1), ('buy', 2)]",
        ]
        with httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as http:
            login = http.get("/console/login")
            assert login.status_code == 200 and 'id="sign-in"' in login.text
            assert http.get("/console/static/console.js").status_code == 200
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        out, _ = serve.communicate(timeout=60)
    text = out.decode(errors="replace")
    assert "stopped" in text and "Traceback" not in text, text[-3000:]
