"""A fork server for the gateways the suite starts: one process per test worker imports what
``tidegate serve`` imports, once, and forks a child for each gateway, which then runs the
same ``tidegate serve`` as ``python -m gateway serve`` would, in its own environment.

Why: the suite starts some 500 gateways, and each spent about 1.5 s of CPU importing
FastAPI, gRPC, pyarrow, pyiceberg and SQLAlchemy before it did anything of its own (on two
cores, a quarter of the suite's time). The child is a real process of its own, started from
the same code by the same command-line entry; only the imports are shared, made before any
thread, socket or event loop exists (so the fork copies no lock held by a thread).

The server answers requests on a Unix socket, one JSON line each:

- ``{"start": {"argv": [...], "env": {...}, "cwd": "...", "log": "..."}}`` -> ``{"pid": n}``:
  fork a child that runs ``gateway.cli.main()`` on ``argv`` with ``env`` as its whole
  environment, in ``cwd``, its stdout and stderr appended to ``log`` (its stderr to
  ``"stderr"`` if given, its stdin read from ``"stdin"`` if given; the names of the
  modules it imported after the fork written to ``"imports"`` at its exit, if given;
  with ``"module"``, it runs that module as ``python -m <module>`` would, instead of the
  ``tidegate`` command);
- ``{"reap": n}`` -> ``{"returncode": r}``: wait for child ``n`` (the caller saw it end) and
  answer its status as :class:`subprocess.Popen` does (``-signal`` for a signal).

Children are reaped only when asked, so a child's pid stays its own (a zombie) until the
caller has its status: :class:`ForkedProcess` watches it through a pidfd.

A gateway whose environment changes what an interpreter does at start (``LD_PRELOAD``,
``PYTHON*``) is started with ``subprocess`` as before (:func:`can_fork`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ForkServer", "ForkedProcess", "can_fork", "fork_server"]

#: Variables an interpreter reads when it starts: a child forked from the server would not
#: see them, so a gateway given one of these is exec'd instead.
_EXEC_ONLY = ("LD_PRELOAD", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONMALLOC")


def can_fork(env: Mapping[str, str]) -> bool:
    """Whether a gateway with this environment may be forked from the server: nothing in
    it acts before the interpreter's first line, or differs from the server's own."""
    if any(k in env for k in _EXEC_ONLY):
        return False
    # Read by the server's imports (pyiceberg reads its PYICEBERG_ variables and
    # ~/.pyiceberg.yaml once, at import): they must be the server's.
    read_at_import = {"PYTHONWARNINGS", "PYTHONHASHSEED", "HOME"}
    read_at_import |= {k for k in (*env, *os.environ) if k.startswith("PYICEBERG_")}
    return all(env.get(k) == os.environ.get(k) for k in read_at_import)


def _preload() -> None:
    """What ``tidegate serve`` imports, imported once here: its module and the edges,
    stores and servers it imports only when it starts them (about 330 modules, 70% of
    a forked gateway's start when they were left to each child). Importing starts no
    thread, opens no socket and makes no event loop."""
    import sqlite3  # noqa: F401

    import psycopg  # noqa: F401 - PostgreSQL metadata stores and catalogs
    import pydantic.v1  # noqa: F401 - FastAPI's compatibility check, at the app's start
    import pyiceberg.catalog.sql  # the cold tier's catalog, opened at start
    import pyiceberg.io.pyarrow  # noqa: F401 - its files, at a gateway's first tiering or scan
    import uvicorn  # noqa: F401

    import gateway.cli
    import gateway.cli.jobs
    import gateway.cold.iceberg
    import gateway.cold.iceberg.sqlcatalog
    import gateway.hot.disk
    import gateway.hot.redis
    import gateway.logs
    import gateway.server.app
    import gateway.server.flight
    import gateway.server.grpc.admin
    import gateway.server.grpc.server
    import gateway.server.http.admin
    import gateway.server.http.app
    import gateway.server.http.console
    import gateway.server.http.files
    import gateway.server.http.refusals  # noqa: F401

    # As a gateway does once it started (gateway/server/app.py, _freeze_startup_objects):
    # what the imports made goes out of the collector's sight, so each child's own full
    # collection at start walks only what the child made (it walked all of it: 0.17 s).
    gc.collect()
    gc.freeze()


def _child(request: Mapping[str, Any]) -> None:
    """In the forked child: become the gateway process, run it, and never return."""
    preloaded = set(sys.modules)
    code = 1
    try:
        # Signal dispositions stay the server's, which are an interpreter's: SIGPIPE and
        # SIGXFSZ ignored (a write to a closed socket raises, it does not kill), SIGINT
        # raising KeyboardInterrupt, the rest default.
        stdin = os.open(request.get("stdin") or os.devnull, os.O_RDONLY)
        out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        err = out
        if request.get("stderr"):
            err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for fd, to in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, to)
        for fd in {stdin, out, err}:
            os.close(fd)
        _fresh_stdio(bool(request["env"].get("PYTHONUNBUFFERED")))
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        module = request.get("module")
        sys.argv = [sys.executable, *request["argv"]]
        try:
            if module:
                import runpy

                # As `python -m module` does: argv[0] the module's file, __main__ its name.
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                from gateway.cli import main

                main()  # reads sys.argv, as `python -m gateway` does
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        # What an interpreter does at exit before it tears down: wait for the threads that
        # are not daemons, then run the exit functions.
        import atexit
        import threading as threads

        threads._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        if request.get("imports"):
            # What _preload left to the child (tests/test_forkserver.py checks it).
            fresh = sorted(set(sys.modules) - preloaded)
            Path(request["imports"]).write_text("".join(f"{m}\n" for m in fresh))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _fresh_stdio(unbuffered: bool) -> None:
    """``sys.stdin``/``stdout``/``stderr`` over the child's descriptors, buffered as a new
    interpreter with this environment would buffer them (the server runs unbuffered)."""
    import io

    def text(fd: int, write: bool, errors: str) -> io.TextIOWrapper:
        buffering = 0 if unbuffered and write else -1
        raw = open(fd, "wb" if write else "rb", buffering=buffering, closefd=False)  # noqa: SIM115
        return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, write_through=unbuffered)

    sys.stdin = text(0, False, "strict")
    sys.stdout = text(1, True, "strict")
    sys.stderr = text(2, True, "backslashreplace")
    sys.stderr.reconfigure(line_buffering=True)


def serve(path: str) -> None:
    """The server's loop: one request at a time, from any number of connections."""
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    conns: dict[int, tuple[socket.socket, bytearray]] = {}
    parent = os.getppid()
    while True:
        ready, _, _ = select.select([listener, *[c for c, _ in conns.values()]], [], [], 1.0)
        if os.getppid() != parent:
            return  # the test process is gone: so is its server
        for s in ready:
            if s is listener:
                conn, _ = listener.accept()
                conns[conn.fileno()] = (conn, bytearray())
                continue
            conn, buf = conns[s.fileno()]
            data = conn.recv(1 << 20)
            if not data:
                del conns[s.fileno()]
                conn.close()
                continue
            buf += data
            while b"\n" in buf:
                line, _, rest = bytes(buf).partition(b"\n")
                buf[:] = rest
                answer = _answer(json.loads(line), listener, conns)
                conn.sendall(json.dumps(answer).encode() + b"\n")


def _answer(
    request: Mapping[str, Any],
    listener: socket.socket,
    conns: Mapping[int, tuple[socket.socket, bytearray]],
) -> dict[str, Any]:
    if "start" in request:
        pid = os.fork()
        if pid == 0:
            listener.close()
            for c, _ in conns.values():
                c.close()
            _child(request["start"])
        return {"pid": pid}
    if "reap" in request:
        _, status, usage = os.wait4(int(request["reap"]), 0)
        cpu = usage.ru_utime + usage.ru_stime
        return {"returncode": os.waitstatus_to_exitcode(status), "cpu": cpu}
    return {"error": f"unknown request {sorted(request)}"}


class ForkServer:
    """A client of one fork server, started on first use (one per test process)."""

    def __init__(self, workdir: Path) -> None:
        self.path = str(workdir / "forkserver.sock")
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._file: Any = None
        self._lock = threading.Lock()

    def _ensure(self) -> None:
        if self._sock is not None:
            return
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", self.path],
            env=env,
            cwd=str(Path(__file__).resolve().parent.parent),
        )
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        for _ in range(600):
            if self._proc.poll() is not None:
                raise RuntimeError(f"the fork server exited with {self._proc.returncode}")
            try:
                sock.connect(self.path)
                break
            except OSError:
                threading.Event().wait(0.05)
        else:
            raise RuntimeError("the fork server did not listen within 30 s")
        self._sock, self._file = sock, sock.makefile("rb")

    def _call(self, request: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._ensure()
            assert self._sock is not None
            self._sock.sendall(json.dumps(request).encode() + b"\n")
            line = self._file.readline()
        if not line:
            raise RuntimeError("the fork server went away")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        log: str,
        *,
        imports: str | None = None,
    ) -> ForkedProcess:
        """Fork ``tidegate *argv``; with ``imports``, the child writes there at its exit the
        modules it imported itself (one name a line)."""
        request = {"argv": list(argv), "env": dict(env), "cwd": cwd, "log": log}
        if imports:
            request["imports"] = imports
        return ForkedProcess(self, int(self._call({"start": request})["pid"]))

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        *,
        stdin: str | None = None,
        timeout: float = 60,
        module: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``tidegate *argv`` (or ``python -m module *argv``) run to its end, as
        :func:`subprocess.run` with ``capture_output=True, text=True`` would (a CLI command
        or a lake job of the tests)."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="tgrun") as tmp:
            files = {n: str(Path(tmp) / n) for n in ("stdin", "stdout", "stderr")}
            Path(files["stdin"]).write_text(stdin or "")
            Path(files["stdout"]).touch()
            Path(files["stderr"]).touch()
            request = {"argv": list(argv), "env": dict(env), "cwd": cwd, "log": files["stdout"]}
            request |= {"stdin": files["stdin"], "stderr": files["stderr"]}
            if module:
                request["module"] = module
            proc = ForkedProcess(self, int(self._call({"start": request})["pid"]))
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
            out, err = (Path(files[n]).read_text() for n in ("stdout", "stderr"))
        command = ["python", "-m", module] if module else ["tidegate"]
        return subprocess.CompletedProcess([*command, *argv], code, out, err)

    def reap(self, pid: int) -> int:
        answer = self._call({"reap": pid})
        from tests.cpu_ledger import forked_ended

        forked_ended(float(answer.get("cpu", 0.0)))
        return int(answer["returncode"])

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        import shutil

        shutil.rmtree(Path(self.path).parent, ignore_errors=True)


class ForkedProcess(subprocess.Popen[bytes]):
    """:class:`subprocess.Popen` for a child of the fork server: what the suite uses of it
    (``pid``, ``returncode``, ``poll``, ``wait``, signals), so it stands where a gateway's
    ``Popen`` stood. Popen's own ``__init__`` (which would exec) is not run."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._child_created = False  # nothing for Popen.__del__ to reap
        self._server = server
        self.pid = pid
        self.args = ["fork-server", str(pid)]
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            ready, _, _ = select.select([self._pidfd], [], [], 0)
            if ready:
                self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:  # type: ignore[override]
        if self.returncode is None:
            ready, _, _ = select.select([self._pidfd], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._ended()
        assert self.returncode is not None
        return self.returncode

    def _ended(self) -> None:
        self.returncode = self._server.reap(self.pid)
        os.close(self._pidfd)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_server: ForkServer | None = None


def fork_server() -> ForkServer:
    """This test process's fork server (started at its first gateway, stopped at exit)."""
    global _server
    if _server is None:
        import atexit
        import tempfile

        _server = ForkServer(Path(tempfile.mkdtemp(prefix="tgfork")))
        atexit.register(_server.close)
    return _server


if __name__ == "__main__":
    serve(sys.argv[1])
