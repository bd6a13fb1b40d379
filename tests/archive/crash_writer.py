"""Child process of test_crash.py: append events forever, printing ``ack <first id> <last id>`` after each append.

Usage: ``python -m tests.archive.crash_writer ROOT SEED`` (run from the repository root). The
parent SIGKILLs it at a random moment; a printed ack means the append had returned.
"""
from __future__ import annotations

import random
import sys

from archive.writer import ArchiveWriter
from tests.archive.archive_data import PARKING, TRAFFIC, make_events


def main() -> None:
    root, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    writer = ArchiveWriter(root, types=[TRAFFIC, PARKING], flush_rows=500, flush_age_s=0.05)
    writer.start(tick_s=0.01)  # age flushes race with appends, as in the service
    next_id = 1 + 1_000_000 * seed
    while True:
        n = rng.randrange(1, 120)
        events = make_events(n, seed=rng.randrange(1 << 30), first_id=next_id)
        writer.append(events)
        print(f"ack {next_id} {next_id + n - 1}", flush=True)
        next_id += n


if __name__ == "__main__":
    main()
