"""README "Install on Kubernetes": its commands render a valid release (no cluster here),
and the Secret it creates holds exactly the keys that release reads."""

from __future__ import annotations

import re
import shlex
from typing import Any

import helm_python as helm
import kubernetes_validate

from tests.helm.chart import CHART, Rendered, merge
from tests.services import REPO_ROOT


def commands() -> list[list[str]]:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Install on Kubernetes", 1)[1].split("\n## ", 1)[0]
    words = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip():
                words.append(shlex.split(line))
    return words


def option_values(argv: list[str], *names: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word in names]


def test_readme_helm_install_renders_a_valid_release() -> None:
    (install,) = [argv for argv in commands() if argv[:2] == ["helm", "install"]]
    release, chart = install[2], install[3]
    assert (REPO_ROOT / chart).resolve() == CHART
    (namespace,) = option_values(install, "-n", "--namespace")
    values: dict[str, Any] = {}
    for path in option_values(install, "-f", "--values"):
        values = merge(values, helm.values_from_yaml((REPO_ROOT / path).read_text()))
    for expression in option_values(install, "--set"):
        values = merge(values, helm.parse_set_string(expression))
    rendered = Rendered(values, release, namespace)
    for manifest in rendered.manifests:
        if manifest["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(manifest, kubernetes_validate.latest_version(), True)
    # The names the README tells people to use.
    assert rendered.one_named("Service", "tidegate")["metadata"]["namespace"] == namespace
    metrics = rendered.one_named("Service", "tidegate-metrics")
    assert metrics["spec"]["ports"][0]["port"] == 9090
    image = rendered.gateway()["spec"]["template"]["spec"]["containers"][0]["image"]
    (built,) = [argv[3] for argv in commands() if argv[:2] == ["docker", "build"]]
    assert image == built

    # The Secret the README creates holds exactly what the release reads from it.
    (create,) = [argv for argv in commands() if "generic" in argv]
    secret_name = create[create.index("generic") + 1]
    literals = [w.removeprefix("--from-literal=") for w in create if w.startswith("--from-")]
    created = {literal.split("=", 1)[0] for literal in literals}
    read = set()
    for manifest in rendered.manifests:
        for key, ref in _secret_refs(manifest):
            if key == secret_name:
                read.add(ref)
    assert created == read
    assert option_values(create, "-n") == [namespace]


def _secret_refs(node: Any) -> list[tuple[str, str]]:
    """Every (Secret name, key) a manifest refers to, wherever it is nested."""
    found = []
    if isinstance(node, dict):
        for key in ("secretKeyRef", "credentials"):
            if key in node and isinstance(node[key], dict) and "key" in node[key]:
                found.append((node[key]["name"], node[key]["key"]))
        for value in node.values():
            found.extend(_secret_refs(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_secret_refs(value))
    return found
