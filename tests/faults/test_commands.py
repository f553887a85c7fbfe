"""The commands docs/durability.md gives: each `make` line runs the suite's entry point
with the arguments it says (checked with `make -n`, nothing is run)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.services import REPO_ROOT
from tests.test_repo import _make_dry_run


def _doc_commands() -> list[list[str]]:
    doc = (REPO_ROOT / "docs" / "durability.md").read_text()
    section = doc.split("### Commands", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block
    return [line.split("#")[0].split() for line in block.group(1).splitlines() if line.strip()]


def test_the_documented_make_commands_run_the_suite(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    want = {
        "faults": "-m tests.faults --seeds 4 --first 1",
        "faults SEEDS=200": "-m tests.faults --seeds 200 --first 1",
        "faults SEEDS=50 FIRST=201": "-m tests.faults --seeds 50 --first 201",
        "faults SEED=17": "-m tests.faults --seed 17",
        "faults SEEDS=20 FAULTS_ARGS=--spark": "-m tests.faults --seeds 20 --first 1 --spark",
        "soak": "-m tests.faults.soak --minutes 10 --out benchmarks/results/soak",
    }
    commands = _doc_commands()
    assert [" ".join(c[1:]) for c in commands] == list(want)
    for command in commands:
        assert command[0] == "make"
        lines = _make_dry_run(venv, command[1], *command[2:])
        assert lines[-1] == f"{venv}/bin/python {want[' '.join(command[1:])]}", lines
