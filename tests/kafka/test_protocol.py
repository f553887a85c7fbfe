"""The Kafka edge's codecs without a gateway: any bytes are a request of a served API
and version or one :class:`Unanswerable` (never another error), and answers built for
every served version read back with kio."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from gateway.server.kafka.protocol import (
    API_VERSIONS,
    Unanswerable,
    api_versions_fallback,
    build,
    encode_response,
    parse_request,
    supported_apis,
)
from tests.kafka.raw import encode_request
from tests.kafka.test_edges import fetch_request, metadata_request, produce_request


def _frame(request: object) -> bytes:
    return encode_request(request, 9, "t")


VALID = [
    _frame(produce_request("a.b", 0, [b'{"x": 1}'] * 3)),
    _frame(fetch_request("a.b", 0, 0)),
    _frame(metadata_request(["a.b"])),
]


def test_a_served_request_reads_back() -> None:
    request = parse_request(VALID[1])
    assert (request.api_key, request.api_version, request.correlation_id) == (1, 12, 9)
    assert request.body.topics[0].topic == "a.b"


@given(
    st.sampled_from(VALID),
    st.lists(st.tuples(st.integers(8, 10_000), st.integers(0, 255)), max_size=4),
    st.integers(8, 10_000),
)
def test_any_mutation_is_a_request_or_unanswerable(
    frame: bytes, changes: list[tuple[int, int]], cut: int
) -> None:
    mutated = bytearray(frame[:cut])
    for at, value in changes:
        if at < len(mutated):
            mutated[at] = value
    with contextlib.suppress(Unanswerable):
        parse_request(bytes(mutated))


@given(st.binary(max_size=200))
def test_any_bytes_are_a_request_or_unanswerable(data: bytes) -> None:
    with contextlib.suppress(Unanswerable):
        parse_request(data)


def test_every_served_version_of_every_answer_is_built_and_read_back() -> None:
    for api_key, (low, high) in API_VERSIONS.items():
        for version in range(low, high + 1):
            cls = load_response_schema(api_key, version)
            frame = encode_response(5, build(cls, {}))
            (size,) = struct.unpack_from(">i", frame)
            assert size == len(frame) - 4
            header, size = entity_reader(cls.__header_schema__)(frame, 4)
            assert header.correlation_id == 5
            _, rest = entity_reader(cls)(frame, 4 + size)
            assert 4 + size + rest == len(frame)


def test_only_an_unknown_api_versions_version_gets_the_fallback() -> None:
    assert api_versions_fallback(struct.pack(">hhi", 3, 99, 1)) is None
    assert api_versions_fallback(struct.pack(">hhi", 18, 3, 1)) is None
    answer = api_versions_fallback(struct.pack(">hhih", 18, 4, 1, -1))
    assert answer is not None
    v0 = load_response_schema(18, 0)
    body, _ = entity_reader(v0)(answer, 8)
    assert body.error_code == 35
    assert [(k.api_key, k.min_version, k.max_version) for k in body.api_keys] == [
        (a["api_key"], a["min_version"], a["max_version"]) for a in supported_apis()
    ]


def test_a_null_where_kafka_allows_none_is_unanswerable() -> None:
    """kio reads a null array where Kafka's definition has none (FindCoordinator v4's
    keys, found by the live fuzz): Kafka cannot read such a request and closes the
    connection, and so does the listener, instead of failing inside a handler."""
    frame = bytearray(encode_request(build(load_request_schema(10, 4), {"key_type": 0}), 1))
    assert parse_request(bytes(frame)).body.coordinator_keys == ()
    frame[-2] = 0  # the keys' compact array length: 0 is null
    with pytest.raises(Unanswerable, match="coordinator_keys null"):
        parse_request(bytes(frame))
