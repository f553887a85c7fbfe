"""The key tables' checker (tests/faults/keychecker.py): a correct history passes, an
unknown batch may be applied or not, and each kind of violation is caught."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.faults.checker import excerpt
from tests.faults.history import History
from tests.faults.keychecker import check_keys
from tests.faults.keyworkload import KeyState

T = "ns.kv"


def _batch(wid: str, rows: list[list[Any]], outcome: str = "ok", at: Any = None) -> dict[str, Any]:
    e = {"type": "keyed", "wid": wid, "partition": 0, "rows": rows, "outcome": outcome}
    return {**e, "key": f"p/0/{wid}", **({"at": [0, *at]} if at else {})}


def _history(*events: dict[str, Any]) -> History:
    return History.of_events({"t": 0.0, "client": "c", "table": T, **e} for e in events)


def _c(o: int, kind: int, k: int, v: str, n: int) -> dict[str, Any]:
    return {"k": k, "v": v, "n": n, "_change": kind, "_partition": 0, "_offset": o}


# a: +I 1, +I 2; b (unknown, applied): 1 -> b/0, delete 2, delete 3 (not live);
# c (unknown, not applied); d: +I 3.
EVENTS = [
    _batch("a", [[1, "a/0", 0], [2, "a/1", 1]], at=(0, 2)),
    _batch("b", [[1, "b/0", 0], [2, None, None], [3, None, None]], "unknown"),
    _batch("c", [[4, "c/0", 0]], "unknown"),
    _batch("d", [[3, "d/0", 0]], at=(5, 1)),
    _batch("d", [[3, "d/0", 0]], at=(5, 1)) | {"resend": True},
]
CHANGES = [
    _c(0, 0, 1, "a/0", 0),
    _c(1, 0, 2, "a/1", 1),
    _c(2, 1, 1, "a/0", 0),
    _c(3, 2, 1, "b/0", 0),
    _c(4, 3, 2, "a/1", 1),
    _c(5, 0, 3, "d/0", 0),
]
LIVE = [
    {"k": 1, "v": "b/0", "n": 0, "_partition": 0, "_offset": 3},
    {"k": 3, "v": "d/0", "n": 0, "_partition": 0, "_offset": 5},
]


def _state(**changes: Any) -> KeyState:
    # The state table has applied the changes below 4: key 2 still live there.
    state_rows = [LIVE[0], {"k": 2, "v": "a/1", "n": 1, "_partition": 0, "_offset": 1}]
    return KeyState(1, list(CHANGES), list(LIVE), list(LIVE), state_rows, {0: 4}, **changes)


def test_a_correct_history_passes() -> None:
    verdict = check_keys(_history(*EVENTS), {T: _state()})
    assert verdict.violations == []
    assert (verdict.changes, verdict.acknowledged, verdict.unknown, verdict.resent) == (6, 2, 2, 1)
    assert dict(verdict.per_path) == {"scan": 2, "get": 2, "state": 2}


def _kinds(events: list[dict[str, Any]], state: KeyState) -> set[str]:
    return {v.kind for v in check_keys(_history(*events), {T: state}).violations}


def _with_changes(changes: list[dict[str, Any]]) -> KeyState:
    s = _state()
    s.changes = changes
    return s


def _edit(rows: list[dict[str, Any]], i: int, **values: Any) -> list[dict[str, Any]]:
    out = copy.deepcopy(rows)
    out[i].update(values)
    return out


@pytest.mark.parametrize(
    ("events", "state", "kind"),
    [
        # b applied a second time (a retried sequence resolved again): -U/+U of itself,
        # and its delete of 3 now deletes d's row
        (
            EVENTS,
            _with_changes(
                [*CHANGES, _c(6, 1, 1, "b/0", 0), _c(7, 2, 1, "b/0", 0), _c(8, 3, 3, "d/0", 0)]
            ),
            "duplicated",
        ),
        # an acknowledged batch answered with two ranges
        ([*EVENTS, _batch("d", [[3, "d/0", 0]], at=(6, 1))], _state(), "duplicated"),
        # acknowledged, not in the changelog
        ([*EVENTS, _batch("e", [[5, "e/0", 0]], at=(6, 1))], _state(), "lost"),
        # acknowledged at another offset than it was applied at
        ([*EVENTS[:3], _batch("d", [[3, "d/0", 0]], at=(7, 1))], _state(), "moved"),
        # acknowledged with another count of changes than it made
        ([*EVENTS[:3], _batch("d", [[3, "d/0", 0]], at=(5, 2))], _state(), "moved"),
        # a refused batch that was applied
        ([*EVENTS[:3], _batch("d", [[3, "d/0", 0]], "refused")], _state(), "refused_stored"),
        # a change of a batch never sent
        (EVENTS, _with_changes([*CHANGES, _c(6, 0, 9, "zz/0", 0)]), "phantom"),
        # a -U that does not carry the live row (a resolution on a stale state)
        (EVENTS, _with_changes(_edit(CHANGES, 2, v="x/0")), "misapplied"),
        # a delete of a live key that made no -D
        (
            EVENTS,
            _with_changes([*CHANGES[:4], {**CHANGES[5], "_offset": 4}]),
            "misapplied",
        ),
        # a gap in the changelog
        (EVENTS, _with_changes([*CHANGES[:5], {**CHANGES[5], "_offset": 6}]), "not_dense"),
        # the scan, get and the state table must equal the replay
        (EVENTS, KeyState(1, CHANGES, LIVE[:1], LIVE, None, {}), "state_differs"),
        (EVENTS, KeyState(1, CHANGES, LIVE, _edit(LIVE, 1, n=7), None, {}), "state_differs"),
        (EVENTS, KeyState(1, CHANGES, LIVE, LIVE, LIVE, {0: 4}), "state_differs"),
        (EVENTS, KeyState(1, CHANGES, LIVE, _edit(LIVE, 0, _offset=2), None, {}), "state_differs"),
        # a lost range in a run that lost no data
        (EVENTS, _state(lost={0: [(6, 8)]}), "unexpected_lost_range"),
    ],
)
def test_each_violation_is_caught(events: list[dict[str, Any]], state: KeyState, kind: str) -> None:
    assert kind in _kinds(events, state)


def test_an_acknowledged_batch_in_a_recorded_lost_range_is_lost_by_design() -> None:
    """After Redis lost its data, a batch acknowledged at offsets the changelog table
    records as lost is counted, not reported; one outside such a range is lost."""
    events = [*EVENTS, _batch("e", [[5, "e/0", 0]], at=(6, 1))]
    state = _state(lost={0: [(6, 7)]})
    verdict = check_keys(_history(*events), {T: state}, allow_lost=True)
    assert verdict.violations == [] and verdict.lost_recorded == 1
    state.lost = {0: [(7, 8)]}
    kinds = {v.kind for v in check_keys(_history(*events), {T: state}, allow_lost=True).violations}
    assert "lost" in kinds


def test_a_change_after_a_lost_range_is_resolved_on_the_state_the_lost_batch_left() -> None:
    """Batch e updated key 1 at offsets later recorded lost (Redis emptied after f came);
    f's delete of key 1 was resolved while e's row was live, so its before-image is e's:
    accepted. f's after-image must still be its own, and a key no lost batch touched
    must still resolve on the replayed state."""
    e = _batch("e", [[1, "e/0", 0]], at=(6, 2))
    f = _batch("f", [[1, None, None], [3, "f/1", 1]], at=(8, 3))
    later = [_c(8, 3, 1, "e/0", 0), _c(9, 1, 3, "d/0", 0), _c(10, 2, 3, "f/1", 1)]
    live = [{"k": 3, "v": "f/1", "n": 1, "_partition": 0, "_offset": 10}]

    def verdict(changes: list[dict[str, Any]]) -> set[str]:
        state = KeyState(1, [*CHANGES, *changes], live, live, None, {}, {0: [(6, 8)]})
        found = check_keys(_history(*EVENTS, e, f), {T: state}, allow_lost=True)
        return {v.kind for v in found.violations}

    assert verdict(later) == set()
    assert "misapplied" in verdict([later[0], later[1], _c(10, 2, 3, "f/9", 9)])
    assert "misapplied" in verdict([later[0], _c(9, 1, 3, "x/0", 0), later[2]])
    state = KeyState(1, [*CHANGES, *later], live, live, None, {}, {})
    kinds = {v.kind for v in check_keys(_history(*EVENTS, e, f), {T: state}).violations}
    assert "misapplied" in kinds


def test_the_excerpt_of_a_key_violation_shows_its_batch() -> None:
    events = [*EVENTS, _batch("e", [[5, "e/0", 0]], at=(6, 1))]
    h = _history(*events)
    verdict = check_keys(h, {T: _state()})
    assert [v.kind for v in verdict.violations] == ["lost"]
    assert [e["wid"] for e in excerpt(h, verdict.violations[0])] == ["e"]


def test_a_batch_lost_with_the_producer_state_may_be_stored_again_once() -> None:
    """A batch acknowledged at offsets since recorded lost (Redis emptied: its producer's
    sequences went too) and re-sent is stored anew, once; a second live range is not."""
    first = _batch("e", [[5, "e/0", 0]], at=(6, 1))
    again = _batch("e", [[5, "e/0", 0]], at=(7, 1)) | {"resend": True}
    live = [*LIVE, {"k": 5, "v": "e/0", "n": 0, "_partition": 0, "_offset": 7}]
    state = KeyState(1, [*CHANGES, _c(7, 0, 5, "e/0", 0)], live, live, None, {}, {0: [(6, 7)]})
    verdict = check_keys(_history(*EVENTS, first, again), {T: state}, allow_lost=True)
    assert verdict.violations == []
    third = _batch("e", [[5, "e/0", 0]], at=(8, 1))
    kinds = {
        v.kind
        for v in check_keys(
            _history(*EVENTS, first, again, third), {T: state}, allow_lost=True
        ).violations
    }
    assert "duplicated" in kinds
