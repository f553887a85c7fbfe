"""The lake side of the gateway, without Spark: the tiering engine
(:mod:`~gateway.lake.tiering`), the backends a job talks to
(:mod:`~gateway.lake.components`), job runners by name (:mod:`~gateway.lake.runners`) and
the schedule that runs jobs inside ``tidegate serve`` (:mod:`~gateway.lake.scheduler`).

The Spark jobs themselves live in the top-level ``tiering`` package, which imports this one;
this package never imports it (it names the Spark runner only by a dotted path).
"""
