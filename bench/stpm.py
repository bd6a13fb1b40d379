"""TPM vs STPM: experiments 5 and 6 of 001_e24f905c15fdf08b.txt (section 6), plus the Aarhus table.

The generator follows the paper's set-up (Table 2): ``N_E`` event types of which A, B, C, D
form the discrete pattern ``SEQ(A a, B b, C c, D d)`` (RFID-style: an object passes readers
A, B, C and D); ``M_Ratio`` is the fraction of objects whose A is followed by the whole
sequence (the others stop after A: their partial matches wait in vain until the window
closes); ``p(B | A, Δt)`` is how likely the next reader follows within ``Δt``; ``N_S`` is the
stream length. The partial-match buffer is 10% of the unbounded run's peak partial matches.
Besides TPM and STPM every table has an offline reference, :class:`Farthest` (spill the unit
needed farthest in the future, read off the stream): how low misses can go at that budget.

    python -m bench.stpm                       # SQLite store, M_Ratio 0.1..1 at N_S 50k, N_S 10k..100k
    python -m bench.stpm --store postgresql+psycopg://postgres@127.0.0.1:5432/test
    python -m bench.stpm --aarhus              # + the congestion query over the whole Aarhus table
    python -m bench.stpm --overhead            # CPU with a buffer that never fills vs no buffer
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python -m bench.stpm --one stpm --n 20000 --capacity 14133   # instructions, one configuration

Writes tables (Markdown) to stdout and PNG plots to ``docs/img/``.
"""
from __future__ import annotations

import argparse
import bisect
import gc
import itertools
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from engine.compiler import compile_query
from engine.events import Event
from engine.matcher import Matcher
from engine.pm.policy import _Ranked

QUERY = "PATTERN SEQ(A a, B b, C c, D d) PARTITION BY key STRATEGY {strategy} WITHIN {w} s"
IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def generate(n: int, m_ratio: float, n_types: int = 8, p_next: float = 0.9, gap_ab_s: float = 2.0,
             gap_s: float = 60.0, cycles_per_s: float = 20.0, n_keys: int | None = None, zipf_s: float = 0.0,
             seed: int = 7) -> list[Event]:
    """The paper's discrete-pattern stream (Table 2 parameters), sorted by ts; ids in ts order.

    Objects (RFID tags, the partition key) pass the readers A, B, C, D at ``cycles_per_s``
    passes per second. ``n_keys=None`` (the default): every pass is a new object, as in 001's
    RFID example (section 5: objects that pass readers A, B, C and D), so an object's partial
    matches that wait in vain are never needed again. ``n_keys=N``: N objects pass again and
    again; which one starts the next pass is drawn with Zipf weights (exponent ``zipf_s``), and
    a later pass's B can extend an earlier pass's A (skip_till_any_match). A pass emits A, and with
    probability ``m_ratio`` (M_Ratio) goes on to B within ``gap_ab_s`` with probability ``p_next``
    (``p(B | A, Δt)``; up to 10 times later otherwise), then to C and D, each after a uniform gap
    in ``(0, 2 * gap_s)`` (the discrete pattern: sub-events spread far apart). Events of the
    ``n_types - 4`` other types, on random objects, make up about a quarter of the stream
    (N_E = ``n_types``).
    """
    rng = random.Random(seed)
    noise_types = [chr(ord("E") + i) for i in range(max(0, n_types - 4))]
    cum = list(itertools.accumulate(1.0 / (k ** zipf_s) for k in range(1, (n_keys or 1) + 1)))
    keys = list(range(1, (n_keys or 1) + 1))
    passes = 0
    rows: list[tuple[float, str, int]] = []
    t = 0.0
    while len(rows) < n:
        t += rng.expovariate(cycles_per_s)
        passes += 1
        key = rng.choices(keys, cum_weights=cum)[0] if n_keys else passes  # same draws as weights=, O(log n)
        rows.append((t, "A", key))
        if rng.random() < m_ratio:
            s = t + (rng.uniform(0, gap_ab_s) if rng.random() < p_next else rng.uniform(gap_ab_s, 10 * gap_ab_s))
            rows.append((s, "B", key))
            for typ in "CD":
                s += rng.uniform(0, 2 * gap_s)
                rows.append((s, typ, key))
        if noise_types and rng.random() < 0.33:
            rows.append((t + rng.uniform(0, gap_s), rng.choice(noise_types), rng.choice(keys)))
    rows.sort()
    return [Event(i, typ, int(ts * 1_000_000), {"key": k}) for i, (ts, typ, k) in enumerate(rows[:n], start=1)]


STRATEGY = "skip_till_any_match"


class Farthest(_Ranked):
    """Offline reference policy (not in the engine): spill the unit needed farthest in the future.

    Belady's rule with the future read off the stream: a unit's priority is minus the ts of
    the next event of its key that reads partial matches (B, C or D of ``SEQ(A, B, C, D)``);
    a unit never needed again is spilled first. Units differ in size, so this is a reference
    for what knowing the future buys, not a proven optimum.
    """

    name = "farthest"

    def __init__(self, events: list[Event], reading: frozenset[str] = frozenset("BCD")) -> None:
        super().__init__()
        self.needs: dict[object, list[int]] = {}
        for e in events:
            if e.type in reading:
                self.needs.setdefault(e.attrs["key"], []).append(e.ts)

    def touch(self, unit, t_us: int, weight_us: float, created_us: int) -> None:
        needs = self.needs.get(unit[1], ())
        i = bisect.bisect_right(needs, t_us)
        self._set(unit, -needs[i] if i < len(needs) else float("-inf"))


def run(events: list[Event], window_s: float, **kw) -> dict:
    q = compile_query(QUERY.format(w=window_s, strategy=STRATEGY))
    policy = kw.pop("policy_object", None)
    m = Matcher(q, storage="runs", **kw)
    if policy is not None:
        assert m.pmb is not None and not m.pmb.learn
        m.pmb.policy = policy
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    keys = []
    for e in events:
        keys.extend(x.key() for x in m.push(e))
    keys.extend(x.key() for x in m.flush())
    s = m.stats()
    return {"cpu_s": round(time.process_time() - c0, 4), "wall_s": round(time.perf_counter() - t0, 3),
            "matches": len(keys), "result": sorted(map(sorted, keys)), **{k: s.get(k, 0) for k in (
                "peak_live", "spilled", "reloaded", "misses", "hits", "expired")}}


def compare(events: list[Event], window_s: float, store_url: str | None, fraction: float = 0.10) -> dict:
    """Unbounded run, then TPM and STPM with the buffer at ``fraction`` of the peak."""
    base = run(events, window_s)
    capacity = max(1, int(base["peak_live"] * fraction))
    out = {"n": len(events), "peak_live": base["peak_live"], "capacity": capacity, "matches": base["matches"],
           "none_cpu_s": base["cpu_s"]}
    for policy in ("tpm", "stpm", "farthest"):
        store = _store(store_url if policy != "farthest" else "memory")
        extra = {"pm_policy": "tpm", "policy_object": Farthest(events)} if policy == "farthest" else {
            "pm_policy": policy}
        r = run(events, window_s, pm_capacity=capacity, pm_store=store, **extra)
        assert r["result"] == base["result"], f"{policy} changed the results"
        out[policy] = {k: r[k] for k in ("cpu_s", "wall_s", "misses", "spilled", "reloaded")}
    return out


def _store(url: str | None):
    from service.db.pm_store import SqlPartialMatchStore

    if url == "memory":
        from engine.pm.store import MemoryStore

        return MemoryStore()
    if url is None:
        url = f"sqlite:///{tempfile.mkdtemp(prefix='lace-stpm-')}/pms.sqlite"
    return SqlPartialMatchStore(url)


def overhead(n: int = 100_000, repeat: int = 10) -> dict:
    """CPU of a buffer that never fills against no buffer (best of ``repeat``, interleaved).

    Two capacities that never fill: 10^9, and the unbounded run's peak + 1 (the buffer is
    near full for most of the stream). The configurations run in turn, in an order rotated
    every repetition, so that load from other processes hits them alike; CPU seconds
    (``time.process_time``), not wall time.
    """
    events = generate(n, 0.5)
    peak = run(events, 600)["peak_live"]
    configs = {"none": {}}
    for cap, tag in ((10**9, "1e9"), (peak + 1, "peak+1")):
        for policy in ("tpm", "stpm"):
            configs[f"{policy}@{tag}"] = {"pm_capacity": cap, "pm_policy": policy}
    best = {name: float("inf") for name in configs}
    names = list(configs)
    for i in range(repeat):
        for name in names[i % len(names):] + names[:i % len(names)]:  # rotated: no config always runs first
            r = run(events, 600, **configs[name])
            assert r["spilled"] == 0, f"{name} spilled"
            best[name] = min(best[name], r["cpu_s"])
    return {"n": n, "peak_live": peak, "repeat": repeat, "cpu_s": best,
            "overhead": {k: f"{v / best['none'] - 1:+.1%}" for k, v in best.items() if k != "none"}}


def aarhus(store_url: str | None, fraction: float = 0.01) -> dict:
    """The congestion query of bench/engine.py over the whole Aarhus table, buffer at 1% of the peak."""
    from bench.engine import CONGESTION, aarhus_events

    events = list(aarhus_events())
    q = compile_query(CONGESTION)
    base = Matcher(q)
    n_base = sum(len(base.push(e)) for e in events) + len(base.flush())
    peak = base.stats()["peak_live"]
    capacity = max(1, int(peak * fraction))
    out = {"n": len(events), "matches": n_base, "peak_live": peak, "capacity": capacity}
    for policy in ("tpm", "stpm"):
        m = Matcher(q, pm_capacity=capacity, pm_policy=policy, pm_store=_store(store_url))
        c0 = time.process_time()
        n = sum(len(m.push(e)) for e in events) + len(m.flush())
        assert n == n_base, f"{policy} changed the number of matches"
        s = m.stats()
        out[policy] = {"cpu_s": round(time.process_time() - c0, 1), "misses": s["misses"], "spilled": s["spilled"]}
    return out


def _plot(rows: list[dict], x: str, title: str, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = [r[x] for r in rows]
    for policy, style in (("tpm", "o-"), ("stpm", "s-")):
        ax1.plot(xs, [r[policy]["cpu_s"] for r in rows], style, label=policy.upper())
        ax2.plot(xs, [r[policy]["misses"] for r in rows], style, label=policy.upper())
    ax2.plot(xs, [r["farthest"]["misses"] for r in rows], "k:", label="farthest (offline)")
    ax1.set_xlabel(x)
    ax1.set_ylabel("CPU s")
    ax2.set_xlabel(x)
    ax2.set_ylabel("misses")
    ax2.set_yscale("symlog")
    for ax in (ax1, ax2):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(IMG / name, dpi=110)
    plt.close(fig)


def _table(rows: list[dict], x: str) -> str:
    lines = [f"| {x} | peak PMs | capacity | matches | TPM CPU s | STPM CPU s | TPM misses | STPM misses | STPM/TPM "
             "| farthest misses | farthest/TPM |", "| --- " * 11 + "|"]
    for r in rows:
        tpm = r["tpm"]["misses"]
        ratio, far = (r["stpm"]["misses"] / tpm, r["farthest"]["misses"] / tpm) if tpm else (0.0, 0.0)
        lines.append(f"| {r[x]} | {r['peak_live']:,} | {r['capacity']:,} | {r['matches']:,} | "
                     f"{r['tpm']['cpu_s']:.2f} | {r['stpm']['cpu_s']:.2f} | {tpm:,} | {r['stpm']['misses']:,} | "
                     f"{ratio:.3f} | {r['farthest']['misses']:,} | {far:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default=None,
                    help="SQLAlchemy URL of the partial-match store (default: a SQLite file; 'memory': in-process)")
    ap.add_argument("--window", type=float, default=600.0, help="WITHIN, seconds")
    ap.add_argument("--n", type=int, default=50_000, help="N_S for the M_Ratio sweep")
    ap.add_argument("--ratios", default="0.1,0.25,0.5,0.75,1.0")
    ap.add_argument("--sizes", default="10000,25000,50000,100000", help="N_S sweep; with --aarhus, 0 runs only Aarhus")
    ap.add_argument("--aarhus", action="store_true")
    ap.add_argument("--overhead", action="store_true")
    ap.add_argument("--one", choices=["gen", "none", "tpm", "stpm"],
                    help="generate --n events (M_Ratio 0.5) and run one configuration once, capacity --capacity: "
                         "for counting instructions under valgrind (gen: generate and compile only, the baseline)")
    ap.add_argument("--capacity", type=int, default=10**9)
    ap.add_argument("--tag", default="sqlite", help="suffix of the PNG names")
    ap.add_argument("--strategy", default=STRATEGY, help="selection strategy of the SEQ(A, B, C, D) query")
    ap.add_argument("--budget", type=float, default=0.10, help="buffer capacity as a fraction of the peak")
    ap.add_argument("--keys", type=int, default=None,
                    help="objects that pass again and again (default: a new object per pass)")
    a = ap.parse_args(argv)
    globals()["STRATEGY"] = a.strategy
    if a.overhead:
        print(json.dumps(overhead()))
        return 0
    if a.one:
        events = generate(a.n, 0.5)
        q = compile_query(QUERY.format(w=a.window, strategy=STRATEGY))
        if a.one != "gen":  # the matcher alone: no result collection
            kw = {"pm_capacity": a.capacity, "pm_policy": a.one} if a.one != "none" else {}
            m = Matcher(q, storage="runs", **kw)
            n = sum(len(m.push(e)) for e in events) + len(m.flush())
            print(json.dumps({"matches": n, **{k: m.stats().get(k, 0) for k in ("peak_live", "spilled")}}))
        return 0
    if a.aarhus and a.sizes == "0":
        print(json.dumps(aarhus(a.store)))
        return 0
    by_ratio = []
    for ratio in (float(x) for x in a.ratios.split(",") if x):
        r = compare(generate(a.n, ratio, n_keys=a.keys), a.window, a.store, a.budget)
        r["M_Ratio"] = ratio
        by_ratio.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    by_size = []
    for n in (int(x) for x in a.sizes.split(",") if x):
        r = compare(generate(n, 0.5, n_keys=a.keys), a.window, a.store, a.budget)
        r["N_S"] = n
        by_size.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    pct = f"{a.budget:.0%}"
    if by_ratio:
        print(f"### Experiment 6a: M_Ratio sweep (N_S = {a.n:,}, buffer = {pct} of peak, store {a.tag})\n")
        print(_table(by_ratio, "M_Ratio"))
        _plot(by_ratio, "M_Ratio", f"TPM vs STPM, N_S={a.n:,}, buffer {pct} of peak ({a.tag})",
              f"stpm_mratio_{a.tag}.png")
    if by_size:
        print(f"\n### Experiment 5/6b: N_S sweep (M_Ratio = 0.5, buffer = {pct} of peak, store {a.tag})\n")
        print(_table(by_size, "N_S"))
        _plot(by_size, "N_S", f"TPM vs STPM, M_Ratio=0.5, buffer {pct} of peak ({a.tag})", f"stpm_ns_{a.tag}.png")
    if a.aarhus:
        print("\n### Aarhus congestion query, buffer = 1% of peak\n")
        print(json.dumps(aarhus(a.store)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
