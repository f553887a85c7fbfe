"""The checker itself: it passes a correct history and catches each kind of violation,
and deliberately broken builds (acknowledging before the hot tier has the batch; applying
a key table's retried batch twice: test fixtures in tests/faults/broken.py, never the
product) fail a seed. The key tables' checker has its own cases in test_keychecker.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.faults.checker import TableState, check, excerpt, report
from tests.faults.history import History
from tests.faults.runner import run_seed

T = "ns.t"


def _history(*events: dict[str, Any]) -> History:
    return History.of_events({"t": 0.0, "client": "c", "table": T, **e} for e in events)


def _ack(rids: list[str], at: list[list[int]]) -> dict[str, Any]:
    return {"type": "append", "key": "p/0/0", "rids": rids, "outcome": "ok", "at": at}


def _state(stream: list[tuple[int, int, str]], **paths: Any) -> dict[str, TableState]:
    state = TableState(2, {"stream": stream, "scan": list(stream)})
    for name, (recs, marks) in paths.items():
        state.paths[name] = recs
        state.prefix[name] = marks
    return {T: state}


GOOD = [(0, 0, "a"), (0, 1, "b"), (1, 0, "c")]


def _kinds(history: History, final: dict[str, TableState]) -> list[str]:
    return sorted({v.kind for v in check(history, final).violations})


def test_a_correct_history_passes() -> None:
    h = _history(
        _ack(["a", "b"], [[0, 0], [0, 1]]),
        {"type": "append", "key": "q/1/0", "rids": ["c"], "outcome": "unknown"},
        {"type": "append", "key": "q/1/0", "rids": ["d"], "outcome": "unknown"},
        {"type": "read", "partition": 0, "from": 1, "records": [[1, "b"]]},
        {"type": "scan", "records": [[0, 0, "a"], [1, 0, "c"]]},
        {"type": "fetch_offsets", "group": "g", "offsets": {"0": 1}},
        {"type": "fetch_offsets", "group": "g", "offsets": {"0": 2}},
    )
    verdict = check(h, _state(GOOD, duckdb=([(0, 0, "a"), (1, 0, "c")], {0: 1, 1: 1})))
    assert verdict.violations == []
    assert (verdict.records_checked, verdict.acknowledged, verdict.unknown) == (3, 2, 2)


@pytest.mark.parametrize(
    ("history", "final", "kind"),
    [
        # an acknowledged record that is not there
        (_history(_ack(["z"], [[1, 1]])), _state(GOOD), "lost"),
        # acknowledged at one offset, stored at another
        (_history(_ack(["c"], [[1, 3]])), _state(GOOD), "moved"),
        # an unknown append stored twice
        (
            _history({"type": "append", "key": "k", "rids": ["a"], "outcome": "unknown"}),
            _state([(0, 0, "a"), (0, 1, "a")]),
            "duplicated",
        ),
        # a definite refusal that was stored all the same
        (
            _history({"type": "append", "key": "k", "rids": ["a"], "outcome": "refused"}),
            _state([(0, 0, "a")]),
            "refused_stored",
        ),
        # one request stored in part
        (
            _history(
                {
                    "type": "append",
                    "key": "k",
                    "rids": ["a", "q"],
                    "outcome": "unknown",
                    "atomic": True,
                }
            ),
            _state([(0, 0, "a")]),
            "torn",
        ),
        # stored, never sent
        (_history(), _state([(0, 0, "x")]), "phantom"),
        # a gap in a partition's offsets
        (_history(), _state([(0, 0, "a"), (0, 2, "b")]), "not_dense"),
        # a read returned a record that is gone at the end
        (
            _history({"type": "read", "partition": 1, "from": 1, "records": [[1, "q"]]}),
            _state(GOOD),
            "vanished",
        ),
        # a read whose offsets jump
        (
            _history({"type": "read", "partition": 0, "from": 0, "records": [[0, "a"], [2, "x"]]}),
            _state(GOOD),
            "read_gap",
        ),
        # a scan that is not a dense prefix of a partition
        (_history({"type": "scan", "records": [[0, 1, "b"]]}), _state(GOOD), "scan_gap"),
        # the Iceberg table misses a record below its watermark
        (_history(), _state(GOOD, pyiceberg=([(0, 0, "a")], {0: 2})), "not_dense"),
        # the Iceberg table holds another record than the stream at an offset
        (_history(), _state(GOOD, duckdb=([(0, 0, "b")], {0: 1})), "disagree"),
        # a consumer group's committed offset went back
        (
            _history(
                {"type": "fetch_offsets", "group": "g", "offsets": {"0": 5}},
                {"type": "fetch_offsets", "group": "g", "offsets": {"0": 3}},
            ),
            _state(GOOD),
            "group_backwards",
        ),
    ],
)
def test_each_violation_is_caught(history: History, final: Any, kind: str) -> None:
    assert kind in _kinds(history, final)


def test_recorded_lost_ranges_account_for_exactly_their_records() -> None:
    """Issue 33.11: after Redis lost its data, the records acknowledged at offsets the
    gateway recorded as lost (``tidegate.lost``) are lost by design, and only those."""
    h = _history(
        _ack(["a", "b"], [[0, 0], [0, 1]]),
        _ack(["gone1", "gone2"], [[0, 2], [0, 3]]),
        {"type": "read", "partition": 0, "from": 1, "records": [[1, "b"], [2, "gone1"]]},
        {"type": "scan", "records": [[0, 0, "a"], [0, 1, "b"], [0, 2, "gone1"]]},
        _ack(["d"], [[0, 4]]),
        {"type": "read", "partition": 0, "from": 1, "records": [[1, "b"], [4, "d"]]},
    )
    stream = [(0, 0, "a"), (0, 1, "b"), (0, 4, "d")]
    final = _state(stream)
    final[T].lost = {0: [(2, 4)]}
    verdict = check(h, final, allow_lost=True)
    assert verdict.violations == []
    assert (verdict.lost_recorded, verdict.lost_offsets) == (2, 2)
    # The same ranges in a run that lost no Redis data: a violation.
    assert "unexpected_lost_range" in {v.kind for v in check(h, final).violations}
    # A record missing outside the recorded range is lost, whatever the run did.
    final[T].lost = {0: [(3, 4)]}
    kinds = {v.kind for v in check(h, final, allow_lost=True).violations}
    assert "lost" in kinds


def test_a_failure_prints_the_seed_and_a_small_excerpt() -> None:
    events = [_ack(["a", "b"], [[0, 0], [0, 1]]), _ack(["c"], [[1, 0]])]
    events += [{"type": "fault", "kind": "gateway_kill", "phase": "start"}]
    events += [_ack([f"r{i}"], [[1, i + 1]]) for i in range(50)]
    events += [_ack(["lost-one"], [[0, 2]]), {"type": "fault", "kind": "net_cut", "phase": "end"}]
    h = _history(*events)
    final = _state(GOOD + [(1, i + 1, f"r{i}") for i in range(50)])
    verdict = check(h, final)
    assert [v.kind for v in verdict.violations] == ["lost"]
    shown = excerpt(h, verdict.violations[0])
    # The append that was acknowledged and the faults around it; not the 50 others.
    assert [e["type"] for e in shown] == ["fault", "append"]
    assert shown[1]["rids"] == ["lost-one"]
    text = report(17, "disk", verdict, h, "make faults SEED=17")
    assert "seed 17 (disk)" in text and "make faults SEED=17" in text and "lost-one" in text


@pytest.mark.integration
@pytest.mark.slow
def test_a_build_that_acknowledges_before_storing_is_caught(tmp_path: Path) -> None:
    result = run_seed(
        5,
        tmp_path,
        tier="disk",
        duration=6.0,
        mix=[("grpc", 2), ("producer", 1), ("follower", 1)],
        kinds=["gateway_kill"],
        hot_env={"TIDEGATE_HOT__TYPE": "tests.faults.broken:AckFirstLog"},
        faults_after_acks=10,
    )
    assert result.faults["gateway_kill"] >= 1
    assert result.verdict.lost > 0, result.summary()
    assert "lost" in result.text and "make faults SEED=5" in result.text


@pytest.mark.integration
@pytest.mark.slow
def test_a_build_that_applies_a_retried_key_batch_twice_is_caught(tmp_path: Path) -> None:
    """Every key writer sends its first acknowledged batch again under the same sequence
    (an answer lost); a hot tier that does not de-duplicate a key table's sequences
    resolves it again and appends ``-U``/``+U`` of its own rows: ``duplicated``."""
    result = run_seed(
        7,
        tmp_path,
        tier="disk",
        duration=5.0,
        mix=[("keys", 2)],
        kinds=["gateway_kill"],
        hot_env={"TIDEGATE_HOT__TYPE": "tests.faults.broken:ResolveTwiceLog"},
    )
    assert result.keys.resent >= 2, result.summary()
    kinds = {v.kind for v in result.keys.violations}
    assert "duplicated" in kinds, result.summary()
    assert "applied at" in result.text and "make faults SEED=7" in result.text
