"""Backend registries: one table of built-in names (gateway.plugins.BUILTINS), and every
pluggable part (hot tier, cold tier, tiering runner, heat meter) chosen by a built-in name or
a dotted path to a class of the user's own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from gateway.cli import app
from gateway.cold import ColdStore, load_cold_store
from gateway.cold.iceberg import IcebergColdStore
from gateway.config import Settings
from gateway.hot import HotLog, ShardedHotLog, load_hot_log, sharded
from gateway.hot.disk import DiskHotLog
from gateway.lake.components import Components
from gateway.lake.rebalance import HeatMeter
from gateway.lake.runners import LocalRunner, Runner, make_runner
from gateway.plugins import BUILTINS, BackendError, load_class
from gateway.wire.errors import InvalidRequest

BASES: dict[str, type[Any]] = {
    "hot tier": HotLog,
    "cold tier": ColdStore,
    "tiering runner": Runner,
    "heat meter": HeatMeter,
}


class TaggedHotLog(DiskHotLog):
    """A hot tier of a user's own, built from ``hot.options``."""

    name = "tagged"

    @classmethod
    def from_settings(cls, settings: Any) -> TaggedHotLog:
        log = cls(settings.data_dir / "hot-tagged", fsync="never")
        log.tag = settings.hot.options["tag"]
        return log

    tag: str = ""


class TaggedColdStore(IcebergColdStore):
    """A cold tier of a user's own."""


class TaggedRunner(LocalRunner):
    """A tiering runner of a user's own."""


@pytest.mark.parametrize("kind", sorted(BUILTINS))
def test_every_builtin_name_loads_a_class_of_its_part(kind: str) -> None:
    assert set(BUILTINS) == set(BASES)
    for name in BUILTINS[kind]:
        cls = load_class(kind, name, BASES[kind])
        assert issubclass(cls, BASES[kind])


def test_dotted_paths_choose_the_users_own_hot_and_cold_tiers_and_runner(tmp_path: Path) -> None:
    settings = Settings.explicit(
        data_dir=tmp_path,
        hot={"type": f"{__name__}:TaggedHotLog", "options": {"tag": "mine"}},
        cold={"type": f"{__name__}.TaggedColdStore"},
        tiering={"runner": f"{__name__}:TaggedRunner"},
    )
    hot = load_hot_log(settings)
    assert isinstance(hot, TaggedHotLog) and hot.tag == "mine"
    hot.close()
    cold = load_cold_store(settings)
    assert type(cold) is TaggedColdStore
    assert cold is not None
    cold.close()
    with Components.open(settings) as c:
        runner = make_runner(c, settings.tiering.runner)
        assert type(runner) is TaggedRunner


@pytest.mark.parametrize(
    ("section", "value", "kind"),
    [
        ("cold", {"type": "parquet"}, "cold tier"),
        ("tiering", {"runner": "flink"}, "tiering runner"),
    ],
)
def test_an_unknown_backend_name_is_refused_naming_the_choices(
    tmp_path: Path, section: str, value: dict[str, str], kind: str
) -> None:
    with pytest.raises(ValidationError) as err:
        Settings.explicit(data_dir=tmp_path, **{section: value})
    message = str(err.value)
    assert f"unknown {kind}" in message
    for name in BUILTINS[kind]:
        assert repr(name) in message
    assert "dotted path" in message


def test_a_dotted_path_to_something_else_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        BackendError, match=re.escape("module 'tests.test_plugins' has no class 'BASES'")
    ):
        load_cold_store(Settings.explicit(data_dir=tmp_path, cold={"type": f"{__name__}:BASES"}))
    settings = Settings.explicit(data_dir=tmp_path, cold={"type": f"{__name__}:TaggedRunner"})
    with pytest.raises(BackendError, match=re.escape("is not a gateway.cold.base.ColdStore")):
        load_cold_store(settings)


def test_the_cli_runner_option_takes_a_dotted_path_and_refuses_unknown_names(
    tmp_path: Path,
) -> None:
    cli = CliRunner()
    bad = cli.invoke(app, ["tier", "--runner", "flink", "--data-dir", str(tmp_path)])
    assert bad.exit_code != 0
    assert "unknown tiering runner 'flink'" in bad.output
    ok = cli.invoke(
        app, ["tier", "--runner", f"{__name__}:TaggedRunner", "--data-dir", str(tmp_path)]
    )
    assert ok.exit_code == 0, ok.output


def test_only_a_sharded_hot_tier_moves_partitions(tmp_path: Path) -> None:
    disk = DiskHotLog(tmp_path / "hot")
    try:
        assert not isinstance(disk, ShardedHotLog)
        with pytest.raises(InvalidRequest, match="disk hot tier has no shards"):
            sharded(disk)
    finally:
        disk.close()
    redis_log = load_class("hot tier", "redis", HotLog)
    assert issubclass(redis_log, ShardedHotLog)
