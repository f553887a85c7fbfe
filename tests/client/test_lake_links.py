"""The SDK's range reads of a plan's file links (gateway/client/_lake_files.py): a link
whose answer is cut short is read again once on a new connection, and a second cut is an
OSError naming the link (what the client scan turns into ``Unavailable``), never
http.client's own exception (a fault run's scan once died of ``IncompleteRead``)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from gateway.client._lake_files import HttpPool

BODY = bytes(range(100))


class _Cutting(http.server.BaseHTTPRequestHandler):
    #: How many answers still to cut short (shared by the server's handlers).
    cuts = [0]

    def do_GET(self) -> None:
        self.send_response(206)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        if self.cuts[0] > 0:
            self.cuts[0] -= 1
            self.wfile.write(BODY[:10])
            self.close_connection = True
            return
        self.wfile.write(BODY)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[int]]]:
    cuts = [0]
    handler = type("Handler", (_Cutting,), {"cuts": cuts})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/f.parquet", cuts
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_an_answer_cut_short_once_is_read_again(server: tuple[str, list[int]]) -> None:
    url, cuts = server
    cuts[0] = 1
    pool = HttpPool()
    try:
        assert pool.range_get(url, 0, 100) == BODY
    finally:
        pool.close()
    assert cuts[0] == 0


def test_an_answer_cut_short_twice_is_an_os_error_naming_the_link(
    server: tuple[str, list[int]],
) -> None:
    url, cuts = server
    cuts[0] = 2
    pool = HttpPool()
    try:
        with pytest.raises(OSError, match=r"the link 127\.0\.0\.1:\d+ broke off its answer"):
            pool.range_get(url, 0, 100)
    finally:
        pool.close()
