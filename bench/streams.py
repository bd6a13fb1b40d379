"""The peer-benchmark stream as LACE events (bench/README: ``type,key,ts,price``).

``generate_events`` builds events in memory from ``bench/gen_stream.py`` (the shared,
byte-for-byte generator); ``bench_csv`` writes the same stream as CSV once and reuses it
from a cache directory. Both give id = 1-based index, ts in int microseconds UTC.

Run ``python -m bench.streams --n 100000`` to write (or reuse) a cached stream and time loading it.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bench import gen_stream
from engine.events import MICROS_PER_MS, Event
from engine.io import load_bench_stream

DEFAULT_CACHE_DIR = Path(__file__).resolve().parent / ".cache"


def generate_events(n: int, types: int = 3, keys: int = 100, rate: float = 1000, seed: int = 42) -> list[Event]:
    """The seed's stream as events.

    Parameters
    ----------
    n : int
        Number of events.
    types : int
        Event types ``A, B, C, ...`` (A/B/C are the pattern types, the rest noise).
    keys : int
        Distinct values of the ``key`` attribute, ``0 .. keys-1``.
    rate : float
        Mean events per second of event time.
    seed : int
        Random seed; the README's counts are for seed 42.

    Returns
    -------
    list[Event]
        id = 1-based index, type = the letter, ts = event time in int microseconds
        (strictly increasing), attrs ``{"key": int, "price": float}``.

    Examples
    --------
    >>> [(e.id, e.type, e.ts) for e in generate_events(2)]
    [(1, 'A', 1000), (2, 'A', 2000)]
    """
    return [
        Event(i, t, ts_ms * MICROS_PER_MS, {"key": k, "price": p})
        for i, (t, k, ts_ms, p) in enumerate(gen_stream.generate(n, types, keys, rate, seed), start=1)
    ]


def climb_events(n: int = 60_000, keys: int = 100, seed: int = 42) -> list[Event]:
    """The synthetic "climb" stream of issue 17: readings that rise for minutes.

    ``keys`` keys (``key`` = "k0" .. "k99"), one event of type ``E`` per key per second, in ts order
    (key k at second s has ts ``s * 1_000_000 + k`` microseconds, id = 1-based index); each key's ``x``
    starts at 0 and rises every second by a Gaussian step of mean 0.5 and standard deviation 0.2
    (``random.Random(seed)``), so a step is negative about once in 160 seconds and climbs last minutes.
    """
    import random

    rng = random.Random(seed)
    x = [0.0] * keys
    names = [f"k{k}" for k in range(keys)]
    out = []
    for i in range(n):
        k = i % keys
        x[k] += rng.gauss(0.5, 0.2)
        out.append(Event(i + 1, "E", (i // keys) * 1_000_000 + k, {"key": names[k], "x": x[k]}))
    return out


def bench_csv(
    n: int, types: int = 3, keys: int = 100, rate: float = 1000, seed: int = 42, cache_dir: Path | None = None
) -> Path:
    """Path of the stream's CSV (exactly ``gen_stream.py``'s bytes), written on first use.

    The cache directory is ``$LACE_BENCH_CACHE`` or ``bench/.cache`` (git-ignored).
    """
    directory = cache_dir or Path(os.environ.get("LACE_BENCH_CACHE", DEFAULT_CACHE_DIR))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"s{n}_t{types}_k{keys}_r{rate:g}_s{seed}.csv"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        args = ["--n", str(n), "--types", str(types), "--keys", str(keys), "--rate", str(rate), "--seed", str(seed)]
        gen_stream.main([*args, "--out", str(tmp)])
        tmp.replace(path)  # atomic: a half-written file is never reused
    return path


def main(argv: list[str] | None = None) -> None:
    """Write (or reuse) a cached stream and report how fast it loads."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--types", type=int, default=3)
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args(argv)
    path = bench_csv(a.n, a.types, a.keys, a.rate, a.seed)
    start = time.perf_counter()
    events = load_bench_stream(path)
    elapsed = time.perf_counter() - start
    print(f"{path}: {len(events):,} events loaded in {elapsed:.2f} s ({len(events) / elapsed:,.0f} events/s)")
    print("no query benchmarks yet: bench/run.py will run P1-P4 (bench/README.md)")


if __name__ == "__main__":
    main()
