"""Build LACE, compiling the engine's hot path with mypyc (issue 45; docs/architecture.md, "The compiled build").

``pip install -e '.[dev]'`` (``make venv``) compiles the modules of :data:`engine.build.COMPILED` from their own
Python source into one C extension group, as mypy and black ship. With ``LACE_PURE_PYTHON=1`` at install time, or
when mypyc or a C compiler is missing, nothing is compiled and the same modules run as Python (``lace --version``
and the service's start-up log say which).
``LACE_MYPYC_OPT`` sets the C optimisation level (default 1: as fast as 2 and 3 on bench/engine.py, and the
quickest to build; docs/benchmarks.md, "The compiled engine").
"""
from __future__ import annotations

import os
import runpy
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

# The matching loop, listed in engine/build.py (read without importing the engine package)
HERE = os.path.dirname(os.path.abspath(__file__))
COMPILED = [
    m.replace(".", "/") + ".py" for m in runpy.run_path(os.path.join(HERE, "engine", "build.py"))["COMPILED"]
]


def _ext_modules() -> list:
    if os.environ.get("LACE_PURE_PYTHON", "") not in ("", "0"):
        print("LACE_PURE_PYTHON set: the engine stays pure Python", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("mypyc not available: the engine stays pure Python", file=sys.stderr)
        return []
    os.chdir(HERE)  # mypycify takes paths relative to the project
    opt = os.environ.get("LACE_MYPYC_OPT", "1")
    try:
        # one group, its shared library inside the package (engine/hotpath__mypyc.*.so): a top-level one would not
        # be found by an editable install's import hook
        return mypycify(COMPILED, opt_level=opt, multi_file=False, group_name="engine.hotpath", debug_level="0")
    except (Exception, SystemExit) as exc:  # a type error mypyc refuses: fall back rather than fail the install
        print(f"mypyc failed ({exc}): the engine stays pure Python", file=sys.stderr)
        return []


class _BuildExt(build_ext):
    """build_ext that leaves the pure-Python modules in place when the C compiler is missing or fails: every
    extension of the group goes (a shim without its group library would not import)."""

    def run(self) -> None:
        try:
            super().run()
        except (CCompilerError, ExecError, PlatformError, OSError) as exc:
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.remove(path)
            print(f"compiling the engine failed ({exc}): it stays pure Python", file=sys.stderr)


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": _BuildExt})
