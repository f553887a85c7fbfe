"""How the gRPC edge cuts large results into messages; what errors show of the server."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import Settings
from gateway.server.app import private_folders
from gateway.server.calls import pieces as cut
from gateway.wire.errors import TableNotFound, Unavailable, hide_paths


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
