"""Which build of the engine runs: the mypyc-compiled hot path or pure Python (issue 45).

``setup.py`` compiles :data:`COMPILED` with mypyc at install time (``pip install -e '.[dev]'``; skipped with
``LACE_PURE_PYTHON=1`` or without mypyc or a C compiler). The compiled extension of a module sits beside its
source and is what Python imports; :func:`engine_build` says what was imported. This module itself is never compiled
and imports nothing of the engine, so that ``setup.py`` can read :data:`COMPILED` before anything is built.
"""
from __future__ import annotations

import importlib
import importlib.machinery

COMPILED = (
    "engine.events",
    "engine.match",
    "engine.match_files",
    "engine.matcher",
    "engine.buffer.chain",
    "engine.nfa.compiled_plan",
    "engine.nfa.conjunct_order",
    "engine.nfa.counters",
    "engine.nfa.runs",
    "engine.nfa.shared_runs",
    "engine.nfa.state",
    "engine.nfa.tree",
    "engine.pm.buffer",
)
"""The modules of the matching loop, by the profile of ``bench/engine.py`` (docs/architecture.md, "The compiled
build"), compiled into one mypyc group."""


def compiled_modules() -> list[str]:
    """The modules of :data:`COMPILED` that were imported from a C extension (imports them)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return [m for m in COMPILED if (importlib.import_module(m).__file__ or "").endswith(suffixes)]


def engine_build() -> str:
    """One line: ``compiled (mypyc, 13/13 modules)`` or ``pure Python``; ``lace --version`` and the service's
    start-up log print it."""
    done = compiled_modules()
    if not done:
        return "pure Python"
    return f"compiled (mypyc, {len(done)}/{len(COMPILED)} modules)"
