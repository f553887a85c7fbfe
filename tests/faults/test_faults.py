"""A handful of seeds of the fault suite on every change, both hot tiers (see
tests/faults/runner.py; ``make faults SEEDS=200`` is the long run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.runner import run_seed, tier_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Seeds CI runs; ``TIDEGATE_FAULT_SEEDS=5,6,7`` runs others under pytest.
SEEDS = [int(s) for s in os.environ.get("TIDEGATE_FAULT_SEEDS", "1,2,3,4").split(",")]


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}-{tier_of(s)}" for s in SEEDS])
def test_seed_keeps_every_acknowledged_record_exactly_once(seed: int, tmp_path: Path) -> None:
    result = run_seed(seed, tmp_path, duration=10.0)
    assert result.ok, result.text
    # The run did what it is for: faults happened, records went through every path.
    assert sum(result.faults.values()) >= 2, result.faults
    assert result.verdict.acknowledged > 100
    assert result.verdict.per_path["stream"] == result.verdict.per_path["scan"]
