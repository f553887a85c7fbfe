"""A handful of seeds of the fault suite on every change, both hot tiers (see
tests/faults/runner.py; ``make faults SEEDS=200`` is the long run)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.faults.runner import run_seed, tier_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Seeds CI runs; ``TIDEGATE_FAULT_SEEDS=5,6,7`` runs others under pytest.
SEEDS = [int(s) for s in os.environ.get("TIDEGATE_FAULT_SEEDS", "1,2,3,4").split(",")]


def _param(seed: int) -> Any:
    # The last seed also reads back through the Spark connector, with the test session's
    # SparkSession (make test starts it once for every Spark test anyway).
    # Starting a SparkSession takes a minute or more on a loaded 2-core machine.
    # It shares the run's one SparkSession with the other Spark tests: on their xdist worker.
    spark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(600)]
    marks = spark if seed == SEEDS[-1] else []
    return pytest.param(seed, id=f"seed{seed}-{tier_of(seed)}", marks=marks)


@pytest.mark.parametrize("seed", [_param(s) for s in SEEDS])
def test_seed_keeps_every_acknowledged_record_exactly_once(
    seed: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    spark = request.getfixturevalue("spark") if seed == SEEDS[-1] else None
    result = run_seed(seed, tmp_path, duration=10.0, spark=spark)
    assert result.ok, result.text
    # The run did what it is for: faults happened, records went through every path.
    assert sum(result.faults.values()) >= 2, result.faults
    assert result.verdict.acknowledged > 100
    paths = result.verdict.per_path
    assert paths["stream"] == paths["scan"] == paths.get("spark", paths["stream"])
    assert paths["duckdb"] == paths["pyiceberg"] > 0
    if spark is not None:
        assert paths["spark"] > 0
