"""``lace``: the command line's entry point; importing the command modules registers them on :data:`app`."""
from __future__ import annotations

import atexit
import gc
import os
import sys

# numpy (pyarrow imports it, and the engine reads columns through it) starts OpenBLAS's thread pool on import, a
# thread per core that spins for work, though no command does linear algebra: 0.03-0.05 CPU s of every `lace`
# process (issue 45). One thread, unless the user chose otherwise; the command's child processes inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# The cyclic collector is off while the command modules (and typer, pyarrow, numpy, the engine) are imported: their
# objects live to the end, and the collections their allocations would start walk them again and again (py-spy: 2 %
# of `lace match` P1-any's samples, 0.01-0.03 CPU s; issue 45). Restored as it was (off stays off).
_gc_was_enabled = gc.isenabled()
gc.disable()
try:
    from archive.cli import archive_app
    from cli import backfill, demo, explain, match, operators, replay, serve, stream  # noqa: F401 - each registers its commands
    from cli.app import app
finally:
    if _gc_was_enabled:
        gc.enable()

app.add_typer(archive_app, name="archive")

__all__ = ["app", "main"]


def main(prog_name: str | None = None) -> None:
    """Run ``lace`` as a process (the ``lace`` script, ``python -m cli``, ``python -m cli.main``,
    deploy/lace_submit.py); exits with the command's code. ``prog_name``: the name usage lines show (None: the
    script's).

    The command runs, then Python's exit handlers (``atexit``: multiprocessing joins its children, pyspark stops its
    gateway, logging flushes), then the process leaves with :func:`os._exit`, skipping the interpreter's teardown and
    C++ static destructors: pyarrow's thread pools (CSV and Parquet reads, dataset scans) may still hold a joinable
    thread then, and ``std::terminate`` aborts the process (SIGABRT, "terminate called without an active exception";
    apache/arrow#34314, #39862) after every output was written. Seen once in CI: ``lace stream`` exited -6 on a loaded
    machine. In-process callers (typer's ``CliRunner``) use :data:`app` and are not affected.
    """
    try:
        app(prog_name=prog_name)
        code: int = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: nothing more can be written
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
