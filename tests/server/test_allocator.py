"""Every Arrow allocation of a ``tidegate`` process goes to jemalloc (which the server
tells to give freed pages back at once), Arrow's C++ internals included: left on Arrow's
default (mimalloc) they kept freed memory and made the soak's gateways grow."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.services import REPO_ROOT

# What a gateway does: import the command, then run compute kernels and Parquet reads,
# which allocate from Arrow's C++ default pool, not from pyarrow's set_memory_pool.
PROBE = """
import json, tempfile, gateway.cli
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
t = pa.table({"a": list(range(200_000))})
pc.add(t["a"], 1)
with tempfile.TemporaryDirectory() as d:
    pq.write_table(t, d + "/t.parquet")
    pq.read_table(d + "/t.parquet")
print(json.dumps({
    "default": pa.default_memory_pool().backend_name,
    "mimalloc_peak": pa.mimalloc_memory_pool().max_memory(),
}))
"""


def _probe(**env: str) -> dict[str, object]:
    full = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    full.update(env, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_the_command_puts_every_arrow_allocation_on_jemalloc() -> None:
    found = _probe()
    assert found == {"default": "jemalloc", "mimalloc_peak": 0}


def test_an_operators_choice_of_arrow_pool_wins() -> None:
    assert _probe(ARROW_DEFAULT_MEMORY_POOL="system")["default"] == "system"
