"""The backends a lake job talks to, opened from settings or borrowed from a gateway."""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Self

from gateway.wire.errors import TidegateError

if TYPE_CHECKING:
    from gateway.cold.base import ColdStore
    from gateway.config import Settings
    from gateway.hot import HotLog
    from gateway.meta import MetadataStore

__all__ = ["Components", "TieringError", "require_cold_store"]


class TieringError(TidegateError):
    """A lake job could not handle a table: its hot range is unreadable, has a gap, or
    starts above the tiered watermark (records lost behind the job's back), or the cold
    tier is off. Raised by the jobs only, never sent to a client."""

    reason = "TIERING_FAILED"


def require_cold_store(settings: Settings) -> ColdStore:
    """The cold store of the settings, which a lake job cannot do without.

    Raises:
        TieringError: the cold tier is disabled (``cold.enabled=false``).
    """
    from gateway.cold import load_cold_store as load

    store = load(settings)
    if store is None:
        raise TieringError("tiering needs the cold tier, which is disabled (cold.enabled)")
    return store


@dataclass
class Components:
    """The backends a tiering run talks to. Build with :meth:`open` (owns and closes
    them) or directly from objects a gateway already holds (closes nothing)."""

    settings: Settings
    meta: MetadataStore
    hot: HotLog
    cold: ColdStore
    owned: bool = False

    @classmethod
    def open(cls, settings: Settings) -> Components:
        from gateway.hot import load_hot_log
        from gateway.meta import MetadataStore

        settings.data_dir.mkdir(parents=True, exist_ok=True)
        meta = MetadataStore.from_settings(settings)
        hot: HotLog | None = None
        try:
            hot = load_hot_log(settings)
            hot.bind_placements(meta)
            cold = require_cold_store(settings)
        except BaseException:
            if hot is not None:
                hot.close()
            meta.close()
            raise
        return cls(settings, meta, hot, cold, owned=True)

    def close(self) -> None:
        if self.owned:
            self.cold.close()
            self.hot.close()
            self.meta.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
