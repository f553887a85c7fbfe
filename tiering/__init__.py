"""The Spark side of the lake jobs: runners, not the jobs themselves.

What tiering, compaction, expiry, retention and rebalancing *do* lives in
:mod:`gateway.lake` (one engine: plan, run a task per range or run of files, commit once per
table through pyiceberg), which the gateway's embedded schedule runs with the local runner
(threads in the gateway). This package runs the same engine's tasks on Spark executors:

- :mod:`tiering.spark_runner`: the Spark runner (a Spark task per hot range or run of small files,
  a fair-scheduler pool per tenant) and the session it runs in;
- :mod:`tiering.rebalance`: the rebalancing job's heat measured by Spark tasks;
- ``python -m tiering`` / ``spark-submit tiering/__main__.py``: the jobs' command line.

Spark's DataSource for ``spark.read.format("tidegate")`` is another thing, in
:mod:`gateway.spark`.
"""
