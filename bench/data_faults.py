"""Data faults against a real ``lace serve`` (SQLite) and a real receiver: the "Reliability" rows of
docs/benchmarks.md for issue 13's failures 1, 2, 5 and 7 (bench/webhook_faults.py has the webhook ones).

Each fault posts a stream of ``Stock`` events (one query: a price drop of a symbol between consecutive
events, ``partition_contiguity``), with the fault in the middle, then counts: events posted and
acknowledged (``accepted`` + ``duplicates``), events archived (rows in the Delta table after a flush),
alerts expected (the engine's matcher over the acknowledged events, taken once), alerts delivered
(distinct idempotency keys at the receiver), duplicates (deliveries beyond one per key), dead letters.

* ``far-future``: one event at 9999-12-31 in the middle of the stream (it used to make every later event late).
* ``year-one``: the first events of an empty stream at 0001-01-01 (the archive flush used to fail forever).
* ``out-of-step``: a second stream four days behind the first (it used to be rejected as late).
* ``retry``: every request posted twice, as a producer retrying after lost answers (it used to be taken twice).
* ``huge-query``: a query of 3,500 components and one with ``WITHIN 1e30 days`` registered first (accepted before).
* ``exploding-query``: beside the alerting query, a Kleene closure under ``skip_till_any_match`` that doubles its
  runs with every event (it used to hold the ingest lock for minutes); reports the slowest request's wall time.

    python -m bench.data_faults
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from cli.service_process import Database, make_service, unique, wait_until
from cli.webhook_receiver import Receiver
from engine.detector import compile as compile_statement
from engine.detector import make_detector
from engine.events import Event

DAY_MS = 86_400_000


def _query(t: str) -> str:
    return (
        f"NAME {unique('drop')}\nPATTERN SEQ({t} a, {t} b)\nWHERE b.price < a.price\n"
        "PARTITION BY symbol\nSTRATEGY partition_contiguity"
    )


def _events(t: str, base_ms: int, n: int, first_id: int) -> list[dict[str, Any]]:
    return [
        {
            "id": first_id + i,
            "type": t,
            "ts": base_ms + i * 1000,
            "attrs": {"symbol": f"S{i % 5}", "price": float((i * 7) % 11)},
        }
        for i in range(n)
    ]


def _expected(text: str, acked: list[dict[str, Any]]) -> int:
    seen: dict[int, dict[str, Any]] = {}
    for e in acked:
        seen.setdefault(e["id"], e)
    det = make_detector(compile_statement(text))
    n = 0
    for e in sorted(seen.values(), key=lambda e: (e["ts"], e["id"])):
        n += len(det.push(Event(e["id"], e["type"], e["ts"] * 1000, e["attrs"])))
    return n + len(det.flush())


def run_fault(name: str, tmp: Path) -> dict[str, Any]:
    db = Database("sqlite", f"sqlite:///{tmp / 'lace.db'}")
    svc = make_service(db, tmp / "data", max_future_skew_s=86_400)
    rx = Receiver()
    rx.start()
    svc.start()
    row: dict[str, Any] = {"fault": name}
    try:
        with svc.client() as c:
            t = unique("Stock")
            c.post("/event-types", json={"name": t, "attributes": {"symbol": "string", "price": "float"}})
            if name == "huge-query":
                comps = ", ".join(f"{t} v{i}" for i in range(3_500))
                refused = [
                    c.post("/queries", json={"text": f"NAME {unique('big')} PATTERN SEQ({comps})"}).status_code,
                    c.post(
                        "/queries", json={"text": f"NAME {unique('w')} PATTERN SEQ({t} a) WITHIN 1e30 days"}
                    ).status_code,
                ]
                row["queries_refused"] = f"{refused.count(422)} of 2 (422)"
            if name == "exploding-query":
                boom = (
                    f"NAME {unique('boom')} PATTERN SEQ({t} a, {t}+ b[], {t} c) WHERE c.price > a.price + 100 "
                    "STRATEGY skip_till_any_match WITHIN 1 day"
                )
                c.post("/queries", json={"text": boom, "pm_capacity": 1_000_000}).raise_for_status()
            text = _query(t)
            qid = c.post("/queries", json={"text": text}).json()["id"]
            c.post("/webhooks", json={"query_id": qid, "url": rx.url}).raise_for_status()
            base = 1_700_000_000_000
            if name == "year-one":
                base = -62_135_596_800_000
            batches = [_events(t, base, 200, 1), _events(t, base + 200_000, 200, 1_000)]
            if name == "far-future":
                batches.insert(
                    1,
                    [{"id": 999_999, "type": t, "ts": "9999-12-31T23:59:59Z", "attrs": {"symbol": "S0", "price": 1.0}}],
                )
            if name == "out-of-step":
                t2 = unique("Stock")
                c.post("/event-types", json={"name": t2, "attributes": {"symbol": "string", "price": "float"}})
                c.post("/events", json=[{"type": t2, "ts": base + 4 * DAY_MS, "attrs": {"symbol": "X", "price": 1.0}}])
            posted = acked = 0
            taken: list[dict[str, Any]] = []
            slowest = 0.0
            for batch in batches:
                for _ in range(2 if name == "retry" else 1):
                    started = time.monotonic()
                    r = c.post("/events", json=batch, timeout=3600).json()
                    slowest = max(slowest, time.monotonic() - started)
                    if r.get("query_errors"):
                        row["query_errors"] = [e["reason"][:80] for e in r["query_errors"]]
                    posted += len(batch)
                    acked += r["accepted"] + len(r.get("duplicates", []))
                    ok = set(r["ids"]) | set(r.get("duplicates", []))
                    taken += [e for e in batch if e.get("id") in ok]
            expected = _expected(text, taken)
            wait_until(lambda: len({d["headers"]["idempotency-key"] for d in rx.ok()}) >= expected, timeout_s=60)
            time.sleep(1.0)
            metrics = c.get("/metrics").text
        svc.stop()  # flushes the archive
        from deltalake import DeltaTable

        archived = DeltaTable(str(tmp / "data" / "archive" / t)).to_pyarrow_table().num_rows
        keys = [d["headers"]["idempotency-key"] for d in rx.ok()]
        dead = next(
            (ln.split()[1] for ln in metrics.splitlines() if ln.startswith("lace_alerts_dead_lettered_total")), "0"
        )
        row.update(
            events_posted=posted,
            events_acknowledged=acked,
            events_archived=archived,
            alerts_expected=expected,
            alerts_delivered=len(set(keys)),
            duplicates=len(keys) - len(set(keys)),
            dead_letters=int(float(dead)),
            slowest_request_s=round(slowest, 2),
        )
    finally:
        svc.stop()
        rx.stop()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", default="far-future,year-one,out-of-step,retry,huge-query,exploding-query")
    args = ap.parse_args(argv)
    rows = []
    for name in args.faults.split(","):
        with tempfile.TemporaryDirectory(prefix="lace-faults-") as d:
            rows.append(run_fault(name, Path(d)))
            print(json.dumps(rows[-1]), flush=True)
    cols = [
        "fault",
        "events_posted",
        "events_acknowledged",
        "events_archived",
        "alerts_expected",
        "alerts_delivered",
        "duplicates",
        "dead_letters",
        "slowest_request_s",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|" + " --- |" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, "")) for k in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
