"""Rendering the chart with Helm's own code (``helm-python-sdk``) and reading what it made."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.services import REPO_ROOT

CHART = REPO_ROOT / "helm" / "tidegate"
EXAMPLES = CHART / "examples"
RELEASE = "tg"
NAMESPACE = "tidegate"


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's merge of values files: maps merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def example(name: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return values


def render(
    values: Mapping[str, Any] | None = None, release: str = RELEASE, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """Every manifest ``helm template`` would print for these values (schema checked)."""
    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        files = chart.render(dict(values or {}), name=release, namespace=namespace, is_install=True)
    manifests = []
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            continue
        manifests.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return manifests


class Rendered:
    """One rendering, looked up by kind and name."""

    def __init__(
        self,
        values: Mapping[str, Any] | None = None,
        release: str = RELEASE,
        namespace: str = NAMESPACE,
    ) -> None:
        self.release = release
        self.manifests = render(values, release, namespace)

    def kinds(self) -> list[str]:
        return sorted(m["kind"] for m in self.manifests)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str, suffix: str = "") -> dict[str, Any]:
        base = self.release if "tidegate" in self.release else f"{self.release}-tidegate"
        return self.one_named(kind, f"{base}{suffix}")

    def one_named(self, kind: str, name: str) -> dict[str, Any]:
        found = [m for m in self.all(kind) if m["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind} {name} not rendered: {self.kinds()}"
        return found[0]

    def gateway(self) -> dict[str, Any]:
        """The gateway's Deployment or StatefulSet."""
        found = [m for m in self.manifests if m["kind"] in ("Deployment", "StatefulSet")]
        assert len(found) == 1
        return found[0]

    def secret_data(self, name: str) -> dict[str, str]:
        secret = next(m for m in self.all("Secret") if m["metadata"]["name"] == name)
        return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}

    def container_env(
        self, container: Mapping[str, Any], secrets: Mapping[str, Mapping[str, str]] | None = None
    ) -> dict[str, str]:
        """The environment Kubernetes would give ``container``: envFrom ConfigMaps and
        Secrets, then env entries (values, ConfigMap and Secret keys, ``$(VAR)``
        references to earlier entries). ``secrets`` stands for Secrets made outside the
        chart (existingSecret); fields of the pod (``fieldRef``) are left out."""
        config = {m["metadata"]["name"]: m.get("data", {}) for m in self.all("ConfigMap")}
        known = {
            m["metadata"]["name"]: self.secret_data(m["metadata"]["name"])
            for m in self.all("Secret")
        }
        known.update(secrets or {})
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                env.update(config[source["configMapRef"]["name"]])
            else:
                env.update(known[source["secretRef"]["name"]])
        for entry in container.get("env", []):
            if "value" in entry:
                env[entry["name"]] = expand(entry["value"], env)
                continue
            ref = entry["valueFrom"]
            if "secretKeyRef" in ref:
                env[entry["name"]] = known[ref["secretKeyRef"]["name"]][ref["secretKeyRef"]["key"]]
            elif "configMapKeyRef" in ref:
                cm = config[ref["configMapKeyRef"]["name"]]
                env[entry["name"]] = cm[ref["configMapKeyRef"]["key"]]
        return env


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of an env value (``$$`` escapes)."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
        elif value.startswith("$(", i) and ")" in value[i:]:
            end = value.index(")", i)
            name = value[i + 2 : end]
            out.append(env.get(name, value[i : end + 1]))
            i = end + 1
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def pod_spec(workload: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template spec of a Deployment, StatefulSet, Job or CronJob."""
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template: dict[str, Any] = spec["template"]["spec"]
    return template


def iter_containers(manifests: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for m in manifests:
        if m["kind"] in ("Deployment", "StatefulSet", "Job", "CronJob"):
            for c in pod_spec(m)["containers"]:
                yield f"{m['kind']}/{m['metadata']['name']}/{c['name']}", c


def paths_of(volume_mounts: list[dict[str, Any]]) -> dict[str, Path]:
    return {m["name"]: Path(m["mountPath"]) for m in volume_mounts}
