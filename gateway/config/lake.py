"""The lake jobs' settings: tiering, compaction, snapshot expiry and orphan clean-up, and
table retention.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from gateway.config._section import Section, backend

__all__ = ["CompactionConfig", "ExpiryConfig", "RetentionConfig", "TieringConfig"]


class TieringConfig(Section):
    """Tiering: moving each partition's hot range into the Iceberg table (``tiering/``)."""

    enabled: bool = Field(
        True, description="Tier on a schedule inside `tidegate serve` (the embedded mode)."
    )
    interval_s: float = Field(30.0, gt=0, description="Period of the embedded schedule.")
    sweep_interval_s: float = Field(
        3600.0,
        ge=0,
        description="The embedded schedule visits every table once at start and then every "
        "this many seconds (0: at start only), for appends a crashed gateway acknowledged "
        "but had not yet marked; otherwise it visits only the tables marked for it.",
    )
    runner: Annotated[str, backend("tiering runner")] = Field(
        "local",
        description="Embedded schedule's runner: threads in the gateway ('local'), Spark "
        "('spark'), or the dotted path of a gateway.lake.runners.Runner of your own.",
    )
    master: str = Field("local[2]", description="Spark master of the spark runner.")
    embedded_parallel_tenants: int | None = Field(
        None,
        ge=1,
        description="Tenants the embedded schedule's lake jobs work on at once; default 1 with "
        "the local runner (each more is a thread of the gateway competing with requests for "
        "the interpreter lock), 4 with Spark (one fair-scheduler pool each).",
    )
    target_file_bytes: int = Field(
        128 * 1024 * 1024, ge=1024, description="Roll a new Parquet file at about this size."
    )
    hot_retention_s: float = Field(
        300.0,
        ge=0,
        description="Keep tiered records in the hot tier this long after their commit.",
    )
    commit_attempts: int = Field(6, ge=1, description="Tries of a conflicting commit.")


class CompactionConfig(Section):
    """Compaction: rewriting runs of small data files into files near the target size
    (``tidegate compact``, ``gateway/lake/compaction.py``)."""

    enabled: bool = Field(
        True, description="Compact on a schedule inside `tidegate serve` (the embedded mode)."
    )
    interval_s: float = Field(600.0, gt=0, description="Period of the embedded schedule.")
    target_file_bytes: int = Field(
        128 * 1024 * 1024,
        ge=1024,
        description="Size on storage a run of small files is rewritten into (one file per run).",
    )
    small_file_bytes: int = Field(
        96 * 1024 * 1024,
        ge=1,
        description="A data file below this size on storage is small: a compaction input.",
    )
    min_files: int = Field(
        2, ge=2, description="Fewest adjacent small files worth rewriting into one."
    )

    @model_validator(mode="after")
    def _small_below_target(self) -> CompactionConfig:
        if self.small_file_bytes > self.target_file_bytes:
            raise ValueError(
                f"compaction.small_file_bytes ({self.small_file_bytes}) must not exceed "
                f"compaction.target_file_bytes ({self.target_file_bytes})"
            )
        return self


class ExpiryConfig(Section):
    """Snapshot expiry, file deletion and orphan clean-up (``tidegate expire``,
    ``tidegate clean-orphans``, ``gateway/lake/expiry.py``)."""

    enabled: bool = Field(
        True,
        description="Expire snapshots (and delete their files) on a schedule inside "
        "`tidegate serve`.",
    )
    interval_s: float = Field(3600.0, gt=0, description="Period of the embedded schedule.")
    retention_s: float = Field(
        24 * 3600.0,
        ge=60,
        description="Expire a snapshot once it has not been the current one for this long "
        "(never below tiering.hot_retention_s).",
    )
    keep_last: int = Field(5, ge=1, description="Always keep this many newest snapshots.")
    scan_lease_s: float = Field(
        3600.0,
        gt=0,
        description="Longest a scan keeps its snapshot from expiry (a finished scan releases "
        "it at once; a plan keeps it for cold.presign_expiry_s).",
    )
    orphans_enabled: bool = Field(
        False, description="Also remove orphan files on the embedded schedule."
    )
    orphan_age_s: float = Field(
        3 * 24 * 3600.0,
        ge=0,
        description="Remove a file no snapshot references only once it is this old (a job "
        "still writing it may commit it until then).",
    )


class RetentionConfig(Section):
    """Table retention: removing the records older than a table's ``retention_ms`` or
    beyond its ``retention_records`` (``tidegate retention``, ``gateway/lake/retention.py``).
    Tables without a retention are left alone."""

    enabled: bool = Field(
        True, description="Apply table retention on a schedule inside `tidegate serve`."
    )
    interval_s: float = Field(300.0, gt=0, description="Period of the embedded schedule.")
    settle_s: float = Field(
        5.0,
        ge=0,
        description="Leave a table alone for this long after its retention was set, so "
        "every gateway knows it has one before an earliest offset is recorded (gateways "
        "reuse a table's definition for 2 s: keep it above that; 0 only for tests).",
    )
