"""The Spark jobs run over the same harness as the Spark-free lake tests."""

from tests.lake.conftest import harness, hot_kind  # noqa: F401 - fixtures
