"""gateway/logs.py in this process: the JSON line format with a traceback, and the levels
the `log` settings give the libraries' loggers (the processes' output is checked in
tests/integration/test_logs.py)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gateway.config import LogConfig, Settings
from gateway.logs import LIBRARY_LOGGERS, configure


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Give back the root handlers and the levels this test's configure() changed."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    names = [*LIBRARY_LOGGERS, "pyiceberg.io", "tidegate.quiet"]
    levels = {name: logging.getLogger(name).level for name in names}
    try:
        yield
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
        for name, lvl in levels.items():
            logging.getLogger(name).setLevel(lvl)
        logging.captureWarnings(False)


def test_json_lines_carry_the_exception_text(restore_logging: None) -> None:
    out = io.StringIO()
    configure(LogConfig(format="json"), stream=out)
    log = logging.getLogger("tidegate.test")
    log.info("two\nlines")
    try:
        {}["missing"]
    except KeyError:
        log.exception("lookup of %s failed", "missing")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == "two\nlines" and first["level"] == "INFO"
    assert first["logger"] == "tidegate.test" and first["time"].endswith("Z")
    assert "exception" not in first
    assert second["level"] == "ERROR" and second["message"] == "lookup of missing failed"
    assert second["exception"].startswith("Traceback")
    assert "KeyError: 'missing'" in second["exception"]


def test_libraries_quiet_by_default_and_turned_up_by_setting(
    restore_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = io.StringIO()
    configure(Settings.explicit().log, stream=out)
    logging.getLogger("pyiceberg.io").info("Loaded FileIO: x")
    logging.getLogger("alembic.runtime.plugins").info("setup plugin x")
    logging.getLogger("botocore.credentials").warning("kept")
    logging.getLogger("tidegate.x").info("ours")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith("WARNING botocore.credentials: kept")
    assert lines[1].endswith("INFO tidegate.x: ours")

    monkeypatch.setenv("TIDEGATE_LOG__LIBRARY_LEVEL", "info")
    monkeypatch.setenv("TIDEGATE_LOG__LEVELS", '{"tidegate.quiet": "error"}')
    out = io.StringIO()
    configure(Settings().log, level="debug", stream=out)
    logging.getLogger("pyiceberg.io").info("Loaded FileIO: x")
    logging.getLogger("tidegate.quiet").warning("dropped")
    logging.getLogger("tidegate.x").debug("ours, at the command's --log-level")
    text = out.getvalue()
    assert "INFO pyiceberg.io: Loaded FileIO: x" in text
    assert "dropped" not in text
    assert "DEBUG tidegate.x: ours" in text
