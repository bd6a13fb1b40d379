"""The machine's speed, printed by ``.ci/run`` before and after the tests, so a slow CI run can be told from slower
code: a Python loop (CPU), ``stat`` calls (system calls) and small ``write`` + ``fsync`` pairs (the disk's sync
path, which the archive's WAL and the databases' commits take). One line; only the standard library.

The loop alone missed a slow day (session 20): it read 0.44-0.47 s, quiet, while the kernel took ~31 % of the CPU
and everything making system calls ran 2-3x slower. Quiet readings on this kind of machine: docs/benchmarks.md,
"CI's speed probe".
"""
from __future__ import annotations

import os
import tempfile
import time


def main() -> None:
    """Print ``10M-iteration loop S s, 200k stat S s, 500 write+fsync S s`` (wall seconds)."""
    t = time.perf_counter()
    for _ in range(10_000_000):
        pass
    loop = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(200_000):
        os.stat("/")
    stat = time.perf_counter() - t
    fd, path = tempfile.mkstemp(prefix="lace-probe-")
    try:
        t = time.perf_counter()
        for _ in range(500):
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
        fsync = time.perf_counter() - t
    finally:
        os.close(fd)
        os.unlink(path)
    print(f"10M-iteration loop {loop:.2f} s, 200k stat {stat:.2f} s, 500 write+fsync {fsync:.2f} s")


if __name__ == "__main__":
    main()
