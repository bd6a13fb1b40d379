"""``service.core.faults.crash_point``: a no-op unless ``LACE_CRASH_AT`` arms it; then its n-th pass SIGKILLs the
process group when the process leads it, and only the process itself otherwise; ``LACE_CRASH_TRACE`` counts
passes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from cli.service_process import PACKAGE_ROOT, wait_until

PROGRAM = """
import subprocess, sys, time
from service.core.faults import crash_point
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # same group
print(child.pid, flush=True)
for i in range(3):
    print("pass", i + 1, flush=True)
    crash_point("ingest.after_wal")
crash_point("webhook.after_post")
print("done", flush=True)
child.kill()
"""


def run(env: dict[str, str], *, own_group: bool) -> tuple[int, list[str]]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LACE_")} | env
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=full, cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=60,
        process_group=0 if own_group else None,
    )
    return proc.returncode, proc.stdout.splitlines()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_unarmed_crash_points_do_nothing() -> None:
    code, out = run({}, own_group=True)
    assert code == 0 and out[-1] == "done", out


def test_the_armed_pass_kills_the_whole_group(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    code, out = run({"LACE_CRASH_AT": "ingest.after_wal:2", "LACE_CRASH_TRACE": str(trace)}, own_group=True)
    assert code == -signal.SIGKILL
    assert out[1:] == ["pass 1", "pass 2"]
    assert wait_until(lambda: not alive(int(out[0])), timeout_s=10)  # its child went with it
    assert [line.split()[0] for line in trace.read_text().splitlines()] == ["ingest.after_wal"] * 2


def test_a_process_that_does_not_lead_its_group_kills_only_itself() -> None:
    """Started in pytest's group (as the service tests start ``lace serve``): pytest and the child live on."""
    code, out = run({"LACE_CRASH_AT": "ingest.after_wal:1"}, own_group=False)
    assert code == -signal.SIGKILL and out[1:] == ["pass 1"]
    child = int(out[0])
    assert alive(child)
    os.kill(child, signal.SIGKILL)


def test_a_bad_spec_is_refused_at_start() -> None:
    code, out = run({"LACE_CRASH_AT": "nowhere:1"}, own_group=True)
    assert code == 1 and out == []


def test_every_crash_point_in_the_code_is_listed_once_and_the_harness_knows_it() -> None:
    """``faults.POINTS`` is the one list: the names the code passes are exactly its keys (a point added to the code
    but not the list makes the service refuse ``LACE_CRASH_AT`` at it; one left in the list after the code lost it
    is a fault that never fires), and the harness's table has every one the workload passes."""
    import re

    from bench.crash import IMPORT_POINTS
    from bench.crash import POINTS as HARNESS
    from service.core.faults import POINTS

    used = set()
    for d in ("service", "archive", "engine", "cli"):
        for f in (PACKAGE_ROOT / d).rglob("*.py"):
            used |= set(re.findall(r'crash_point\("([^"]+)"\)', f.read_text()))
    assert used == set(POINTS)
    assert set(POINTS) - set(IMPORT_POINTS) <= set(HARNESS)
