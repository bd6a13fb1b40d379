"""End-to-end latency of a statement detected by ``lace stream --follow`` (issue 26): from the acknowledgement of the
``POST /events`` that holds a match's last event to the webhook the service delivers for it.

The path measured: the service archives the events (its archive writer commits to Delta every
``--archive-flush-s`` seconds or ``archive_flush_rows`` events), the ``--follow`` query reads the new table versions
at its next trigger (``--trigger``), runs the micro-batch (the keys' matchers in ``transformWithStateInPandas``, the
results' Delta commit), posts the micro-batch's matches to ``POST /queries/{id}/results``, and the service delivers the
new alerts to the webhook. A real ``lace serve`` (SQLite), a real receiver, Spark ``local[2]`` in the ``lace stream``
process.

Workload: ``drop_then_rebound`` (cli/demo_data/queries) over the demo's 7,798 one-minute bars; the statement is
paused in the service (detected by Spark only). The first ``--warmup`` bars are posted and their matches awaited
(the Spark session and the first micro-batches), then the rest at ``--rate`` events/s in requests of ``--batch``;
each match's latency is the receiver's arrival time minus the acknowledgement time of the request that held its
newest event. Every match of ``lace match`` over the 7,798 must arrive once, or the run fails.

Run::

    LACE_DELTA_JAR=.jars/delta-spark_4.2_2.13-4.4.0 .venv/bin/python -m bench.stream_follow --rate 500 \\
        --trigger '1 second' --archive-flush-s 1 --json follow.json
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stream import _pct

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "cli" / "demo_data"
QUERY = DEMO / "queries" / "drop_then_rebound.lql"
BARS = DEMO / "bars_1m.csv"


def _expected(tmp: Path) -> set[str]:
    """The identities (variable -> ids, canonical JSON) of ``lace match``'s matches over every bar."""
    out = tmp / "match.jsonl"
    subprocess.run([sys.executable, "-m", "cli.main", "match", "-q", str(QUERY), "-e", str(BARS), "-o", str(out)],
                   cwd=REPO, check=True, capture_output=True)
    return {json.dumps(json.loads(line)["events"], sort_keys=True) for line in out.read_text().splitlines()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=500.0, help="events/s posted after the warm-up")
    ap.add_argument("--batch", type=int, default=50, help="events per POST /events")
    ap.add_argument("--warmup", type=int, default=1_500, help="bars posted (and matched) before measuring")
    ap.add_argument("--trigger", default="1 second", help="lace stream --trigger")
    ap.add_argument("--archive-flush-s", type=float, default=1.0, help="the service's LACE_ARCHIVE_FLUSH_AGE_S")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    args = ap.parse_args(argv)

    from cli.service_process import Database, make_service, wait_until
    from cli.webhook_receiver import Receiver
    from engine.io import open_event_file
    from tests.stream.test_stream_deliver import archive_buffered, register_types  # the test's harness helpers

    events = list(open_event_file(BARS).events())
    with tempfile.TemporaryDirectory(prefix="lace-follow-") as tmp_name:
        tmp = Path(tmp_name)
        want = _expected(tmp)
        svc = make_service(Database("sqlite", f"sqlite:///{tmp / 'lace.db'}"), tmp / "data",
                           archive_flush_age_s=args.archive_flush_s)
        receiver = Receiver()
        receiver.start()
        svc.start()
        proc = None
        acked: dict[int, float] = {}
        try:
            with svc.client() as c:
                register_types(c, events)
                q = c.post("/queries", json={"text": QUERY.read_text()}).json()
                assert c.post("/webhooks", json={"query_id": q["id"], "url": receiver.url}).status_code == 201
                assert c.post(f"/queries/{q['id']}/pause").json()["state"] == "paused"

                def post(part: list[Any]) -> None:
                    body = [{"id": e.id, "type": e.type, "ts": e.ts // 1_000, "attrs": e.attrs} for e in part]
                    r = c.post("/events", json=body)
                    assert r.status_code == 200 and r.json()["rejected"] == 0, r.text
                    now = time.time()
                    for e in part:
                        acked[e.id] = now

                warm = events[: args.warmup]
                for i in range(0, len(warm), 500):
                    post(warm[i : i + 500])
                assert wait_until(lambda: archive_buffered(c) == 0, timeout_s=60), "the archive did not flush"
                log = tmp / "follow.log"
                cmd = ["stream", "--query", str(QUERY), "--archive", str(svc.data_dir / "archive"), "--checkpoint",
                       str(tmp / "ck"), "--master", "local[2]", "--follow", "--trigger", args.trigger, "--deliver",
                       svc.base, "--query-id", str(q["id"]), "--api-key", svc.admin]
                with open(log, "wb") as f:
                    proc = subprocess.Popen([sys.executable, "-m", "cli.main", *cmd], cwd=REPO, stdout=f,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, "PYTHONPATH": str(REPO)})
                started = time.monotonic()
                up = wait_until(lambda: "delivered" in log.read_text() or proc.poll() is not None, timeout_s=600)
                assert up and proc.poll() is None, log.read_text()[-3000:]
                warm_s = time.monotonic() - started
                time.sleep(3 * args.archive_flush_s + 5)  # the warm-up's last micro-batches
                before = len(receiver.ok())
                rest = events[args.warmup :]
                t0 = time.monotonic()
                for n, i in enumerate(range(0, len(rest), args.batch)):
                    post(rest[i : i + args.batch])
                    ahead = t0 + (n + 1) * args.batch / args.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                posting_s = time.monotonic() - t0
                receiver.wait_for(len(want), timeout_s=600)
                time.sleep(3.0)
        finally:
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(120)
                finally:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            svc.stop()
            receiver.stop()
        got = receiver.ok()
        ids = [json.dumps(json.loads(d["body"])["events"], sort_keys=True) for d in got]
        if sorted(ids) != sorted(want):
            print(f"FAILED: {len(ids)} deliveries ({len(set(ids))} distinct), lace match has {len(want)}")
            return 1
        lat = []
        for d in got[before:]:
            newest = max(i for ids_ in json.loads(d["body"])["events"].values() for i in ids_)
            lat.append(d["at"] - acked[newest])
        result = {
            "matches": len(want), "measured": len(lat), "rate": args.rate, "posted_events": len(rest),
            "posting_s": round(posting_s, 1), "trigger": args.trigger, "archive_flush_s": args.archive_flush_s,
            "first_results_s": round(warm_s, 1),
            "latency_s": {"p50": round(_pct(lat, 0.5), 2), "p99": round(_pct(lat, 0.99), 2),
                          "max": round(max(lat, default=0.0), 2)},
        }
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
