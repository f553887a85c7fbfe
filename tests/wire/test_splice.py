"""Stored record batch messages with the system columns spliced in read as the batches
``piece_rows`` builds by decoding, under every codec payloads are stored with, whole or cut
at the edges, and pass Arrow's full validation."""

from __future__ import annotations

import pyarrow as pa
import pytest

import gateway.wire.splice as splice
from gateway.wire.codec import Compression, encode_batch
from gateway.wire.schema import system_schema
from gateway.wire.stored import HotPiece, piece_rows

ROWS = 999
BATCH = pa.record_batch(
    {
        "a": pa.array([1, None, 3] * 333, pa.int64()),
        "s": pa.array(["x", None, "yyy"] * 333, pa.string()),
        "f": pa.array([True, False, None] * 333, pa.bool_()),
        "l": pa.array([[1, 2], None, []] * 333, pa.list_(pa.int32())),
        "t": pa.array([{"x": 1.5}, None, {"x": None}] * 333, pa.struct([("x", pa.float64())])),
    }
)


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
@pytest.mark.parametrize(("skip", "count"), [(0, ROWS), (5, 500), (0, 1), (998, 1), (100, 800)])
def test_spliced_messages_read_as_the_decoded_rows(
    compression: Compression, skip: int, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rewritten: list[bool] = []
    original = splice._splice

    def watched(*args: object) -> bytes | None:
        out = original(*args)  # type: ignore[arg-type]
        rewritten.append(out is not None)
        return out

    monkeypatch.setattr(splice, "_splice", watched)
    payload = encode_batch(BATCH, compression, chunk_bytes=4_000)  # about 6 batches
    piece = HotPiece(payload, 1_000, 1_700_000_000_000_000, skip, count)
    messages = splice.splice_piece(piece, BATCH.schema, 3)
    assert messages is not None
    assert sum(m.rows for m in messages) == count
    assert messages[0].first_offset == 1_000 + skip
    assert messages[-1].next_offset == 1_000 + skip + count
    got = pa.ipc.open_stream(splice.stream_of(system_schema(BATCH.schema), messages)).read_all()
    got.validate(full=True)
    want = pa.Table.from_batches(list(piece_rows(piece, BATCH.schema, 3)))
    assert got.equals(want)
    assert all(rewritten)  # whole messages were rewritten, not decoded
    if count == ROWS:
        assert len(rewritten) == len(messages) > 1
    reader = splice.read_messages(system_schema(BATCH.schema), messages)
    assert reader.read_all().equals(want)


def test_a_payload_under_another_schema_is_left_to_the_decoder() -> None:
    payload = encode_batch(BATCH)
    piece = HotPiece(payload, 0, 0, 0, ROWS)
    assert splice.splice_piece(piece, BATCH.schema.remove(0), 0) is None
    dictionary = pa.record_batch({"d": pa.array(["a", "b"]).dictionary_encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, dictionary.schema) as w:
        w.write_batch(dictionary)
    piece = HotPiece(sink.getvalue().to_pybytes(), 0, 0, 0, 2)
    assert splice.splice_piece(piece, dictionary.schema, 0) is None


def test_a_batch_too_large_with_its_system_columns_is_left_to_the_decoder() -> None:
    """Many tiny rows: the system columns (20 bytes a row) would make one message larger
    than an edge sends at once, which the decoding read cuts into pieces."""
    tiny = pa.record_batch({"b": pa.array([1] * 120_000, pa.int8())})
    payload = encode_batch(tiny)
    assert len(list(pa.ipc.open_stream(payload))) == 1
    assert splice.splice_piece(HotPiece(payload, 0, 0, 0, 120_000), tiny.schema, 0) is None
    small = splice.splice_piece(HotPiece(payload, 0, 0, 0, 1_000), tiny.schema, 0)
    assert small is not None and small[0].nbytes <= splice.MAX_MESSAGE_BYTES
