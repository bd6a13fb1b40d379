#!/usr/bin/env python3
"""Fetch the Delta Spark connector and the ``io.delta`` JARs it needs at run time, with Maven.

The version is pinned once, in ``pyproject.toml`` (``delta-spark==X``, beside ``pyspark==Y``): this
script reads both pins, names the artifact ``io.delta:delta-spark_<Y major.minor>_2.13:X`` and has
``mvn`` (the registry's ordinary client, with the machine's Maven settings) resolve it and its
``io.delta`` runtime dependencies (``delta-storage``, ``delta-kernel-*``) into one folder::

    python3 deploy/fetch_delta_jars.py                 # -> .jars/delta-spark_4.2_2.13-<X>/ in the checkout
    python3 deploy/fetch_delta_jars.py --out /opt/lace/jars/delta   # the Dockerfile

Everything else the connector depends on (Scala, Hadoop, Parquet, Jackson) is Spark's own and is not
copied. ``archive/spark.py`` finds the default folder by itself (``LACE_DELTA_JAR`` overrides it) and
puts every JAR in it on ``spark.jars``, so Spark reads the archive with ``format("delta")``.

Runs on any Python 3.11 with the standard library only. Idempotent: a complete folder (its
``.complete`` marker names the same artifact) is left as it is, in a few milliseconds.

Exit status: 0 when the folder is complete; 1 on any failure (``mvn`` missing, resolution failed, no
``io.delta.sql.DeltaSparkSessionExtension`` in what was fetched), with one line on stderr saying what
to do. ``--optional`` turns a failure into a warning and exit status 0 (``make`` on a laptop without
Maven or network: LACE then reads the archive with its ``filelist`` reader and says so at start).
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCALA = "2.13"
GROUP = "io.delta"
EXTENSION_CLASS = "io/delta/sql/DeltaSparkSessionExtension.class"
MARKER = ".complete"
_PIN = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([A-Za-z0-9_.+-]+)\s*$")

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>lace</groupId>
  <artifactId>lace-delta-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


class FetchError(RuntimeError):
    """A pin, Maven or JAR problem (one line for the user)."""


def pins(pyproject: Path) -> dict[str, str]:
    """``{distribution name (lower case): version}`` of the ``==`` pins in ``[project].dependencies``.

    Raises
    ------
    FetchError
        When the file cannot be read or parsed.
    """
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise FetchError(f"cannot read the pins in {pyproject}: {e}") from e
    out = {}
    for dep in data.get("project", {}).get("dependencies", []):
        m = _PIN.match(re.sub(r"\[[^]]*\]", "", dep.split(";")[0]))  # extras and markers do not name versions
        if m is not None:
            out[m.group(1).lower()] = m.group(2)
    return out


def artifact_for(pyproject: Path) -> tuple[str, str]:
    """``(artifactId, version)`` of the connector pinned in ``pyproject``.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "pyproject.toml"
    >>> _ = p.write_text('[project]\\ndependencies = ["pyspark==4.2.0", "delta-spark==4.4.0"]\\n')
    >>> artifact_for(p)
    ('delta-spark_4.2_2.13', '4.4.0')
    """
    pinned = pins(pyproject)
    missing = [name for name in ("pyspark", "delta-spark") if name not in pinned]
    if missing:
        raise FetchError(f"{pyproject} pins no {' and no '.join(missing)} (expected name==version)")
    spark_minor = ".".join(pinned["pyspark"].split(".")[:2])
    return f"delta-spark_{spark_minor}_{SCALA}", pinned["delta-spark"]


def folder_name(artifact: str, version: str) -> str:
    """The folder the JARs go to: ``<artifact>-<version>`` (``archive/spark.py`` looks for the same name)."""
    return f"{artifact}-{version}"


def is_complete(folder: Path, artifact: str, version: str) -> bool:
    """Whether ``folder`` holds a finished fetch of this artifact (its marker names it)."""
    marker = folder / MARKER
    try:
        return marker.read_text(encoding="utf-8").split() == [f"{GROUP}:{artifact}:{version}"]
    except OSError:
        return False


def has_extension(jars: list[Path]) -> bool:
    """Whether one of ``jars`` holds the Delta SQL extension class."""
    for jar in jars:
        try:
            with zipfile.ZipFile(jar) as z:
                if EXTENSION_CLASS in z.namelist():
                    return True
        except (OSError, zipfile.BadZipFile):
            continue
    return False


def fetch(artifact: str, version: str, out: Path, *, mvn: str = "mvn", timeout_s: float = 900.0) -> list[Path]:
    """Resolve ``io.delta:artifact:version`` with Maven and copy its ``io.delta`` runtime JARs into ``out``.

    The JARs are copied into a temporary sibling folder first and moved into place only when they
    hold the extension class, so an interrupted fetch never leaves a folder that looks complete.

    Raises
    ------
    FetchError
        ``mvn`` not on PATH, resolution failed (Maven's last lines are in the message), or no
        extension class in the fetched JARs.
    """
    exe = shutil.which(mvn)
    if exe is None:
        raise FetchError(f"{mvn} is not on PATH (apt-get install maven), cannot fetch {GROUP}:{artifact}:{version}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=out.parent) as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(POM.format(group=GROUP, artifact=artifact, version=version), encoding="utf-8")
        staged = work / "jars"
        cmd = [
            exe, "-B", "-q", "-f", str(work / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DincludeGroupIds={GROUP}", "-DincludeScope=runtime", f"-DoutputDirectory={staged}",
        ]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)  # noqa: S603
        except subprocess.TimeoutExpired as e:
            what = f"{GROUP}:{artifact}:{version}"
            raise FetchError(f"mvn did not finish within {timeout_s:.0f} s resolving {what}") from e
        if done.returncode != 0:
            tail = " | ".join(line.strip() for line in (done.stdout + done.stderr).splitlines()[-6:] if line.strip())
            raise FetchError(f"mvn could not resolve {GROUP}:{artifact}:{version} (exit {done.returncode}): {tail}")
        jars = sorted(staged.glob("*.jar"))
        if not has_extension(jars):
            raise FetchError(f"{GROUP}:{artifact}:{version} fetched, but no JAR holds {EXTENSION_CLASS}")
        (staged / MARKER).write_text(f"{GROUP}:{artifact}:{version}\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)
    return sorted(out.glob("*.jar"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml", help="where the pins are")
    parser.add_argument("--out", type=Path, help="output folder (default: .jars/<artifact>-<version> in the checkout)")
    parser.add_argument("--optional", action="store_true", help="warn and exit 0 when the JARs cannot be had")
    parser.add_argument("--print-folder", action="store_true", help="print the default output folder and exit")
    args = parser.parse_args(argv)
    try:
        artifact, version = artifact_for(args.pyproject)
        out = args.out or REPO / ".jars" / folder_name(artifact, version)
        if args.print_folder:
            print(out)
            return 0
        if is_complete(out, artifact, version):
            print(out)
            return 0
        print(f"fetching {GROUP}:{artifact}:{version} and its {GROUP} runtime JARs with mvn into {out}",
              file=sys.stderr)
        jars = fetch(artifact, version, out)
    except FetchError as e:
        if args.optional:
            print(f"warning: {e}; LACE will read the archive with its filelist reader", file=sys.stderr)
            return 0
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("fetched: " + ", ".join(j.name for j in jars), file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
