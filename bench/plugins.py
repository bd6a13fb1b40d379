"""Plug-ins (issue 16), bench (e): the alarm de-duplication operator against the built-in Kleene closure it
replaces (004 section 3.1.4, Example 1), and a function call against a precomputed attribute.

004's Example 1: repeated alarms used to be grouped with a Kleene closure over consecutive identical alarms,
which can only report a group once it is over; the de-duplication operator (``dedup``, its Kleene closure
with a changed accept function Q) alerts at the first alarm and absorbs the repeats for a period. The two
do not give the same results (that is the point of the operator), so the table gives both counts; the
target is the time: the operator at most 1.2x the Kleene closure's.

Stream: ``--n`` alarms of ``--keys`` keys (uniform), gaps uniform in [1, 2000] ms (seed 42); period 60 s.

- ``dedup``:  ``PATTERN dedup(alarm, 60 s) d PARTITION BY key``
- ``kleene``: ``PATTERN alarm+ r[] PARTITION BY key STRATEGY skip_till_next_match WITHIN 60 s``
  (the built-in Kleene closure over the repeats of a key)
- ``hour_fn`` vs ``hour_attr``: ``WHERE hour_of_day(a.ts) = 7`` against ``WHERE a.hour = 7`` with ``hour``
  precomputed in the events (what ``lace demo`` did before hour_of_day existed).

    python -m bench.plugins [--n 200000] [--keys 50] [--repeat 5]

Times are the best of ``--repeat`` runs, the variants interleaved (one run of each per round), matching only
(events built beforehand). Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import time

from engine.detector import compile, make_detector
from engine.events import Event

QUERIES = {
    "dedup": "PATTERN dedup(alarm, 60 s) d PARTITION BY key",
    "kleene": "PATTERN alarm+ r[] PARTITION BY key STRATEGY skip_till_next_match WITHIN 60 s",
    "hour_fn": "PATTERN alarm a WHERE hour_of_day(a.ts) = 7",
    "hour_attr": "PATTERN alarm a WHERE a.hour = 7",
}


def alarms(n: int, keys: int, seed: int = 42) -> list[Event]:
    """``n`` alarm events: ``key`` uniform in ``0 .. keys-1``, gaps uniform in [1, 2000] ms, ``hour`` precomputed."""
    rng = random.Random(seed)
    out, ts = [], 0
    for i in range(1, n + 1):
        ts += rng.randint(1, 2000) * 1_000
        out.append(Event(i, "alarm", ts, {"key": rng.randrange(keys), "hour": (ts // 3_600_000_000) % 24}))
    return out


def run_once(text: str, events: list[Event]) -> tuple[float, int]:
    """(seconds, results) of one run of ``text`` over ``events``."""
    detector = make_detector(compile(text))
    push = detector.push
    gc.collect()
    start = time.perf_counter()
    n = 0
    for e in events:
        found = push(e)
        if found:
            n += len(found)
    n += len(detector.flush())
    return time.perf_counter() - start, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    events = alarms(args.n, args.keys)
    best: dict[str, float] = {}
    results: dict[str, int] = {}
    for _ in range(args.repeat):
        for name, text in QUERIES.items():
            dt, n = run_once(text, events)
            best[name] = min(best.get(name, dt), dt)
            results[name] = n
    print(f"n={args.n} keys={args.keys} repeat={args.repeat} load average {os.getloadavg()[0]:.2f}\n")
    print("| variant | results | best s | events/s | vs baseline |")
    print("|---|---|---|---|---|")
    for name, base in (("dedup", "kleene"), ("kleene", "kleene"), ("hour_fn", "hour_attr"), ("hour_attr", "hour_attr")):
        print(f"| {name} | {results[name]:,} | {best[name]:.3f} | {args.n / best[name]:,.0f} | "
              f"{best[name] / best[base]:.2f}x {base} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
