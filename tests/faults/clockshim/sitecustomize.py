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
