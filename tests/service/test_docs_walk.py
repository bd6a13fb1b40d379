"""A newcomer's walk: docs/operations.md "Your first alert" run as written against a real ``lace serve``.

The shell blocks run in bash with ``lace`` and ``curl`` on PATH, the receiver block is saved as ``receiver.py`` and run
with the webhook's secret, and what comes back (the ingest answers, the webhook body the receiver prints) is checked
against what the section says. The only changes to the doc's text are the two ports (8000 and 9000 may be taken on a
test machine) and the ``lace serve &`` line, which :class:`cli.service_process.ServiceProcess` runs instead (the same
command with the same ``LACE_WEBHOOK_ALLOW_LOOPBACK=true``; it waits for ``/healthz``, which a newcomer typing the
next line does by being slower than a script).

A fresh service, not the shared ``service`` fixture: the walk names ids (``"query_id": 1``, alert ``"id": 1``) and
the type ``Stock``, which hold only on an empty database.
"""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from cli.service_process import ServiceProcess, free_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
SERVE_LINE = "LACE_WEBHOOK_ALLOW_LOOPBACK=true lace serve &\n"


def section(title: str) -> str:
    """The text of the ``## title`` section of docs/operations.md."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end >= 0 else len(text)]


def fenced(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of ``text``: ``(language, code)`` in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.S | re.M)


def replaced(code: str, old: str, new: str) -> str:
    """``code`` with ``old`` replaced, which it must hold (a doc edit cannot make the walk skip a step silently)."""
    assert old in code, f"the doc's walk no longer holds {old!r}"
    return code.replace(old, new)


def answers(out: str) -> list[Any]:
    """The JSON values printed one after the other (curl prints no newline after an answer)."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while (i := len(out) - len(out[i:].lstrip())) < len(out):
        value, i = decoder.raw_decode(out, i)
        values.append(value)
    return values


def bash(script: str, env: dict[str, str], cwd: Path) -> str:
    """What ``bash -e -c script`` prints (it must succeed)."""
    proc = subprocess.run(["bash", "-e", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{script}\n---\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def read_lines(proc: subprocess.Popen[str], into: queue.Queue[str]) -> None:
    """Put each line ``proc`` prints into ``into`` (the receiver prints one per delivery it accepted)."""
    for line in proc.stdout or ():
        into.put(line)


def wait_listening(port: int, timeout_s: float = 10.0) -> None:
    """Return once something accepts connections on 127.0.0.1:``port`` (OSError after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.integration
def test_your_first_alert_as_written(tmp_path: Path) -> None:
    if shutil.which("curl") is None:  # under CI the walk must run: fail there
        (pytest.fail if os.environ.get("CI") else pytest.skip)("the walk's commands use curl, not on PATH")
    text = section("Your first alert")
    (_, setup), (lang, receiver), (_, drop), (_, trailing), (_, body) = fenced(text)
    assert lang == "python"
    prose = " ".join(text.split())  # the prose's code spans wrap across lines

    svc = ServiceProcess(tmp_path / "lace-data")
    assert svc.env["LACE_WEBHOOK_ALLOW_LOOPBACK"] == "true"
    env = {**svc.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    hook_port = free_port()
    local = f"localhost:{svc.port}"
    setup = replaced(replaced(replaced(setup, SERVE_LINE, ""), "localhost:8000", local),
                     "127.0.0.1:9000", f"127.0.0.1:{hook_port}")
    header = next(line for line in setup.splitlines() if line.startswith("H=("))  # what each later block needs
    receiver = replaced(receiver, '("127.0.0.1", 9000)', f'("127.0.0.1", {hook_port})')
    drop, trailing = (replaced(code, "localhost:8000", local) for code in (drop, trailing))
    svc.start()
    hook = None
    try:
        # type, query, webhook; the key printed by `lace keys create` (bash keeps K for the next blocks)
        *created, key = answers(bash(setup + 'echo "\\"$K\\""\n', env, tmp_path))
        event_type, query, webhook = created
        assert (event_type["name"], query["id"], query["name"], webhook["query_id"]) == ("Stock", 1, "drop", 1)
        assert webhook["secret"].startswith("whsec_")
        env["K"] = key

        (tmp_path / "receiver.py").write_text(receiver, encoding="utf-8")
        hook = subprocess.Popen([sys.executable, "receiver.py", webhook["secret"]], cwd=tmp_path,
                                stdout=subprocess.PIPE, text=True)
        printed: queue.Queue[str] = queue.Queue()
        threading.Thread(target=read_lines, args=(hook, printed), daemon=True).start()
        wait_listening(hook_port)

        (answer,) = answers(bash(header + "\n" + drop, env, tmp_path))
        ids = answer["ids"]
        held = json.loads(re.search(r'`"held": (\[.*?\])`', prose).group(1))  # type: ignore[union-attr]
        assert '`"matches": 0`' in prose
        assert (answer["matches"], answer["held"]) == (0, held)

        (answer,) = answers(bash(header + "\n" + trailing, env, tmp_path))
        said = re.search(r'# 6 s later: "matches": (\d+), "alerts": (\d+)', trailing)
        assert said is not None and (answer["matches"], answer["alerts"]) == (int(said[1]), int(said[2]))

        idempotency_key, _, delivered = printed.get(timeout=15).partition(" ")
        got, documented = json.loads(delivered), json.loads(body)
        assert idempotency_key
        datetime.fromisoformat(got.pop("detected_at"))  # the time it was detected: not the doc's
        documented.pop("detected_at")
        assert [len(v) for v in documented["events"].values()] == [1, 1]
        documented["events"] = {"a": [ids[0]], "b": [ids[1]]}  # the ids the drop's ingest answered
        assert got == documented
    finally:
        if hook is not None:
            hook.kill()
            hook.wait(timeout=10)
        svc.stop()
