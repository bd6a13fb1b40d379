"""``deploy/check.sh``, the offline checks of deploy/ (Dockerfile, compose file, lace.env.example, constraints.txt,
systemd unit): run with the suite, so what they check does not rot between releases (three of them had: a package
the image did not copy, a setting documented but not found, pins missing from constraints.txt)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_deploy_check_passes(repo_root: Path) -> None:
    run = subprocess.run(
        ["bash", str(repo_root / "deploy" / "check.sh")], env={**os.environ, "PYTHON": sys.executable},
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "FAILED" not in run.stdout
