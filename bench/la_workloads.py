"""Workloads of bench/live_archived.py: streams with 001's Table 2 parameters, the Aarhus slice, the queries."""
from __future__ import annotations

import random
from pathlib import Path

from bench.stpm import generate as rfid_stream
from engine.events import Event

ROOT = Path(__file__).resolve().parents[1]
S = 1_000_000

RFID = """NAME passed_again
LIVE     PATTERN SEQ(C c, D d) WHERE c.key <= {live_keys} PARTITION BY key STRATEGY skip_till_next_match WITHIN 4 min
ARCHIVED PATTERN SEQ(A a, B b) PARTITION BY key STRATEGY skip_till_next_match WITHIN 1 min
LOOKBACK {lookback_s} s
JOIN     c.key = a.key"""
SEL = """NAME sel
LIVE     PATTERN SEQ(T l) PARTITION BY key
ARCHIVED PATTERN SEQ(T a) WHERE a.v < {theta} PARTITION BY key
LOOKBACK 60 s
JOIN     l.key = a.key"""
AARHUS = """NAME congested_same_hour
LIVE     PATTERN SEQ(traffic a, traffic b)
         WHERE a.vehicle_count > 0 AND a.avg_speed < 0.5 * a.ndt_kmh
           AND b.vehicle_count > 0 AND b.avg_speed < 0.5 * b.ndt_kmh
         PARTITION BY key STRATEGY partition_contiguity WITHIN 10 min
ARCHIVED PATTERN SEQ(traffic c) WHERE c.vehicle_count > 0 AND c.avg_speed < 0.5 * c.ndt_kmh
         PARTITION BY key
LOOKBACK 7 days
JOIN     a.key = c.key AND a.hour = c.hour
RETURN   a.key AS segment, a.ts AS now, c.ts AS before"""


def rfid(n: int, m_ratio: float, n_keys: int = 500, seed: int = 7) -> list[Event]:
    """``N_S = n`` events of the RFID stream (N_E = 8, p(B | A, Δt) = 0.9, 20 passes/s)."""
    return rfid_stream(n, m_ratio, n_keys=n_keys, seed=seed)


def sel_stream(n: int, n_keys: int = 100, rate_per_s: float = 10.0, seed: int = 3) -> list[Event]:
    """``n`` readings ``T(key, v)``, ``v`` uniform in [0, 1), at ``rate_per_s``."""
    rng = random.Random(seed)
    step = int(S / rate_per_s)
    return [Event(i, "T", i * step, {"key": rng.randrange(n_keys), "v": rng.random()}) for i in range(1, n + 1)]


def aarhus() -> list[Event]:
    """The bundled Aarhus slice with ``hour`` (UTC hour of day) added, in (ts, id) order."""
    from engine.io import read_events

    events = []
    for e in read_events(ROOT / "cli" / "demo_data" / "traffic_slice.csv"):
        e.attrs["hour"] = (e.ts // 3_600_000_000) % 24
        events.append(e)
    events.sort(key=Event.order_key)
    return events
