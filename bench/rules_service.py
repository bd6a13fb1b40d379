"""Rules in the service (issue 14 "Benchmark", service part): ingest-to-webhook latency with thousands of
statements registered, rule updates during ingest, no alert lost or duplicated across updates.

Starts ``lace serve`` (embedded defaults: SQLite, Delta archive, the rule index), registers the event type
``traffic`` and ``--rules`` statements generated from the Aarhus sensor metadata (:func:`bench.rules.aarhus_rules`:
per segment, speed bands relative to NDT_IN_KMH with ``vehicle_count > 0``), webhooks for ``--webhooks`` of them
(deliveries to a receiver in this process), then posts the Aarhus readings in ts order at ``--rate`` events/s for
``--seconds`` while another thread updates ``--updates-per-s`` statements per second (``PUT /queries/{id}`` with a
new band: a new version). Reported:

- registration: ``POST /queries`` latency p50/p99 with the rules already registered (insert-to-effect: the
  statement is live when the answer comes);
- update-to-effect: ``PUT /queries/{id}`` latency p50/p99 (the new version is live when the answer comes);
- ingest-to-webhook: delivery time at the receiver minus the time the batch holding the alert's event was posted,
  p50/p99/max, over the alerts of the webhooked statements;
- exactness: for the webhooked statements that were never updated, the alerts delivered equal the readings that
  satisfy the statement among those posted (computed here), and no (statement, event) is alerted twice.

    python -m bench.rules_service --rules 4490 --rate 5000 --seconds 30
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.rules import AARHUS, aarhus_rules
from bench.service import start_service
from cli.webhook_receiver import Receiver


def _lql(name: str, conds: list[tuple[str, str, object]]) -> str:
    where = " AND ".join(f"t.{a} {op} {v!r}" if not isinstance(v, str) else f"t.{a} {op} '{v}'" for a, op, v in conds)
    return f"NAME {name} PATTERN SEQ(traffic t) WHERE {where} RETURN t.key AS key, t.avg_speed AS speed"


def _holds(conds: list[tuple[str, str, object]], attrs: dict[str, Any]) -> bool:
    ops = {"=": lambda x, y: x == y, "<": lambda x, y: x < y, "<=": lambda x, y: x <= y,
           ">": lambda x, y: x > y, ">=": lambda x, y: x >= y}
    return all(ops[op](attrs[a], v) for a, op, v in conds)


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(p * len(xs)))], 1) if xs else float("nan")


def readings(n: int) -> list[tuple[int, dict[str, Any]]]:
    """The first ``n`` Aarhus readings in ts order: (ts_ms, attrs)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    cols = ["key", "ts_ms", "avg_speed", "vehicle_count"]
    t = pq.read_table(AARHUS / "aarhus_traffic_2014-08_09.parquet", columns=cols)
    t = t.take(pc.sort_indices(t, sort_keys=[("ts_ms", "ascending")])).slice(0, n).to_pydict()
    return [
        (ms, {"key": k, "avg_speed": s, "vehicle_count": c})
        for k, ms, s, c in zip(t["key"], t["ts_ms"], t["avg_speed"], t["vehicle_count"])
    ]


def _update(base_url: str, auth: dict[str, str], rules: list[Any], ids: list[int], per_s: float,
            stop: Any, results: Any) -> None:
    """Update a random statement ``per_s`` times a second (a new speed band: a new version) until ``stop``;
    puts (PUT times in ms, indexes of the updated statements) on ``results``."""
    gc.freeze()  # the heap forked from the benchmark is not this client's: its collections would be timed
    rng = random.Random(11)
    upd_ms: list[float] = []
    updated: set[int] = set()
    with httpx.Client(base_url=base_url, headers=auth, timeout=120) as u:
        while not stop.is_set():
            i = rng.randrange(len(rules))
            conds = [(a, op, (v + 1 if op == "<" and isinstance(v, (int, float)) and a == "avg_speed" else v))
                     for a, op, v in rules[i]]
            started = time.perf_counter()
            r = u.put(f"/queries/{ids[i]}", json={"text": _lql(f"r{i}", conds)})
            upd_ms.append((time.perf_counter() - started) * 1000)
            assert r.status_code == 200, r.text
            updated.add(i)
            stop.wait(1 / per_s)
    results.put((upd_ms, updated))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", type=int, default=4490)
    ap.add_argument("--webhooks", type=int, default=200)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--updates-per-s", type=float, default=10)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--service-env", action="append", default=[], metavar="LACE_X=V",
                    help="a setting for the service (repeatable), e.g. LACE_GC_THAW_S=0 for CPython's GC as is")
    args = ap.parse_args(argv)

    rules = aarhus_rules(args.rules)
    n_events = int(args.rate * args.seconds)
    data = readings(n_events)
    gc.freeze()  # the readings and rules live to the end: the posting loop is not paused walking them
    rng = random.Random(7)
    out: dict[str, Any] = {"rules": len(rules), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                           "service_env": args.service_env}
    rx = Receiver()
    rx.start()
    with tempfile.TemporaryDirectory() as tmp:
        svc = start_service(Path(tmp), args.service_env)
        try:
            auth = {"Authorization": f"Bearer {svc.admin}"}
            with httpx.Client(base_url=svc.base, headers=auth, timeout=120) as c:
                r = c.post("/event-types", json={"name": "traffic", "attributes": {
                    "key": "string", "avg_speed": "int", "vehicle_count": "int"}})
                assert r.status_code == 201, r.text
                ids: list[int] = []
                reg_ms: list[float] = []
                t_reg = time.perf_counter()
                for i, conds in enumerate(rules):
                    started = time.perf_counter()
                    r = c.post("/queries", json={"text": _lql(f"r{i}", conds)})
                    reg_ms.append((time.perf_counter() - started) * 1000)
                    assert r.status_code == 201, r.text
                    ids.append(r.json()["id"])
                out["register_s"] = round(time.perf_counter() - t_reg, 1)
                out["register_ms"] = {"p50": _pct(reg_ms, 0.5), "p99": _pct(reg_ms, 0.99)}
                # webhooks on the statements whose segment sends the most readings (so that they alert)
                watched = rng.sample(range(len(rules)), min(args.webhooks, len(rules)))
                for i in watched:
                    r = c.post("/webhooks", json={"query_id": ids[i], "url": rx.url})
                    assert r.status_code == 201, r.text
                print(f"{len(rules)} statements registered in {out['register_s']} s; posting ...", flush=True)
                # the updater is a process of its own: its PUT times are not its GIL shared with the posting loop
                ctx = multiprocessing.get_context("fork")
                stop = ctx.Event()
                results = ctx.Queue()
                updater = ctx.Process(target=_update, daemon=True, args=(
                    str(c.base_url), auth, rules, ids, args.updates_per_s, stop, results))
                sent: list[tuple[int, int, float]] = []
                start = time.perf_counter()
                lag = []
                updater.start()
                for b in range(0, len(data), args.batch):
                    due = start + b / args.rate
                    now = time.perf_counter()
                    if due > now:
                        time.sleep(due - now)
                    lag.append(time.perf_counter() - due)
                    chunk = data[b : b + args.batch]
                    body = b"\n".join(
                        orjson.dumps({"id": b + k + 1, "type": "traffic", "ts": ms, "attrs": a})
                        for k, (ms, a) in enumerate(chunk)
                    )
                    posted = time.time()
                    r = c.post("/events", content=body, headers={"content-type": "application/x-ndjson"})
                    assert r.status_code == 200, r.text[:300]
                    sent.append((b + 1, b + len(chunk), posted))
                stop.set()
                upd_ms, updated = results.get(timeout=120)
                updater.join(30)
                wall = time.perf_counter() - start
                # expected alerts of the watched statements never updated
                steady = [i for i in watched if i not in updated]
                expected = {(ids[i], k + 1) for i in steady for k, (_, a) in enumerate(data) if _holds(rules[i], a)}
                deadline = time.time() + 60
                qname = {ids[i]: i for i in watched}
                while time.time() < deadline:
                    got = [json.loads(x["body"]) for x in rx.ok()]
                    have = {(d["query_id"], d["events"]["t"][0]) for d in got}
                    if expected <= have:
                        break
                    time.sleep(0.5)
                got = [(json.loads(x["body"]), x["at"]) for x in rx.ok()]
                pairs = [(d["query_id"], d["events"]["t"][0]) for d, _ in got]
                lat = []
                for d, at in got:
                    eid = d["events"]["t"][0]
                    for first, last, posted in sent:
                        if first <= eid <= last:
                            lat.append((at - posted) * 1000)
                            break
                steady_got = {p for p in pairs if qname.get(p[0]) in set(steady)}
                out.update(
                    events=len(data),
                    ingest_wall_s=round(wall, 1),
                    ingest_events_per_s=round(len(data) / wall),
                    client_behind_schedule_max_ms=round(max(lag) * 1000, 1),
                    updates=len(upd_ms),
                    update_ms={"p50": _pct(upd_ms, 0.5), "p99": _pct(upd_ms, 0.99)},
                    alerts=len(pairs),
                    duplicates=len(pairs) - len(set(pairs)),
                    steady_statements=len(steady),
                    steady_expected=len(expected),
                    steady_lost=len(expected - steady_got),
                    steady_extra=len(steady_got - expected),
                    latency_ms={"p50": _pct(lat, 0.5), "p99": _pct(lat, 0.99), "max": _pct(lat, 1.0)},
                    load_avg=os.getloadavg(),
                )
        finally:
            svc.stop(timeout_s=30)
            rx.stop()
    print(json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
