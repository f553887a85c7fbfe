"""Why the fault suite stops a gateway before it cuts the disk's power (issue 42, seed 566).

``python -m tests.faults.powercut_check --trials 100 --mode cut|stop`` (root: it mounts a
loop device). Each trial makes a fresh ext4 filesystem as the fault suite does, starts a
writer process whose four threads append 4 KiB and fsync, again and again, acknowledging
each fsync that returned 0 through a pipe, and cuts the power as :meth:`Cluster.power_cut`
does: ext4's shutdown ioctl without a journal flush, then SIGKILL.

- ``cut``: the writer runs on for 20 ms after the ioctl, as a gateway did before its kill.
- ``stop``: the writer is stopped first (every thread seen stopped), as the suite now does.

After the remount every file must hold at least what its last acknowledged fsync covered.
Under ``cut`` some trials lose the last acknowledged block (an fsync that straddled the
shutdown returned 0); under ``stop`` none may. Results: benchmarks/results/faults/README.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path

from tests.faults.cluster import (
    mount_loop_disk,
    remount_loop_disk,
    shutdown_filesystem,
    unmount,
    wait_stopped,
)

WRITERS = 4
BLOCK = 4096


def _writer(folder: Path, ack: int) -> None:
    lock = threading.Lock()

    def loop(i: int) -> None:
        fd = os.open(folder / f"f{i}", os.O_WRONLY | os.O_APPEND)
        size = 0
        while True:
            try:
                os.write(fd, b"x" * BLOCK)
                size += BLOCK
                os.fsync(fd)
            except OSError:
                time.sleep(3600)  # the disk is gone: acknowledge nothing more
            with lock:
                os.write(ack, f"{i} {size}\n".encode())

    for i in range(WRITERS):
        threading.Thread(target=loop, args=(i,), daemon=True).start()
    time.sleep(3600)


def trial(folder: Path, run_s: float, stop_first: bool) -> dict[int, tuple[int, int]]:
    """One power cut; the files that lost acknowledged bytes: {file: (acked, found)}."""
    mount_loop_disk(folder, 64 << 20)
    try:
        for i in range(WRITERS):
            (folder / f"f{i}").touch()
        os.sync()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _writer(folder, write)
            os._exit(0)
        os.close(write)
        time.sleep(run_s)
        if stop_first:
            os.kill(pid, signal.SIGSTOP)
            wait_stopped(pid)
        shutdown_filesystem(folder)
        if not stop_first:
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        acked: dict[int, int] = {}
        with os.fdopen(read) as answers:
            for line in answers:
                i, size = map(int, line.split())
                acked[i] = max(acked.get(i, 0), size)
        remount_loop_disk(folder)
        found = {i: (folder / f"f{i}").stat().st_size for i in acked}
        return {i: (a, found[i]) for i, a in acked.items() if found[i] < a}
    finally:
        unmount(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--mode", choices=("cut", "stop"), default="stop")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/tidegate-powercut-check"))
    args = parser.parse_args()
    losses = 0
    for k in range(args.trials):
        lost = trial(args.folder, 0.2 + (k % 7) * 0.05, args.mode == "stop")
        if lost:
            losses += 1
            print(f"trial {k}: acknowledged bytes gone {lost}", flush=True)
    print(f"mode {args.mode}: {losses} of {args.trials} trials lost acknowledged bytes")


if __name__ == "__main__":
    main()
