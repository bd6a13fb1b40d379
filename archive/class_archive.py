"""The Spark driver's class-data-sharing archive: a JVM that starts in a third of the CPU.

A Spark driver JVM loads and verifies some 10,000 classes before its first job: ~18 CPU-s on this project's 2-core
reference machine, paid by every ``lace serve``, ``lace stream``, ``lace backfill`` and test that starts Spark.
Java's dynamic class-data sharing (JEP 350, Java 13+) keeps those classes parsed and verified in a file that later
JVMs map read-only. ``make spark-cds`` (``python -m archive.class_archive``) writes it once per virtual environment:
it starts the driver with ``-XX:ArchiveClassesAtExit``, runs the warm-up job (:func:`archive.spark.warm_up`) and a
native Delta read when the connector is there, and stops; the JVM dumps the classes it loaded as it exits.
:func:`archive.spark.build_conf` then adds ``-XX:SharedArchiveFile`` to the driver's options (measured in
docs/benchmarks.md, "Spark driver start").

The archive belongs to one Java build and one class path (the venv's ``pyspark/jars``), so it lives in the venv
(:func:`default_class_archive`). A JVM that cannot use it (another Java, a moved venv) starts as before, silently
(``-Xshare:auto``, its CDS log off): the archive is a speed-up, never a requirement.
``LACE_SPARK_CDS`` names another file, or ``none`` to start without one.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ARCHIVE_NAME = "lace-spark-classes.jsa"
CDS_LOG_OFF = "-Xlog:cds=off,cds+dynamic=off"


def default_class_archive() -> Path:
    """Where this interpreter's venv keeps the archive: ``<sys.prefix>/lace-spark-classes.jsa`` (may not exist)."""
    return Path(sys.prefix) / ARCHIVE_NAME


def configured_class_archive(value: str) -> Path | None:
    """``LACE_SPARK_CDS`` -> where the archive is (or is to be written): the path given, the venv's
    (:func:`default_class_archive`) when empty, None for ``none``."""
    value = value.strip()
    if value.lower() == "none":
        return None
    return Path(value) if value else default_class_archive()


def class_archive_setting(value: str) -> str | None:
    """``LACE_SPARK_CDS`` -> the archive a driver maps: :func:`configured_class_archive` when that file exists."""
    path = configured_class_archive(value)
    return str(path) if path is not None and path.is_file() else None


def java_options(path: str) -> str:
    """The driver's JVM options that map the archive at ``path`` (ignored silently by a JVM that cannot use it)."""
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {CDS_LOG_OFF}"


def build(out: Path, *, timeout_s: float = 300.0) -> float:
    """Write the archive to ``out`` (atomically: a temporary file renamed); return the seconds it took.

    Runs in this process: it starts the process's Spark session (:func:`archive.spark.get_spark`), so call it from a
    process of its own (``python -m archive.class_archive``).

    Raises
    ------
    RuntimeError
        When the JVM did not exit within ``timeout_s`` or wrote no archive.
    """
    from archive import spark as spark_mod

    t0 = time.perf_counter()
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    base = spark_mod.SparkSettings.from_env()
    driver = spark_mod.build_conf(replace(base, class_archive=None))["spark.driver.extraJavaOptions"]
    settings = replace(
        base,
        class_archive=None,
        conf={**base.conf, "spark.driver.extraJavaOptions": f"{driver} -XX:ArchiveClassesAtExit={tmp} {CDS_LOG_OFF}"},
    )
    session = spark_mod.get_spark(settings, warm=True)
    _exercise_delta(session)
    gateway: Any = session.sparkContext._gateway
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    spark_mod.stop_spark()
    gateway.shutdown()
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()  # the gateway server exits when its stdin closes; the JVM dumps the archive then
        proc.wait(timeout=timeout_s)
    if not tmp.is_file():
        raise RuntimeError(f"the JVM wrote no class archive at {tmp}")
    os.replace(tmp, out)
    return time.perf_counter() - t0


def _exercise_delta(session) -> None:  # type: ignore[no-untyped-def]
    """Load the native Delta reader's classes too: write a two-row table with delta-rs, read it through Spark."""
    from archive.spark import native_delta_available

    if not native_delta_available(session):
        return
    import pyarrow as pa
    from deltalake import write_deltalake

    with tempfile.TemporaryDirectory(prefix="lace-cds-") as tmp:
        write_deltalake(tmp, pa.table({"id": [1, 2], "key": ["a", "b"]}))
        session.read.format("delta").load(tmp).where("key = 'a'").toArrow()


def main(argv: list[str] | None = None) -> int:
    """``python -m archive.class_archive [--out PATH] [--force]``: write the archive unless it exists."""
    parser = argparse.ArgumentParser(prog="python -m archive.class_archive", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help=f"default: <venv>/{ARCHIVE_NAME}")
    parser.add_argument("--force", action="store_true", help="write it again even when it exists")
    args = parser.parse_args(argv)
    out = args.out or configured_class_archive(os.environ.get("LACE_SPARK_CDS", ""))
    if out is None:
        print("Spark class archive: none (LACE_SPARK_CDS=none)")
        return 0
    if out.is_file() and not args.force:
        print(f"Spark class archive: {out} (present)")
        return 0
    try:
        seconds = build(out)
    except Exception as e:  # a speed-up only: say why and go on without it
        print(f"Spark class archive not written ({type(e).__name__}: {e}); Spark starts without it", file=sys.stderr)
        return 1
    print(f"Spark class archive: {out} ({out.stat().st_size / 1e6:.0f} MB, {seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
