"""A TCP proxy that can cut, delay or black-hole the connections through it.

It sits between a client and a gateway, or between a gateway and redis-server: the real
processes on either side see an ordinary socket that misbehaves the way networks do.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

from tests.services import free_port


class ChaosProxy:
    """Listens on ``port`` and forwards every connection to ``127.0.0.1:target_port``.

    Modes: ``pass`` (forward), ``delay`` (each chunk waits ``delay_s`` before it is
    forwarded), ``blackhole`` (bytes are read and dropped, nothing is answered, new
    connections are accepted and left hanging). :meth:`cut` resets every open connection.
    """

    def __init__(self, target_port: int, port: int | None = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self.mode = "pass"
        self.delay_s = 0.0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._stopped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", self.port), backlog=128)
        self._thread = threading.Thread(target=self._accept, name="chaos-proxy", daemon=True)

    def start(self) -> ChaosProxy:
        self._thread.start()
        return self

    def set(self, mode: str, delay_s: float = 0.0) -> None:
        assert mode in ("pass", "delay", "blackhole"), mode
        self.mode, self.delay_s = mode, delay_s

    def cut(self) -> int:
        """Reset every connection open now (RST, as a broken network does): how many."""
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for s in conns:
            with contextlib.suppress(OSError):
                s.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                s.close()
        return len(conns)

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._conns.update(socks)

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
        except OSError:
            with contextlib.suppress(OSError):
                client.close()
            return
        upstream.settimeout(None)
        self._track(upstream)
        peers = {client: upstream, upstream: client}
        try:
            while not self._stopped.is_set():
                try:
                    ready, _, _ = select.select(list(peers), [], [], 0.2)
                except (OSError, ValueError):
                    return
                for s in ready:
                    try:
                        data = s.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    if self.mode == "blackhole":
                        continue  # swallowed: the sender waits for an answer that never comes
                    if self.mode == "delay" and self.delay_s > 0:
                        time.sleep(self.delay_s)
                    try:
                        peers[s].sendall(data)
                    except OSError:
                        return
        finally:
            with self._lock:
                self._conns.discard(client)
                self._conns.discard(upstream)
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.close()
