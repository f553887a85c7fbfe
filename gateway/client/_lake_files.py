"""The data files of a read plan as this client reaches them: a local path (the warehouse
folder as this host sees it, or the plan's own path when it is visible here), or an HTTP
URL (a sealed link through the gateway's ``/v1/files/<token>`` on a local warehouse, a
presigned link on object storage) read by range requests.

Every file of one scan is put behind one pyarrow file system (:class:`PlanFiles`), so a
single ``pyarrow.dataset`` reads them all: its C++ threads open files in parallel, prune
row groups by the filter's statistics and pre-buffer the column chunks they keep, and an
HTTP file is asked only for the coalesced ranges the Parquet reader wants.
"""

from __future__ import annotations

import http.client
import io
import os
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = [
    "HttpPool",
    "HttpRangeFile",
    "LakeFile",
    "PlanFiles",
    "in_warehouse",
    "locate",
    "probe",
]

#: Seconds an HTTP range request of a data file may take.
HTTP_TIMEOUT_S = 60.0
#: Seconds the reachability probe of a link's host may take.
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class LakeFile:
    """One data file of a plan as this client reads it."""

    #: Its name behind :class:`PlanFiles` (unique within the scan).
    key: str
    #: ``local``: ``where`` is a path of this host; ``http``: an URL read by ranges;
    #: ``unreachable``: neither (a server path this host does not see).
    kind: Literal["local", "http", "unreachable"]
    where: str
    size: int
    partition: int


def in_warehouse(folder: str | None, inside: str) -> str | None:
    """The path of a plan's file (``inside``: its path in the warehouse) in ``folder``,
    the warehouse folder as the reader sees it; None without either. A path that would
    lead out of the folder is ignored."""
    if not folder or not inside:
        return None
    root = os.path.abspath(folder.removeprefix("file://"))
    path = os.path.abspath(os.path.join(root, inside))
    return path if path.startswith(root + os.sep) else None


def _visible(path: str | None, size: int) -> bool:
    """Whether this host has ``path`` at the plan's size (a stale or foreign file is not
    the plan's)."""
    if path is None:
        return False
    try:
        return os.path.getsize(path) == size
    except OSError:
        return False


def locate(
    key: str, url: str, warehouse_path: str, size: int, partition: int, warehouse: str | None
) -> LakeFile:
    """How this client reads one planned file: in its warehouse folder when it has the
    file there, at the plan's own path when that is visible here, else by its link."""
    local = in_warehouse(warehouse, warehouse_path)
    if _visible(local, size):
        assert local is not None
        return LakeFile(key, "local", local, size, partition)
    if url.startswith(("http://", "https://")):
        return LakeFile(key, "http", url, size, partition)
    path = url.removeprefix("file://")
    if _visible(path, size):
        return LakeFile(key, "local", path, size, partition)
    return LakeFile(key, "unreachable", url, size, partition)


# HTTP range reads --------------------------------------------------------------------
class HttpPool:
    """Kept-alive connections to the hosts of one scan's links, closed with the scan:
    a request takes an idle connection (or opens one) and gives it back when answered."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _take(self, scheme: str, netloc: str, timeout: float) -> http.client.HTTPConnection:
        with self._lock:
            idle = self._idle.get((scheme, netloc))
            if idle:
                return idle.pop()
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        return cls(netloc, timeout=timeout)

    def _give(self, scheme: str, netloc: str, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault((scheme, netloc), []).append(conn)
                return
        # A read Arrow started before the scan ended (a limit reached) came back late.
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def range_get(self, url: str, start: int, end: int, timeout: float = HTTP_TIMEOUT_S) -> bytes:
        """Bytes ``[start, end)`` of ``url``, on a kept-alive connection (one the server
        closed meanwhile is opened again, once). A 429 (the tenant's read quota: the
        gateway meters what its links serve) is waited out as its ``Retry-After`` says,
        for up to ``timeout`` seconds in all.

        Raises:
            OSError: the host did not answer, or answered with neither 200 nor 206.
        """
        parts = urllib.parse.urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        headers = {"Range": f"bytes={start}-{end - 1}"}
        deadline = time.monotonic() + timeout
        broken = 0
        while True:
            conn = self._take(parts.scheme, parts.netloc, timeout)
            try:
                conn.request("GET", target, headers=headers)
                response = conn.getresponse()
                body = response.read()
            except (http.client.HTTPException, OSError) as exc:
                conn.close()
                broken += 1
                if broken < 2:
                    continue
                if isinstance(exc, OSError):
                    raise
                # A body cut short (IncompleteRead) or a garbled answer: the link broke,
                # as a reset connection does (callers take OSError for that).
                raise OSError(f"the link {parts.netloc} broke off its answer ({exc!r})") from exc
            if response.status in (200, 206):
                self._give(parts.scheme, parts.netloc, conn)
                # 200: no range support, the whole object came.
                return body if response.status == 206 else body[start:end]
            wait = _retry_after(response) if response.status == 429 else None
            if wait is not None and time.monotonic() + wait < deadline:
                self._give(parts.scheme, parts.netloc, conn)
                time.sleep(wait)
                continue
            conn.close()
            text = body[:200].decode("utf-8", "replace").strip()
            raise OSError(f"HTTP {response.status} {text}")


def _retry_after(response: http.client.HTTPResponse) -> float | None:
    """The wait a 429 asks for (at least 50 ms), or None without a readable one."""
    value = response.getheader("Retry-After")
    try:
        return max(0.05, float(value)) if value is not None else None
    except ValueError:
        return None


class HttpRangeFile(io.RawIOBase):
    """A read-only file over range requests of an URL whose size the plan gives, so a
    Parquet reader fetches the footer and the column chunks it needs, not the object.
    Its requests use ``pool``'s connections; without one, each opens and closes its own."""

    def __init__(self, url: str, size: int, pool: HttpPool | None = None) -> None:
        self.pool, self.url, self.size, self.pos = pool, url, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        if self.pool is not None:
            data = self.pool.range_get(self.url, self.pos, end)
        else:
            once = HttpPool()
            try:
                data = once.range_get(self.url, self.pos, end)
            finally:
                once.close()
        self.pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def probe(files: Iterable[LakeFile]) -> str | None:
    """Why this client cannot read ``files`` itself (a sentence naming the file), or None
    when it can: local files were found at plan time, and one 1-byte range request per
    host of the links answers."""
    seen: set[str] = set()
    pool = HttpPool()
    try:
        return _probe(files, seen, pool)
    finally:
        pool.close()


def _probe(files: Iterable[LakeFile], seen: set[str], pool: HttpPool) -> str | None:
    for f in files:
        if f.kind == "unreachable":
            return f"data file {f.where} is not on this host and the plan gives no link to it"
        if f.kind != "http":
            continue
        parts = urllib.parse.urlsplit(f.where)
        origin = f"{parts.scheme}://{parts.netloc}"
        if origin in seen:
            continue
        seen.add(origin)
        try:
            pool.range_get(f.where, 0, 1, timeout=PROBE_TIMEOUT_S)
        except OSError as exc:
            return f"the link {origin}/... of data file {f.key} did not answer ({exc})"
    return None


# One file system over a plan's files --------------------------------------------------
class PlanFiles(pafs.FileSystemHandler):  # type: ignore[misc]
    """A read-only pyarrow file system whose files are one plan's data files, by
    :attr:`LakeFile.key`: local ones opened natively (read by C++ with no Python), HTTP
    ones through range requests."""

    def __init__(self, files: Mapping[str, LakeFile], pool: HttpPool) -> None:
        self.files = dict(files)
        self.pool = pool

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def __hash__(self) -> int:
        return id(self)

    def get_type_name(self) -> str:
        return "tidegate-plan"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        out = []
        for p in paths:
            f = self.files.get(p)
            if f is None:
                out.append(pafs.FileInfo(p, pafs.FileType.NotFound))
            else:
                out.append(pafs.FileInfo(p, pafs.FileType.File, size=f.size))
        return out

    def open_input_file(self, path: str) -> pa.NativeFile:
        f = self.files.get(path)
        if f is None:
            raise FileNotFoundError(path)
        if f.kind == "local":
            return pa.OSFile(f.where)
        return pa.PythonFile(HttpRangeFile(f.where, f.size, self.pool), mode="r")

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.open_input_file(path)

    def get_file_info_selector(self, selector: Any) -> list[pafs.FileInfo]:
        return self.get_file_info(sorted(self.files))

    def _read_only(self, *args: Any) -> Any:
        raise OSError("a read plan's files are read-only")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = _read_only
    delete_file = move = copy_file = open_output_stream = open_append_stream = _read_only
