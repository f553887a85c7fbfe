"""The JVM connector's package rule (docs/architecture.md): its Java packages depend one way
only, down the layers, and never in a circle. Checked from the sources' ``package`` lines,
``import io.tidegate...`` lines and fully qualified names (a reference inside one package needs
neither, and is fine by construction), and shown to fail when a forbidden arrow is added."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.services import REPO_ROOT

SOURCES = REPO_ROOT / "gateway" / "spark" / "jvm" / "src" / "main" / "java"
ROOT = "io.tidegate.spark"

#: Top to bottom. A package may use the packages of the layers below its own, never those of
#: its own layer (siblings stay independent) or above: the provider and table wire the roles,
#: the micro-batch stream reuses the batch read's plans and readers, reads and writes share
#: only the gateway calls and the type mapping beneath them.
LAYERS: tuple[tuple[str, ...], ...] = (
    (ROOT,),
    (f"{ROOT}.stream",),
    (f"{ROOT}.read", f"{ROOT}.write"),
    (f"{ROOT}.transport",),
    (f"{ROOT}.types",),
)

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\])\'')
_PACKAGE = re.compile(r"^\s*package\s+([\w.]+)\s*;", re.M)
#: A qualified name of ours: the package is every lower-case part before the first class name.
_QUALIFIED = re.compile(r"\b(io\.tidegate\.spark(?:\.[a-z_]\w*)*)(?:\.[A-Z*]|\s*;)")


def arrows(sources: Path) -> dict[str, set[str]]:
    """Each package of ours and the packages of ours its sources name."""
    out: dict[str, set[str]] = {}
    for path in sorted(sources.rglob("*.java")):
        code = _STRING.sub('""', _COMMENT.sub("", path.read_text()))
        declared = _PACKAGE.search(code)
        assert declared, f"{path} has no package line"
        package = declared.group(1)
        body = code[declared.end() :]
        out.setdefault(package, set()).update(
            used for used in _QUALIFIED.findall(body) if used != package
        )
    return out


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of packages (its first package repeated at the end), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def violations(sources: Path) -> list[str]:
    """Each broken rule, one sentence each (empty: the packages keep the rule)."""
    layer = {package: i for i, packages in enumerate(LAYERS) for package in packages}
    graph = arrows(sources)
    out = [
        f"{package} is in no layer of tests/test_jvm_architecture.py's LAYERS: "
        "place it there and in docs/architecture.md"
        for package in sorted(set(graph) | {p for used in graph.values() for p in used})
        if package not in layer
    ]
    for package, used in sorted(graph.items()):
        for target in sorted(used):
            if package in layer and target in layer and layer[target] <= layer[package]:
                out.append(f"{package} uses {target}, which is not in a layer below it")
    found = cycle(graph)
    if found:
        out.append("the packages form a circle: " + " -> ".join(found))
    return out


def test_the_connector_keeps_its_package_rule() -> None:
    assert violations(SOURCES) == []


def test_the_check_sees_the_real_arrows() -> None:
    # Not a vacuous pass: the arrows the split relies on are found.
    graph = arrows(SOURCES)
    assert f"{ROOT}.read" in graph[f"{ROOT}.stream"]
    assert f"{ROOT}.transport" in graph[f"{ROOT}.read"]
    assert f"{ROOT}.types" in graph[f"{ROOT}.write"]
    assert {f"{ROOT}.read", f"{ROOT}.stream", f"{ROOT}.write"} <= graph[ROOT]


@pytest.fixture
def copy_of_the_sources(tmp_path: Path) -> Path:
    shutil.copytree(SOURCES, tmp_path / "java")
    return tmp_path / "java"


@pytest.mark.parametrize(
    ("source", "line", "broken"),
    [
        (
            "read/TidegateScan.java",
            "import io.tidegate.spark.stream.TidegateMicroBatchStream;",
            "io.tidegate.spark.read uses io.tidegate.spark.stream",
        ),
        (
            "types/Types.java",
            "import io.tidegate.spark.transport.Gateway;",
            "the packages form a circle",
        ),
        (
            "write/Producer.java",
            "import io.tidegate.spark.read.ReadPlan;",
            "io.tidegate.spark.write uses io.tidegate.spark.read",
        ),
        (
            "transport/Gateway.java",
            "import static io.tidegate.spark.TidegateProvider.NAME;",
            "io.tidegate.spark.transport uses io.tidegate.spark,",
        ),
        (
            "types/SlicedVector.java",
            "final class Sneak { Object all = io.tidegate.spark.read.Filters.Bounds.ALL; }",
            "io.tidegate.spark.types uses io.tidegate.spark.read",
        ),
        (
            "util/Helper.java",
            "package io.tidegate.spark.util; final class Helper {}",
            "io.tidegate.spark.util is in no layer",
        ),
    ],
)
def test_a_forbidden_arrow_breaks_the_check(
    copy_of_the_sources: Path, source: str, line: str, broken: str
) -> None:
    path = copy_of_the_sources / "io" / "tidegate" / "spark" / source
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        text = path.read_text()
        if line.startswith("import"):
            text = text.replace("\nimport ", f"\n{line}\nimport ", 1)
        else:
            text += "\n" + line + "\n"
        path.write_text(text)
    else:
        path.write_text(line + "\n")
    found = violations(copy_of_the_sources)
    assert any(broken in v for v in found), found
