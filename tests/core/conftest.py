"""The core's stitching runs over every storage the cold suite does."""

from tests.cold.conftest import catalog_postgres, cold_settings, storage  # noqa: F401 - fixtures
