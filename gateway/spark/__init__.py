"""The Spark connector: ``spark.read``, ``spark.readStream`` and ``df.write`` of Tidegate
stream-tables.

Two implementations answer to one behaviour suite (``tests/spark``):

- the **JVM connector** (``gateway/spark/jvm``, a DataSource V2 connector shipped as a jar in
  this package, :func:`jar_path`): columnar batch reads with column, filter, limit and
  aggregate pushdown, data files read by Spark's own vectorized Parquet reader and hot
  ranges as Arrow, streaming reads of its own, and batch and streaming writes through the
  idempotent producer;
- the **Python source** (PySpark's Python Data Source API), where jars cannot be added
  (Spark Connect, a cluster that forbids them).

    import gateway.spark

    spark = (
        SparkSession.builder.config("spark.jars", gateway.spark.jar_path()).getOrCreate()
    )
    gateway.spark.register(spark)
    df = (
        spark.read.format("tidegate")
        .option("endpoint", "http://gateway:8080")
        .option("api_key", key)
        .load("shop.orders")
    )

Reads plan on the driver with the gateway's read plan (one pinned Iceberg snapshot plus
the hot range per partition); executors read the data files directly (presigned URLs on
object storage, never the warehouse's keys) and the hot ranges through the gateway.
A primary-key table's batch read is its current state, one task per table partition
answered by the gateway's scan of that partition.
Writes append through the idempotent producer, exactly once across task retries. See
``docs/spark.md``.

Needs ``pip install 'tidegate[spark]'`` (PySpark >= 4.2). Imports only
:mod:`gateway.wire`, :mod:`gateway.client`, pyarrow and pyspark.
"""

from __future__ import annotations

from typing import Any

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        f"gateway.spark needs PySpark: pip install 'tidegate[spark]' ({exc})"
    ) from exc

from pathlib import Path

from gateway.spark._options import SparkOptionError
from gateway.spark._source import TidegateDataSource, TidegatePythonSource

__all__ = [
    "JarMissing",
    "SparkOptionError",
    "TidegateDataSource",
    "has_jvm_connector",
    "jar_path",
    "redact_api_key",
    "register",
]

#: Where ``make jar`` puts the JVM connector, and where the wheel carries it.
JAR = Path(__file__).resolve().parent / "jars" / "tidegate-spark.jar"


class JarMissing(FileNotFoundError):
    """The JVM connector's jar is not in this installation."""


def jar_path() -> str:
    """The path of the JVM connector's jar, for ``spark.jars``; :class:`JarMissing`, saying
    how to build it, when this installation has none."""
    if not JAR.is_file():
        raise JarMissing(
            f"tidegate: the Spark connector's jar is not built ({JAR}); in a checkout run "
            "`make jar` (needs a JDK: apt-get install openjdk-17-jdk-headless), or install "
            "a tidegate wheel, which carries it"
        )
    return str(JAR)


def has_jvm_connector(spark: Any) -> bool:
    """Whether ``spark``'s JVM can load the JVM connector (its jar is on the session)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: no JVM in this process
        return False
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName("io.tidegate.spark.TidegateProvider", False, loader)
    except Exception:  # py4j's error for a missing class
        return False
    return True


#: The session setting of the options whose values Spark never prints (by name or value).
REDACTED_OPTIONS = "spark.sql.redaction.options.regex"
#: The option names of ours among them.
API_KEY_PATTERN = "(?i)^api_key$"


def redact_api_key(spark: Any) -> None:
    """Add ``api_key`` to the options ``spark`` redacts when it prints a plan.

    Spark prints a write's options with its plan (an extended explain, the SQL tab of its
    UI with ``spark.sql.ui.explainMode=extended``, errors that quote a plan), hiding only
    those whose name or value matches ``spark.redaction.regex`` (secret, password, token,
    access key) or this session's ``spark.sql.redaction.options.regex`` (url by default);
    ``api_key`` matches neither. The JVM connector does the same when a session first uses
    it (``Secrets.java``).
    """
    current = spark.conf.get(REDACTED_OPTIONS, "(?i)url") or ""
    if API_KEY_PATTERN not in current:
        spark.conf.set(
            REDACTED_OPTIONS, f"(?:{current})|{API_KEY_PATTERN}" if current else API_KEY_PATTERN
        )


def register(spark: Any, *, filter_pushdown: bool = True) -> None:
    """Make ``format("tidegate")`` work on ``spark``.

    With the jar on the session, ``tidegate`` is the JVM connector already (its reads and
    writes, batch and streaming, need nothing more), and the Python source is registered
    here as ``tidegate_python``. Without it (Spark Connect, a cluster that forbids jars),
    the Python source is registered as ``tidegate`` too. ``format("tidegate_python")``
    picks the Python source either way.

    It also keeps the ``api_key`` option out of the plans Spark prints
    (:func:`redact_api_key`).

    ``filter_pushdown`` sets ``spark.sql.python.filterPushdown.enabled``, which the Python
    source needs to prune files. PySpark 4.3 reuses a DataFrame's first pushed-down plan
    for its later queries that push no filter (see docs/spark.md): with the Python source,
    load one DataFrame per query, or pass ``False`` to leave all filtering to Spark.
    """
    spark.conf.set("spark.sql.python.filterPushdown.enabled", str(filter_pushdown).lower())
    redact_api_key(spark)
    spark.dataSource.register(TidegatePythonSource)
    if not has_jvm_connector(spark):
        spark.dataSource.register(TidegateDataSource)
