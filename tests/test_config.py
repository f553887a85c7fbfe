"""Settings: environment with a nested delimiter, an optional YAML file, strict fields."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.config import DiskHotConfig, RedisHotConfig, Settings


def test_embedded_defaults_need_no_service(tmp_path: Path) -> None:
    s = Settings.explicit(data_dir=tmp_path)
    assert isinstance(s.hot, DiskHotConfig) and s.hot.fsync == "batch"
    assert s.metadata_url == f"sqlite:///{(tmp_path / 'metadata.db').resolve()}"
    assert s.hot_path == tmp_path / "hot"


def test_environment_with_nested_delimiter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_HOT__TYPE", "redis")
    monkeypatch.setenv("TIDEGATE_HOT__URL", "redis://10.0.0.1:6380/2")
    monkeypatch.setenv("TIDEGATE_SERVER__GRPC_PORT", "6000")
    s = Settings()
    assert isinstance(s.hot, RedisHotConfig) and s.hot.url == "redis://10.0.0.1:6380/2"
    assert s.server.grpc_port == 6000


def test_yaml_file_and_env_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "tidegate.yaml"
    cfg.write_text(
        "hot:\n  type: disk\n  fsync: interval\nserver:\n  http_port: 9000\n  grpc_port: 9001\n"
    )
    monkeypatch.setenv("TIDEGATE_CONFIG", str(cfg))
    monkeypatch.setenv("TIDEGATE_SERVER__GRPC_PORT", "7001")
    s = Settings()
    assert isinstance(s.hot, DiskHotConfig) and s.hot.fsync == "interval"
    assert s.server.http_port == 9000
    assert s.server.grpc_port == 7001, "the environment wins over the file"


def test_unknown_fields_and_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError):
        Settings.explicit(hot={"type": "disk", "fsinc": "batch"})
    with pytest.raises(ValidationError):
        Settings.explicit(hot={"type": "tape"})
    monkeypatch.setenv("TIDEGATE_SERVER__HTTP_PORT", "not-a-port")
    with pytest.raises(ValidationError):
        Settings()


def test_explicit_settings_ignore_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_HOT__TYPE", "redis")
    assert Settings.explicit().hot.type == "disk"


def test_cold_defaults_are_embedded_and_env_configures_s3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.config import RestCatalogConfig, SqlCatalogConfig

    s = Settings.explicit(data_dir=tmp_path)
    assert isinstance(s.cold.catalog, SqlCatalogConfig)
    assert s.cold_catalog_uri == f"sqlite:///{(tmp_path / 'catalog.db').resolve()}"
    assert s.cold_warehouse == (tmp_path / "warehouse").resolve().as_uri()

    monkeypatch.setenv("TIDEGATE_COLD__WAREHOUSE", "s3://bucket/prefix/")
    monkeypatch.setenv("TIDEGATE_COLD__S3__ENDPOINT", "http://127.0.0.1:9000")
    monkeypatch.setenv("TIDEGATE_COLD__S3__PATH_STYLE", "true")
    monkeypatch.setenv("TIDEGATE_COLD__CATALOG__TYPE", "rest")
    monkeypatch.setenv("TIDEGATE_COLD__CATALOG__URI", "http://catalog:8181")
    monkeypatch.setenv("TIDEGATE_COLD__CATALOG__CREDENTIAL", "id:secret")
    env = Settings()
    assert env.cold_warehouse == "s3://bucket/prefix"
    assert env.cold.s3.endpoint == "http://127.0.0.1:9000" and env.cold.s3.path_style
    assert isinstance(env.cold.catalog, RestCatalogConfig)
    assert env.cold.catalog.credential == "id:secret"
    with pytest.raises(ValidationError):
        Settings.explicit(cold={"catalog": {"type": "sql", "url": "typo"}})


def test_client_planning_tables_name_tables_or_a_tenant() -> None:
    from gateway.config import ServedCatalogConfig

    rc = ServedCatalogConfig(client_planning_tables=["acme/shop.orders", "globex/*"])
    assert not rc.server_planning("acme", "shop", "orders")
    assert rc.server_planning("acme", "shop", "visits")
    assert not rc.server_planning("globex", "any", "table")
    assert rc.server_planning("initech", "shop", "orders")
    assert not ServedCatalogConfig(scan_planning=False).server_planning("a", "b", "c")
    for bad in ("shop.orders", "acme/orders", "/shop.orders", "acme/"):
        with pytest.raises(ValidationError, match=r"is not 'tenant/namespace\.name'"):
            ServedCatalogConfig(client_planning_tables=[bad])
