"""``lace stream --master spark://HOST:PORT`` on a Spark standalone cluster (issue 26, deploy/stream.md): a master and
two workers (1 core, 1 GiB each) on 127.0.0.1, started here from pyspark's ``bin/spark-class``; the statement's
output equals ``lace match``'s byte for byte, and both workers ran executors of it."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stream.test_stream import QUERIES, REPO, match_output

WORKERS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen) -> None:
    """Stop a process started in its own session and everything left in its process group (a worker's executors
    and their Python workers): SIGTERM, 20 s, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the group is gone
            break
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
    proc.wait()


@pytest.fixture
def standalone_cluster(tmp_path: Path) -> Iterator[tuple[str, list[Path]]]:
    """A standalone master and two workers on 127.0.0.1 (free ports), once both workers are registered: the master's
    URL and the workers' work folders. The JVMs' process groups are killed afterwards."""
    if shutil.which("java") is None:
        pytest.skip("Spark tests need Java 17 on PATH (apt-get install openjdk-17-jre-headless)")
    from archive.spark import SparkSettings, jar_has_delta

    if not jar_has_delta(SparkSettings.from_env().delta_jar):
        pytest.skip("lace stream needs the Delta Spark connector (LACE_DELTA_JAR, make delta-jars)")
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    port, ui = free_port(), free_port()
    env = {
        **os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "TZ": "UTC",
        # no REST submission server (its fixed port 6066 may be taken)
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        # C1 only, serial GC: the daemons' start-up CPU (the drivers' too: tests/conftest.py)
        "SPARK_DAEMON_JAVA_OPTS": os.environ.get("SPARK_SUBMIT_OPTS", ""),
    }
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> None:
        with open(logs / f"{name}.log", "wb") as log:
            procs.append(subprocess.Popen([str(spark_class), *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))

    url = f"spark://127.0.0.1:{port}"
    work = [tmp_path / f"worker{i}" for i in range(WORKERS)]
    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui))
        for i, folder in enumerate(work):
            start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", url, "--cores", "1", "--memory", "1g",
                  "--host", "127.0.0.1", "--webui-port", "0", "--work-dir", str(folder))
        deadline, alive = time.monotonic() + 240, 0
        while alive < WORKERS:  # the machine may be loaded: JVMs start in seconds to a minute
            for p in procs:
                assert p.poll() is None, (logs / "master.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"{alive} of {WORKERS} workers registered in 240 s"
            time.sleep(1)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as answer:
                    alive = int(json.load(answer)["aliveworkers"])
            except OSError:
                continue
        yield url, work
    finally:
        for p in reversed(procs):
            stop(p)


@pytest.mark.spark
@pytest.mark.slow
def test_standalone_cluster_equals_lace_match(standalone_cluster, traffic_slice, tmp_path):
    """``jam_not_cleared`` (a trailing negation: matches released by event-time timers in the micro-batches after the
    events', from the keys' states) over the traffic slice, run by a ``lace stream`` process whose executors are on
    the two workers. The slice is one micro-batch (each costs seconds to tens of seconds on a loaded machine; the
    local tests cover several)."""
    url, work = standalone_cluster
    query = QUERIES / "jam_not_cleared.lql"
    expected = match_output(query, traffic_slice, tmp_path / "match.jsonl")
    assert expected.count(b"\n") >= 10
    out = tmp_path / "stream.jsonl"
    args = ["stream", "--query", str(query), "--events", str(traffic_slice), "--out", str(out),
            "--checkpoint", str(tmp_path / "ck"), "--master", url, "--batch-events", "12000"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1"}
    if os.environ.get("SPARK_SUBMIT_OPTS"):  # the executors' JVMs as the driver's (tests/conftest.py)
        env["LACE_SPARK_CONF"] = f"spark.executor.extraJavaOptions={os.environ['SPARK_SUBMIT_OPTS']}"
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = proc.communicate(timeout=600)
    finally:
        stop(proc)
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    assert out.read_bytes() == expected
    # the executors were the workers': each worker's work folder holds the application's executor folder
    for folder in work:
        apps = list(folder.glob("app-*/*/stderr"))
        assert apps, f"{folder}: no executor of lace stream ran on this worker"
