"""How the gRPC edge cuts large results into messages; what errors show of the server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import Settings
from gateway.server.app import private_folders
from gateway.server.calls import Pacer
from gateway.server.calls import pieces as cut
from gateway.wire.errors import (
    InvalidRequest,
    TableNotFound,
    Throttled,
    TidegateError,
    Unavailable,
    hide_paths,
)


@given(rows=st.integers(0, 5_000), width=st.integers(1, 300), target=st.integers(1, 200_000))
def test_pieces_cover_the_batch_in_order_and_stay_near_the_target(
    rows: int, width: int, target: int
) -> None:
    """A scan of one big data file comes as one batch; its pieces keep every row once, in
    order, and each piece (of more than one row) stays within the target size, so no
    message can outgrow gRPC's limit whatever the file size."""
    batch = pa.record_batch(
        {"n": pa.array(range(rows), pa.int64()), "s": pa.array(["x" * width] * rows)}
    )
    pieces = list(cut(batch, target))
    assert pa.Table.from_batches(pieces, batch.schema).column("n").to_pylist() == list(range(rows))
    for p in pieces:
        assert p.num_rows == 1 or p.nbytes <= max(target, batch.nbytes // max(1, rows)) * 1.01


def test_errors_of_a_gateway_name_no_folder_of_the_server(tmp_path: Path) -> None:
    """Issue 33.10: once a gateway hides its folders, an error quoting a file (a hot tier
    that cannot write a segment, a catalog that cannot open a manifest) names the file by
    the folder's role, in the message and the details, whatever class raises it."""
    settings = Settings.explicit(
        data_dir=tmp_path / "data", cold={"warehouse": str(tmp_path / "wh")}
    )
    folders = private_folders(settings)
    assert folders[str((tmp_path / "data").resolve())] == "<data_dir>"
    assert folders[str((tmp_path / "data" / "hot").resolve())] == "<hot>"
    assert folders[str((tmp_path / "wh").resolve())] == "<warehouse>"
    hot = (tmp_path / "data" / "hot").resolve()
    try:
        hide_paths(folders)
        err = Unavailable(f"cannot write to {hot}/t1/x/0/0.log: disk full", file=f"{hot}/t1")
        assert err.message == "cannot write to <hot>/t1/x/0/0.log: disk full"
        assert err.details["file"] == "<hot>/t1" and str(tmp_path) not in str(err.to_dict())
        gone = TableNotFound(f"manifest {tmp_path.resolve()}/wh/t/m.avro not found")
        assert gone.message == "manifest <warehouse>/t/m.avro not found"
    finally:
        hide_paths({})
    assert str(hot) in Unavailable(f"at {hot}").message  # only a serving gateway hides them


# The pacer: a throttled call's answer waits for the wait it names -----------------------
def ignored(message: str, retry_after_ms: int, **details: str) -> Throttled:
    """A refusal of a caller that came back before an earlier refusal's wait was over."""
    err = Throttled(message, retry_after_ms=retry_after_ms, **details)
    err.hint_ignored = True
    return err


def test_a_throttled_answer_is_held_for_its_wait_and_says_what_is_left() -> None:
    async def run() -> tuple[TidegateError, ...]:
        pacer = Pacer(max_hold_s=0.05, max_held=10)
        throttled = ignored(
            "over the tenant's append bytes quota of 10/s; retry in 300 ms",
            300,
            quota="append_bytes_per_s",
        )
        short = ignored("over the requests quota; retry in 20 ms", 20)
        first = Throttled("over the requests quota; retry in 20 ms", retry_after_ms=20)
        other = InvalidRequest("not a quota")
        return tuple([await pacer.pace(e) for e in (throttled, short, first, other)])

    held, whole, first, other = asyncio.run(run())
    # Held 50 ms (the bound) of its 300: 250 left, in the message and in the details.
    assert isinstance(held, Throttled)
    assert (held.retry_after_ms, held.details["quota"]) == (250, "append_bytes_per_s")
    assert held.message.endswith("retry in 250 ms")
    assert held.to_dict()["retry_after_ms"] == 250
    # Held its whole 20 ms: 1 ms left (still a refusal to wait on).
    assert isinstance(whole, Throttled) and whole.retry_after_ms == 1
    assert whole.message.endswith("retry in 1 ms")
    # A first refusal (its caller honours hints as far as anyone knows) and any other
    # error go at once, as they are.
    assert isinstance(first, Throttled) and first.retry_after_ms == 20
    assert isinstance(other, InvalidRequest)


def test_the_pacer_holds_at_most_its_bound_and_answers_the_rest_at_once() -> None:
    async def run() -> list[int | None]:
        pacer = Pacer(max_hold_s=0.2, max_held=2)
        err = ignored("over; retry in 200 ms", 200)
        answers = await asyncio.gather(*(pacer.pace(err) for _ in range(5)))
        assert pacer.held == 0
        return sorted(a.retry_after_ms for a in answers if isinstance(a, Throttled))

    # Two held (1 ms left), three answered at once with the whole wait.
    assert asyncio.run(run()) == [1, 1, 200, 200, 200]


def test_a_pacer_of_no_hold_answers_at_once() -> None:
    err = ignored("over; retry in 200 ms", 200)
    assert asyncio.run(Pacer(max_hold_s=0, max_held=10).pace(err)) is err
