"""Collection of the docstring examples (``--doctest-modules`` over engine/, service/, cli/).

A module of the compiled engine (:data:`engine.build.COMPILED`, issue 45) is imported from its C extension, which
pytest refuses to collect as the ``.py`` file beside it ("import file mismatch"): those files are not collected
when compiled (none of them has an example; ``make test-pure`` collects them on the pure-Python modules).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

from engine.build import COMPILED

_ROOT = Path(__file__).resolve().parent
_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)

collect_ignore = [
    str(_ROOT / (name.replace(".", "/") + ".py"))
    for name in COMPILED
    if ((spec := importlib.util.find_spec(name)) is not None and (spec.origin or "").endswith(_SUFFIXES))
]
