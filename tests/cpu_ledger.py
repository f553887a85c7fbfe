"""Where the suite's CPU goes, per test: a ledger kept when ``TIDEGATE_TEST_CPU_LOG`` names
a folder (``python -m tests.cpu_ledger FOLDER`` sums it per module).

Each test process appends one JSON line per test: its wall time, the CPU of the test
process itself, of the children it waited for (exec'd gateways, CLI commands, a JVM), and
of the fork server's children (forked gateways and CLI commands) reaped during it, each
charged to the test that was running when it was reaped (a module's gateway: its last test).
Off by default; it asserts nothing and changes no test.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_FOLDER = os.environ.get("TIDEGATE_TEST_CPU_LOG")
_forked: list[float] = []


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def forked_ended(cpu: float) -> None:
    """A fork server's child was reaped having used ``cpu`` seconds (tests/forkserver.py)."""
    if _FOLDER:
        _forked.append(cpu)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not _FOLDER:
        yield
        return
    start = time.monotonic()
    own, children = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    del _forked[:]
    yield
    row: dict[str, Any] = {
        "test": item.nodeid,
        "wall": round(time.monotonic() - start, 3),
        "self": round(_cpu(resource.RUSAGE_SELF) - own, 3),
        "children": round(_cpu(resource.RUSAGE_CHILDREN) - children, 3),
        "forked": round(sum(_forked), 3),
        "forks": len(_forked),
    }
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = Path(_FOLDER)
    folder.mkdir(parents=True, exist_ok=True)  # named, not necessarily made, by the caller
    with open(folder / f"{worker}-{os.getpid()}.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")


def summarise(folder: Path, top: int = 40) -> str:
    """The ledger's totals per module, the most CPU first."""
    modules: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            m = modules[row["test"].split("::", 1)[0]]
            m["tests"] += 1
            for k in ("wall", "self", "children", "forked", "forks"):
                m[k] += row[k]
    total = {k: sum(m[k] for m in modules.values()) for k in ("wall", "self", "children", "forked")}
    lines = [
        "module | tests | wall s | cpu s | self | children | forked (n)",
        f"ALL | {sum(m['tests'] for m in modules.values()):.0f} | {total['wall']:.0f} | "
        f"{total['self'] + total['children'] + total['forked']:.0f} | {total['self']:.0f} | "
        f"{total['children']:.0f} | {total['forked']:.0f}",
    ]
    ranked = sorted(
        modules.items(), key=lambda kv: -(kv[1]["self"] + kv[1]["children"] + kv[1]["forked"])
    )
    for name, m in ranked[:top]:
        cpu = m["self"] + m["children"] + m["forked"]
        lines.append(
            f"{name} | {m['tests']:.0f} | {m['wall']:.0f} | {cpu:.0f} | {m['self']:.0f} | "
            f"{m['children']:.0f} | {m['forked']:.0f} ({m['forks']:.0f})"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarise(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 40))
