"""Clock jumps for a gateway under the fault suite (tests/faults): loaded by Python at start
because tests/faults/clockshim is on the process's PYTHONPATH.

``time.time`` and ``time.time_ns`` (the wall clock the gateway stamps ``_timestamp`` and
ages tiered hot data with) are shifted by the seconds written in the file named by
``TIDEGATE_FAULTS_CLOCK_FILE``, re-read every 50 ms. The monotonic clock is not touched,
as a real NTP step does not touch it either.
"""

import os
import threading
import time

_path = os.environ.get("TIDEGATE_FAULTS_CLOCK_FILE")
if _path:
    _offset = [0.0]
    _real_time, _real_time_ns = time.time, time.time_ns

    def _watch() -> None:
        while True:
            try:
                with open(_path) as f:
                    _offset[0] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)

    def _time() -> float:
        return _real_time() + _offset[0]

    def _time_ns() -> int:
        return _real_time_ns() + int(_offset[0] * 1e9)

    time.time = _time
    time.time_ns = _time_ns
    threading.Thread(target=_watch, name="tidegate-faults-clock", daemon=True).start()


# Heap profiling for the soak (``python -m tests.faults.soak --profile DIR``): every
# ``TIDEGATE_FAULTS_PROFILE_EVERY_S`` seconds the gateway writes to DIR/<pid>-<n>.txt the
# Python heap's growth since the first dump by allocating traceback (tracemalloc), the
# live objects by type, Arrow's pool and glibc's arena statistics, so a leak can be told
# from allocator retention. Off unless the variable is set: tracemalloc slows Python down.
_profile_dir = os.environ.get("TIDEGATE_FAULTS_PROFILE_DIR")
if _profile_dir:
    import collections
    import ctypes
    import gc
    import sys
    import tracemalloc

    _every = float(os.environ.get("TIDEGATE_FAULTS_PROFILE_EVERY_S", "30"))

    def _mallinfo() -> str:
        class _Info(ctypes.Structure):
            _fields_ = [
                (n, ctypes.c_size_t)
                for n in (
                    "arena",
                    "ordblks",
                    "smblks",
                    "hblks",
                    "hblkhd",
                    "usmblks",
                    "fsmblks",
                    "uordblks",
                    "fordblks",
                    "keepcost",
                )
            ]

        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = _Info
            info = libc.mallinfo2()
        except (OSError, AttributeError):
            return "mallinfo2 unavailable"
        mib = 1024 * 1024
        return (
            f"glibc: arena {info.arena / mib:.1f} MiB, mmapped {info.hblkhd / mib:.1f} MiB, "
            f"in use {info.uordblks / mib:.1f} MiB, free in arenas {info.fordblks / mib:.1f} MiB"
        )

    def _arrow() -> str:
        pa = sys.modules.get("pyarrow")
        if pa is None:
            return "pyarrow not loaded"
        pool = pa.default_memory_pool()
        return (
            f"arrow {pool.backend_name}: allocated {pool.bytes_allocated() / 2**20:.1f} MiB, "
            f"max {pool.max_memory() / 2**20:.1f} MiB"
        )

    def _profile() -> None:
        # Tracing starts once the gateway has started: traced imports would slow its
        # start past the suite's timeout, and growth is what is looked for.
        time.sleep(float(os.environ.get("TIDEGATE_FAULTS_PROFILE_DELAY_S", "40")))
        tracemalloc.start(int(os.environ.get("TIDEGATE_FAULTS_PROFILE_FRAMES", "8")))
        first = None
        n = 0
        while True:
            time.sleep(_every)
            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            counts = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
            traced, peak = tracemalloc.get_traced_memory()
            lines = [
                f"traced {traced / 2**20:.1f} MiB (peak {peak / 2**20:.1f} MiB)",
                _arrow(),
                _mallinfo(),
                "objects: " + ", ".join(f"{k} {v}" for k, v in counts.most_common(25)),
            ]
            if first is None:
                first = snap
            else:
                lines.append("growth since the first dump, by traceback:")
                for stat in snap.compare_to(first, "traceback")[:25]:
                    lines.append(f"{stat.size_diff / 1024:+.0f} KiB {stat.count_diff:+d} blocks")
                    lines.extend("    " + line for line in stat.traceback.format()[-16:])
            path = os.path.join(_profile_dir, f"{os.getpid()}-{n:03d}.txt")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            n += 1

    threading.Thread(target=_profile, name="tidegate-faults-profile", daemon=True).start()
