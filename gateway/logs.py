"""How a Tidegate process logs: one handler on stderr, as text or as JSON lines.

:func:`configure` is called once by each entry point (``tidegate serve``, ``tidegate tier``,
``python -m tiering``) with the ``log`` settings (:class:`gateway.config.LogConfig`) and the
command's own ``--log-level`` / ``--log-format``. Tidegate's
own loggers (``tidegate.*``, ``gateway.*``) log at ``level``; the chatty libraries of
:data:`LIBRARY_LOGGERS` at ``library_level`` (WARNING by default: pyiceberg logs every FileIO
it loads at INFO, alembic every plugin it sets up); ``levels`` overrides any logger by name.

The JSON format writes one object per line with ``time`` (ISO-8601, UTC), ``level``,
``logger``, ``message`` and, when there is one, ``exception`` (the formatted traceback),
so a log pipeline never has to stitch a traceback's lines together.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gateway.config import LogConfig

__all__ = ["LIBRARY_LOGGERS", "TEXT_FORMAT", "JsonFormatter", "LogLimiter", "configure"]

#: Loggers of the libraries we use that say at INFO what only their developers need.
LIBRARY_LOGGERS = (
    "alembic",
    "boto3",
    "botocore",
    "httpcore",
    "httpx",
    "py4j",
    "pyiceberg",
    "s3transfer",
    "sqlalchemy",
    "urllib3",
)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

LogFormat = Literal["text", "json"]


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside values are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(
    config: LogConfig,
    *,
    level: str | None = None,
    fmt: LogFormat | None = None,
    stream: IO[str] | None = None,
) -> None:
    """Send every log record to ``stream`` (stderr by default) as ``config`` says;
    ``level`` and ``fmt`` (a command's ``--log-level`` and ``--log-format``) win over it.

    Replaces whatever handlers the root logger had, so calling it again (a test, a second
    command in one process) reconfigures rather than doubling each line. With ``json``,
    Python warnings are logged too (logger ``py.warnings``), so that every line of stderr
    is one JSON object.
    """
    fmt = fmt or config.format
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel((level or config.level).upper())
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(config.library_level)
    for name, value in config.levels.items():
        logging.getLogger(name).setLevel(value)
    logging.captureWarnings(fmt == "json")


class LogLimiter:
    """Logs a kind of event at most once per ``interval_s``, saying how many were left
    unsaid since: a flood (a stranger opening thousands of connections, a full descriptor
    table) makes a few lines a minute, never megabytes of tracebacks."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._unsaid: dict[str, int] = {}

    def log(self, level: int, kind: str, message: str, *args: object) -> None:
        """Log ``message % args`` for the event ``kind`` unless one was logged within the
        interval (then count it); never with a traceback."""
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval_s:
            self._unsaid[kind] = self._unsaid.get(kind, 0) + 1
            return
        self._last[kind] = now
        unsaid = self._unsaid.pop(kind, 0)
        if unsaid:
            message += " (and %d more like it in the last %.0f s)"
            args = (*args, unsaid, self.interval_s)
        self.logger.log(level, message, *args)
