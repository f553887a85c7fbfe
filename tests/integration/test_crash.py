"""kill -9 during appends: nothing acknowledged is lost, nothing is torn or duplicated."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.runner import run_seed
from tests.integration.conftest import gateway_env
from tests.services import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize(
    ("tier", "kinds"), [("disk", ["gateway_kill"]), ("redis", ["gateway_kill", "redis_kill"])]
)
def test_kill_9_during_appends_loses_and_duplicates_nothing(
    tier: str, kinds: list[str], tmp_path: Path
) -> None:
    """SIGKILL of the gateway (and of redis-server) while many writers append: the fault
    suite (tests/faults) with only those faults, so its checker judges the history."""
    result = run_seed(
        7, tmp_path, tier=tier, duration=8.0, mix=[("grpc", 4), ("producer", 2)], kinds=kinds
    )
    assert result.ok, result.text
    assert result.faults["gateway_kill"] >= 1, result.faults
    assert result.verdict.acknowledged > 300


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_idempotent_retry_across_restart(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    env = gateway_env(kind, redis)
    gw = GatewayProcess(tmp_path / "gw", env).start()
    table = f"idem{kind}.t"
    try:
        with gw.client() as c:
            c.create_table(table, {"v": "int64"}, partitions=2)
            first = [
                c.append(
                    table, [{"v": s}, {"v": s}], partition=1, producer_id="prod-a", sequence=s
                )[0]
                for s in range(5)
            ]
            assert [r.base_offset for r in first] == [0, 2, 4, 6, 8]
            again = c.append(
                table, [{"v": 4}, {"v": 4}], partition=1, producer_id="prod-a", sequence=4
            )[0]
            assert (again.base_offset, again.count, again.duplicate) == (8, 2, True)
        gw.kill()
        gw = GatewayProcess(tmp_path / "gw", env, tenant=gw.tenant, api_key=gw.api_key).start()
        with gw.client() as c:
            retried = c.append(
                table, [{"v": 4}, {"v": 4}], partition=1, producer_id="prod-a", sequence=4
            )[0]
            assert (retried.base_offset, retried.count, retried.duplicate) == (8, 2, True)
            nxt = c.append(table, [{"v": 5}], partition=1, producer_id="prod-a", sequence=5)[0]
            assert (nxt.base_offset, nxt.duplicate) == (10, False)
            from gateway.wire.errors import OutOfOrderSequence

            with pytest.raises(OutOfOrderSequence):
                c.append(table, [{"v": 7}], partition=1, producer_id="prod-a", sequence=7)
            values = c.read(table, partition=1, offset=0).column("v").to_pylist()
            assert values == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
    finally:
        gw.stop()
