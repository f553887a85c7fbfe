"""How the gRPC edge cuts large results into messages."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from gateway.server.calls import pieces as cut


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
