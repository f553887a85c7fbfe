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


# glibc's dynamic mmap threshold: after a large block is freed, the next one of that size
# comes from the heap arenas (and its space stays in the process once freed) unless the
# gateway fixed the threshold. mallinfo2().hblks counts blocks served by mmap.
MMAP_PROBE = """
import ctypes, json, sys
from gateway.server.app import _fixed_mmap_threshold

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Info
if sys.argv[1] == "fixed":
    _fixed_mmap_threshold()
size = 4 * 1024 * 1024
libc.free(libc.malloc(size))  # raises glibc's threshold past 4 MiB unless fixed
before = libc.mallinfo2().hblks
block = libc.malloc(size)
print(json.dumps({"mmapped": libc.mallinfo2().hblks - before}))
libc.free(block)
"""


def _mmapped(mode: str, **extra: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    env.update(extra)
    done = subprocess.run(
        [sys.executable, "-c", MMAP_PROBE, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout.splitlines()[-1])["mmapped"])


def test_large_blocks_stay_on_their_own_mappings_once_the_gateway_fixed_the_threshold() -> None:
    assert _mmapped("default") == 0  # glibc's own behaviour: the second block is in a heap
    assert _mmapped("fixed") == 1


def test_an_operators_mmap_threshold_wins() -> None:
    # glibc's own knob, read at start: a fixed 32 MiB threshold keeps the 4 MiB block in
    # a heap (the throughput side of the trade), and the gateway leaves it alone.
    assert _mmapped("fixed", MALLOC_MMAP_THRESHOLD_=str(32 * 1024 * 1024)) == 0
