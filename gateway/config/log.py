"""Logging's settings (``gateway/logs.py``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from gateway.config._section import Section

__all__ = ["LogConfig", "LogLevel"]


LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
    BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v),
]


class LogConfig(Section):
    """Logging of the process (``gateway/logs.py``): one stream, stderr."""

    level: LogLevel = Field("INFO", description="Level of Tidegate's own loggers.")
    format: Literal["text", "json"] = Field(
        "text",
        description="'text' (one line per record) or 'json' (one JSON object per line: "
        "time, level, logger, message, exception).",
    )
    library_level: LogLevel = Field(
        "WARNING",
        description="Level of the libraries' loggers (pyiceberg, alembic, botocore, urllib3, "
        "py4j...); INFO brings back their chatter.",
    )
    levels: dict[str, LogLevel] = Field(
        default_factory=dict,
        description="Level per logger name, over the two above, e.g. {'pyiceberg.io': 'INFO'}.",
    )
