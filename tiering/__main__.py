"""``python -m tiering`` (and ``spark-submit`` of this module): run a lake job where needed.

    spark-submit --master local[2] tiering/__main__.py --every 60
    spark-submit --master local[2] tiering/__main__.py compact
    python -m tiering --runner local

The job is ``tier`` (the default), ``compact``, ``expire``, ``orphans`` or ``retention``.

Configured like the gateway (``TIDEGATE_*`` variables or ``TIDEGATE_CONFIG``).
"""

from __future__ import annotations

import argparse
import sys

from gateway.config import Settings
from gateway.lake.components import Components
from gateway.lake.runners import make_runner
from gateway.lake.scheduler import JOBS, run_forever, run_once
from gateway.logs import configure as configure_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tiering", description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", choices=sorted(JOBS), default="tier")
    parser.add_argument("--runner", choices=["spark", "local"], default="spark")
    parser.add_argument("--master", default=None, help="Spark master (default: config).")
    parser.add_argument("--every", type=float, default=None, help="Repeat every N seconds.")
    parser.add_argument(
        "--all",
        action="store_true",
        dest="every_table",
        help="Visit every table (a sweep); default: only the tables marked as needing it.",
    )
    parser.add_argument("--log-level", default=None, help="Default: log.level (INFO).")
    parser.add_argument("--log-format", choices=["text", "json"], default=None)
    args = parser.parse_args(argv)
    settings = Settings()
    configure_logging(settings.log, level=args.log_level, fmt=args.log_format)
    if args.every:
        run_forever(
            settings,
            every_s=args.every,
            kind=args.runner,
            master=args.master,
            job=args.job,
            changed=not args.every_table,
        )
        return 0
    with Components.open(settings) as c:
        report = run_once(
            c, make_runner(c, args.runner, args.master), args.job, changed=not args.every_table
        )
    for name, err in report.failures.items():
        print(f"failed: {name}: {err}", file=sys.stderr)
    done = {"tier": "tiered", "compact": "compacted", "retention": "removed"}.get(args.job)
    if done is not None:
        print(f"{done} {report.records} records in {len(report.tables)} tables")
    else:
        print(f"{args.job}: {len(report.tables)} tables")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
