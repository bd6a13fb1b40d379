"""SIGKILL the writer process mid-stream: after a restart nothing acknowledged is lost and nothing is duplicated."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from archive.writer import ArchiveWriter
from tests.archive.archive_data import read_ids

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MAX_APPEND = 120  # crash_writer appends at most this many events at a time


def run_and_kill(root, repo_root, *, seed: int, acks_before_kill: int) -> tuple[set[int], int]:
    """Start a writer process, let it acknowledge ``acks_before_kill`` appends, SIGKILL it.

    Returns the acknowledged ids and the last of them.
    """
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.archive.crash_writer", str(root), str(seed)],
        cwd=repo_root,
        env={**os.environ, "PYTHONPATH": str(repo_root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked: set[int] = set()
    last = 0
    deadline = time.monotonic() + 60
    try:
        for _ in range(acks_before_kill):
            line = child.stdout.readline()
            if not line:
                pytest.fail(f"writer exited early: {child.stderr.read()[-2000:]}")
            _, lo, hi = line.split()
            acked.update(range(int(lo), int(hi) + 1))
            last = int(hi)
            if time.monotonic() > deadline:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        child.stderr.close()
    return acked, last


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_mid_stream_loses_nothing_acknowledged_and_duplicates_nothing(tmp_path, repo_root, seed):
    root = tmp_path / "archive"
    rng = random.Random(seed)
    acked: set[int] = set()
    in_flight_max = []
    # Two crashes in a row: the second writer starts by replaying the first one's WAL, then dies too.
    for round_no in range(2):
        got, last = run_and_kill(root, repo_root, seed=10 * seed + round_no, acks_before_kill=rng.randrange(20, 80))
        acked |= got
        in_flight_max.append(last)
    with ArchiveWriter(root):  # replays the WAL, commits what is missing exactly once
        pass
    ids = read_ids(root, "traffic") + read_ids(root, "parking")
    assert len(ids) == len(set(ids)), "an event was archived twice"
    assert acked <= set(ids), f"{len(acked - set(ids))} acknowledged events were lost"
    # Beyond the acknowledged events only the append in flight at each kill may have reached the WAL.
    assert set(ids) - acked <= {i for last in in_flight_max for i in range(last + 1, last + MAX_APPEND)}
    assert not list((root / "_lace" / "wal").glob("*.wal"))
