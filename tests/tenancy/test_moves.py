"""The status of moves a gateway was asked to run (``gateway.tenancy.moves``)."""

from __future__ import annotations

from gateway.lake.shards import MoveResult
from gateway.meta import Placement
from gateway.tenancy.moves import KEEP, MoveLog
from gateway.wire.errors import InvalidRequest


def placement(partition: int, target: str | None) -> Placement:
    return Placement("acme", "tid", "ns", "ev", partition, 3, ((0, "a", 0, None),), target)


def test_running_pending_then_finished_newest_first() -> None:
    log = MoveLog()
    done = log.begin("acme", "ns.ev", 0, "b")
    log.done(done, MoveResult("acme", "ns.ev", 0, "a", "b", 42, 0.01))
    failed = log.begin("acme", "ns.ev", 1, "c")
    log.fail(failed, InvalidRequest("shard 'c' is reserved for another tenant"))
    running = log.begin("acme", "ns.ev", 2, "b")
    # Intents in the store: partition 2's is this process's running move, partition 3's
    # was left by someone else (a crash): listed once each.
    rows = log.listing([placement(2, "b"), placement(3, "c")])
    assert [(r["state"], r["partition"]) for r in rows] == [
        ("running", 2),
        ("pending", 3),
        ("failed", 1),
        ("done", 0),
    ]
    assert rows[0]["id"] == running.id and rows[1]["id"] == ""
    assert (rows[1]["source"], rows[1]["target"]) == ("a", "c")
    assert rows[2]["error"] == "INVALID_REQUEST: shard 'c' is reserved for another tenant"
    assert (rows[3]["source"], rows[3]["start"]) == ("a", 42)
    assert len({done.id, failed.id, running.id}) == 3


def test_only_the_last_moves_are_kept() -> None:
    log = MoveLog()
    for i in range(KEEP + 5):
        log.done(log.begin("acme", "ns.ev", i, "b"), MoveResult("acme", "ns.ev", i, "a", "b", 0, 0))
    rows = log.listing([])
    assert len(rows) == KEEP
    assert rows[0]["partition"] == KEEP + 4 and rows[-1]["partition"] == 5
