"""Shared pytest fixtures (no Spark yet: one session per run will live here, marked ``spark``)."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

REPO_ROOT = Path(__file__).resolve().parent.parent

# Every Spark driver a test starts (here, or in a `lace serve` / `lace stream` it spawns: they inherit the variable)
# compiles with C1 only and collects with the serial GC. The tests' JVMs live seconds to minutes, and C2's compiler
# threads were most of their start-up CPU (measured: 18 -> 10 CPU-s a driver, 5.7 with the class archive of
# `make spark-cds`; docs/testing.md). What a test checks does not depend on the JIT; the service keeps Java's defaults.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

# Wall-clock deadlines make property tests flaky on loaded CI machines; example counts stay at the defaults.
settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


@pytest.fixture
def repo_root() -> Path:
    """The repository checkout (for bundled files such as bench/ and docs/)."""
    return REPO_ROOT


@pytest.fixture
def write_file(tmp_path: Path) -> Callable[[str, str], Path]:
    """Factory: ``write_file("events.csv", text)`` writes ``text`` under a fresh tmp dir and returns its path."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture(scope="session")
def bench_10k() -> list:
    """The seed-42 peer-benchmark stream, 10,000 events (shared/bench/README.md)."""
    from bench.streams import generate_events

    return generate_events(10_000)


SLOWEST_FIRST = (
    "tests/service/test_stream_end.py",
    "tests/service/test_derived_restart.py",
    "tests/crash/test_crash_suite.py",
    "tests/service/test_pm_store.py",
    "tests/service/test_schemathesis.py",
    "tests/stream/test_stream.py",
    "tests/stream/test_stream_la.py",
    "tests/stream/test_stream_archive.py",
    "tests/crash/test_replay_start.py",
    "tests/service/test_explain.py",
    "tests/service/test_live_archived.py",
    "tests/service/test_la_kill_after_post.py",
    "tests/archive/test_extractor.py",
    "tests/stream/test_stream_cluster.py",
    "tests/service/test_warm_and_stop.py",
    "tests/service/test_rules.py",
    "tests/service/test_event_time.py",
)
"""The test files that take longest (docs/testing.md: each a minute or more of a two-worker run), slowest first.
``make test`` hands whole files to its workers (``pytest -n 2 --dist loadfile``) in collection order, so these are
collected first: a long file started last would run alone at the end while the other worker idles."""


def pytest_collection_modifyitems(session, config, items) -> None:  # noqa: ARG001 (pytest's hook signature)
    """Put the items of :data:`SLOWEST_FIRST` first, in its order; the others keep theirs (a stable sort)."""
    rank = {path: n for n, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def _postgres_skips(terminalreporter) -> None:
    """One line saying how many PostgreSQL tests skipped and why (no server: ``make postgres`` starts one)."""
    from tests.postgres import SKIP_REASON

    skipped = [r for r in terminalreporter.stats.get("skipped", []) if SKIP_REASON in str(r.longrepr)]
    if skipped:
        terminalreporter.write_line(
            f"{len(skipped)} PostgreSQL tests skipped: {SKIP_REASON} (`make postgres` installs and starts one)",
            yellow=True,
        )


def folder_seconds(terminalreporter) -> dict[str, float]:
    """Wall seconds of every test step (setup, call, teardown) summed per top-level test folder (``tests/service``,
    ``engine`` for the docstring examples, ...), from the reports the run kept."""
    totals: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            nodeid, duration = getattr(rep, "nodeid", None), getattr(rep, "duration", None)
            if not nodeid or duration is None or getattr(rep, "when", None) is None:
                continue
            parts = nodeid.split("::")[0].split("/")
            folder = "/".join(parts[:2]) if parts[0] == "tests" and len(parts) > 2 else parts[0]
            totals[folder] = totals.get(folder, 0.0) + duration
    return totals


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001 (pytest's hook signature)
    """The time of each top-level test folder (CI prints it every run: docs/testing.md), then the PostgreSQL skips."""
    totals = folder_seconds(terminalreporter)
    if totals:
        terminalreporter.section("seconds per test folder (setup + call + teardown, summed over workers)")
        for folder, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{seconds:9.1f} s  {folder}")
    _postgres_skips(terminalreporter)
