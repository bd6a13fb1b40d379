"""``lace stream --archive --follow``: a query left running on the archive (issue 26), each micro-batch's matches sent
to the service as they are found; a SIGKILL (Python and its JVM) and a restart from the checkpoint lose and repeat
nothing. Real ``lace serve`` (SQLite) whose archive the stream reads, real webhook receiver, real Spark (local[2])."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.service_process import ServiceProcess, wait_until
from cli.webhook_receiver import Receiver
from tests.stream.test_stream_deliver import (
    DEMO,
    archive_buffered,
    canonical,
    open_event_file_events,
    post_events,
    receiver,  # noqa: F401 - a fixture
    register_types,
    service,  # noqa: F401 - a fixture
)

REPO = Path(__file__).resolve().parents[2]
QUERY = DEMO / "queries" / "drop_then_rebound.lql"
BARS = DEMO / "bars_1m.csv"
runner = CliRunner()


def expected(tmp_path: Path, n: int) -> dict[tuple[str, tuple[tuple[str, object], ...]], dict]:
    """``lace match``'s matches over the first ``n`` bars, by identity and fields."""
    lines = BARS.read_text(encoding="utf-8").splitlines(keepends=True)
    part = tmp_path / f"bars_{n}.csv"
    part.write_text(lines[0] + "".join(lines[1:n + 1]), encoding="utf-8")
    out = tmp_path / f"match_{n}.jsonl"
    r = runner.invoke(app, ["match", "-q", str(QUERY), "-e", str(part), "-o", str(out)])
    assert r.exit_code == 0, r.output
    return {canonical(json.loads(line)): json.loads(line) for line in out.read_text().splitlines()}


class Follower:
    """A ``lace stream --follow`` process in a session of its own (its JVM and Python workers in its group); its
    output in a file."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(log, "ab") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=REPO, env=env, stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL to the whole group: the driver and its JVM at once."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self) -> int:
        """SIGTERM to the driver only (as a service manager would): it stops the query and exits."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.spark
@pytest.mark.slow
def test_a_query_left_running_on_the_archive_delivers_each_match_once_across_a_sigkill(
    stream_spark, tmp_path, service: ServiceProcess, receiver: Receiver  # noqa: F811 - fixtures
):
    """``drop_then_rebound`` over the demo's 7,798 bars, posted to the service in three parts while the statement
    is paused there (moved to Spark): one ``--follow`` process sends the first part's matches, then the second's as
    they are archived; it is killed (SIGKILL, Python and JVM) right after a micro-batch's matches were sent, the
    third part is posted, and the same command goes on from the checkpoint; SIGTERM then stops it (exit 0). The
    receiver has every match of ``lace match`` over the 7,798 (events and fields) exactly once."""
    events = open_event_file_events(BARS)
    cuts = (2_500, 5_000, len(events))
    with service.client() as c:
        register_types(c, events)
        q = c.post("/queries", json={"text": QUERY.read_text()}).json()
        assert c.post("/webhooks", json={"query_id": q["id"], "url": receiver.url}).status_code == 201
        assert c.post(f"/queries/{q['id']}/pause").json()["state"] == "paused"
        assert post_events(c, events[: cuts[0]]) == 0
        assert wait_until(lambda: archive_buffered(c) == 0, timeout_s=60), "the archive did not flush"

    args = ["stream", "--query", str(QUERY), "--archive", str(service.data_dir / "archive"), "--checkpoint",
            str(tmp_path / "ck"), "--master", "local[2]", "--follow", "--trigger", "1 second", "--deliver",
            service.base, "--query-id", str(q["id"]), "--api-key", service.admin]
    log = tmp_path / "follow.log"
    first = Follower(args, log)
    want = [expected(tmp_path, n) for n in cuts]
    assert 0 < len(want[0]) < len(want[1]) < len(want[2])
    try:
        receiver.wait_for(len(want[0]), timeout_s=300)
        with service.client() as c:
            sent = log.read_text().count("delivered")
            assert post_events(c, events[cuts[0] : cuts[1]]) == 0  # archived while the query runs
        assert wait_until(lambda: log.read_text().count("delivered") > sent and len(receiver.ok()) > len(want[0]),
                          timeout_s=300), first.text()
        first.kill()  # right after a micro-batch's matches were sent: maybe before Spark committed it
        with service.client() as c:
            assert post_events(c, events[cuts[1] :]) == 0
            assert wait_until(lambda: archive_buffered(c) == 0, timeout_s=60), "the archive did not flush"
        second = Follower(args, log)
        try:
            receiver.wait_for(len(want[2]), timeout_s=300)
            time.sleep(3.0)  # a match sent twice would have arrived by now
        finally:
            code = second.terminate()
        assert code == 0, second.text()[-3000:]
    finally:
        if first.proc.poll() is None:
            first.kill()
    text = log.read_text()
    assert re.search(r"stopped after \d+ micro-batches: delivered \d+ matches", text), text[-3000:]
    got = receiver.ok()
    received = [canonical(json.loads(d["body"])) for d in got]
    assert len(received) == len(want[2])  # nothing twice
    assert sorted(received) == sorted(want[2])  # nothing lost, fields too
    assert len({d["headers"]["idempotency-key"] for d in got}) == len(got)


@pytest.mark.parametrize(("extra", "message"), [
    (["--follow"], "--follow needs --archive ROOT, --checkpoint DIR and --deliver URL --query-id N"),
    (["--follow", "--checkpoint", "CK", "--deliver", "http://127.0.0.1:1", "--query-id", "1", "--out", "o.jsonl"],
     "--out and --deliver-tail are options of a bounded run, not of --follow"),
    (["--follow", "--checkpoint", "CK", "--deliver", "http://127.0.0.1:1", "--query-id", "1", "--trigger", "0"],
     "--trigger: give a positive duration"),
    ([], "give --out FILE (or --follow to leave the query running)"),
])
def test_follow_options_are_checked_before_spark_starts(tmp_path, extra, message):
    args = ["stream", "--query", str(QUERY), "--archive", str(tmp_path), *extra]
    r = runner.invoke(app, [a.replace("CK", str(tmp_path / "ck")) for a in args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.output
