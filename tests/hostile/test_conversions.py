"""Issue 33, item 1: no value a caller sends may crash a gateway (or the CLI, or an SDK
user's process) inside Arrow's converters.

``{"amount": "0E-999999999"}`` for a ``decimal128(10, 2)`` column killed the gateway for
every tenant: pyarrow segfaults on such a decimal. The class of bug is closed where a
caller's values become Arrow (:mod:`gateway.wire.values`), and shown twice: a fuzz run of
every conversion over generated edge values, in a child process so that a crash is seen as
a signal; and the original request against a real gateway.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests.hostile.conftest import Tenant, http_error
from tests.services import REPO_ROOT

#: Values per column type in CI (about 10 s); ``make fuzz`` runs the long mode.
EXAMPLES = int(os.environ.get("TIDEGATE_CONVERSION_EXAMPLES", "60"))
PATHS = ("json", "jsonl", "csv", "sdk", "filter")


def test_no_conversion_crashes_over_generated_edge_values() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.hostile.conversions", "--examples", str(EXAMPLES)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode < 0:
        pytest.fail(
            f"a conversion crashed the process with {signal.Signals(-proc.returncode).name}:\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    summary = proc.stdout.splitlines()[0]
    print(summary)
    counts = {k: int(v) for k, v in re.findall(r"(\w+:\w+) (\d+)", summary)}
    # Every path both accepted and refused values: the run reached the converters.
    for path in PATHS:
        assert counts.get(f"{path}:ok", 0) > 0, summary
        assert counts.get(f"{path}:refused", 0) > 0, summary


ORDERS = [
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "decimal128(10, 2)"},
    {"name": "big", "type": "decimal128(38, 0)"},
]


def test_extreme_decimal_exponents_are_stored_exactly_or_refused(tenant: Tenant) -> None:
    with tenant.http() as http:
        r = http.post(
            "/v1/tables",
            json={"namespace": "shop", "name": "orders", "schema": ORDERS, "partitions": 1},
        )
        assert r.status_code == 201, r.text
        rows = [
            {"customer": "zero", "amount": "0E-999999999", "big": "0E+999999999"},
            {"customer": "scaled", "amount": "1.50E+1", "big": 10**37},
            {"customer": "top", "amount": "99999999.99", "big": "9" * 38},
        ]
        r = http.post("/v1/tables/shop/orders/records", json={"rows": rows})
        assert r.status_code == 200, r.text
        for value, why in [
            ("1E-999999999", "999999999 digits after the point"),
            ("1E+999999999", "1000000000 digits before the point"),
            ("7E-9223372036854775809", "is not a decimal number"),
        ]:
            r = http.post(
                "/v1/tables/shop/orders/records",
                json={"rows": [{"customer": "x", "amount": value, "big": 1}]},
            )
            status, reason, message = http_error(r)
            assert (status, reason) == (400, "SCHEMA_MISMATCH"), r.text
            assert "amount" in message and why in message and "decimal128(10, 2)" in message
        r = http.get("/v1/tables/shop/orders/partitions/0/records", params={"offset": 0})
        got = {row["customer"]: (row["amount"], row["big"]) for row in r.json()["records"]}
        assert got == {
            "zero": ("0.00", "0"),
            "scaled": ("15.00", str(10**37)),
            "top": ("99999999.99", "9" * 38),
        }
        # Filters with such literals bind exactly; a decimal128(38, 0) column's range ends
        # at 10**38 - 1 (it was rounded to 10**38 in 28-digit arithmetic, then refused by
        # Arrow with a 500).
        for flt, expected in [
            ("amount >= 0E-999999999", {"zero", "scaled", "top"}),
            ("amount = 7E-9223372036854775809", set()),
            ("amount > 1E-9223372036854775808", {"scaled", "top"}),
            ("amount < 1E+9223372036854775807", {"zero", "scaled", "top"}),
            ("big >= 99999999999999999999999999999999999999.5", set()),
            ("big >= 99999999999999999999999999999999999999", {"top"}),
            ("big in (99999999999999999999999999999999999999, 1e-99999999999)", {"top"}),
        ]:
            r = http.post("/v1/tables/shop/orders/scan", json={"filter": flt})
            assert r.status_code == 200, (flt, r.text)
            assert {row["customer"] for row in r.json()["rows"]} == expected, flt
    assert tenant.gw.proc is not None and tenant.gw.proc.poll() is None, tenant.gw.log()
