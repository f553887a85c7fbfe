"""The sync producer's life against the in-process fake gateway (pure client logic): closing
it from another thread while a send waits for room, sends after close, and one-dict
sends' futures looked at in every way before and after their batch's answer."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from gateway.client import RecordMetadata
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from tests.client.test_retry_after import FakeGateway
from tests.services import connect


@pytest.fixture
def gw() -> Iterator[tuple[FakeGateway, str]]:
    servicer = FakeGateway("per_request", set())
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_TidegateServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def test_closing_from_another_thread_refuses_a_send_waiting_for_room(
    gw: tuple[FakeGateway, str],
) -> None:
    """A send blocked on a full buffer is told the producer closed (it used to go into the
    buffer of a stopped producer, its future never resolved); what was buffered before
    is flushed and acknowledged."""
    fake, target = gw
    with connect(target) as c:
        p = c.producer("ns.t", buffer_records=1, linger=60, max_block=30)
        first = p.send({"n": 1})
        outcome: list[BaseException | object] = []

        def blocked() -> None:
            try:
                outcome.append(p.send({"n": 2}))
            except BaseException as exc:
                outcome.append(exc)

        sender = threading.Thread(target=blocked)
        sender.start()
        sender.join(0.3)
        assert sender.is_alive()  # waiting for room: the first record waits out its linger
        closer = threading.Thread(target=p.close)
        closer.start()
        closer.join(30)
        sender.join(30)
        assert not closer.is_alive() and not sender.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError)
        assert str(outcome[0]) == "the producer is closed"
        assert first.result(0) == RecordMetadata(0, 0)
        assert fake.values == [1]


def test_a_send_after_close_raises_and_close_again_does_nothing(
    gw: tuple[FakeGateway, str],
) -> None:
    fake, target = gw
    with connect(target) as c:
        with c.producer("ns.t", linger=60) as p:
            sent = [p.send({"n": i}) for i in range(3)]
        assert [f.result(0).offset for f in sent] == [0, 1, 2]
        with pytest.raises(RuntimeError, match=r"^the producer is closed$"):
            p.send({"n": 3})
        p.close()
        assert fake.values == [0, 1, 2]


def test_one_dict_futures_looked_at_before_and_after_the_answer(
    gw: tuple[FakeGateway, str],
) -> None:
    """Of one batch of one-dict sends, a callback added before the answer runs once with
    the row's place, a cancelled future stays cancelled while its row is stored, and the
    futures nobody looked at read their place once asked."""
    fake, target = gw
    with connect(target) as c, c.producer("ns.t", linger=60, batch_records=1000) as p:
        sent = [p.send({"n": i}) for i in range(50)]
        calls: list[RecordMetadata] = []
        sent[10].add_done_callback(lambda f: calls.append(f.result(0)))
        assert sent[20].cancel()
        assert not sent[30].done()
        p.flush()
        assert calls == [RecordMetadata(0, 10)]
        assert sent[20].cancelled()
        assert [f.result(0).offset for i, f in enumerate(sent) if i != 20] == [
            i for i in range(50) if i != 20
        ]
        assert fake.values == list(range(50))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_is_refused_the_parents_producer(gw: tuple[FakeGateway, str]) -> None:
    """No thread survives a fork: in the child the parent's producer has no sender, so a
    send or flush there is refused with a sentence (they would buffer forever, or hang),
    and the parent's producer goes on."""
    fake, target = gw
    with connect(target) as c, c.producer("ns.t", linger=60) as p:
        first = p.send({"n": 1})
        pid = os.fork()
        if pid == 0:  # the child: its exit code says what it saw
            code = 1
            try:
                for call in (lambda: p.send({"n": 2}), p.flush):
                    try:
                        call()
                    except RuntimeError as err:
                        code = code * 2 if "made before os.fork()" in str(err) else 99
                p.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 4
        second = p.send({"n": 3})
    assert (first.result(0).offset, second.result(0).offset) == (0, 1)
    assert fake.values == [1, 3]
