"""The metadata store's settings."""

from __future__ import annotations

from pydantic import Field

from gateway.config._section import Section

__all__ = ["MetadataConfig"]


class MetadataConfig(Section):
    """The SQLAlchemy metadata store."""

    url: str | None = Field(
        None, description="SQLAlchemy URL; default sqlite:///<data_dir>/metadata.db."
    )
    echo: bool = Field(False, description="Log every SQL statement.")
