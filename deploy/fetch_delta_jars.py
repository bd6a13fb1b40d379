#!/usr/bin/env python3
"""Fetch the Delta Spark connector from a Maven repository and bundle it into one JAR.

Used by ``deploy/Dockerfile`` (build argument ``DELTA_VERSION``); runs on any Python 3.11 with the
standard library only, so it also works on a host being set up without Docker::

    python3 deploy/fetch_delta_jars.py --version 4.4.1 --out /opt/lace/jars

Why a bundle: ``delta-spark`` needs its ``io.delta`` runtime dependencies (at least ``delta-storage``)
loaded by the same class loader (a JAR given alone fails with ``NoClassDefFoundError:
io/delta/storage/LogStore``), while LACE passes exactly one path, ``LACE_DELTA_JAR``, to
``spark.jars`` (archive/spark.py). So the ``io.delta`` artifacts of the POM's compile/runtime
dependencies are fetched (transitively), checked against the repository's ``.sha1`` files and
merged into ``<artifact>-<version>-bundle.jar``: entries of ``META-INF/services/`` are concatenated,
signature files dropped, and any other duplicate keeps the first copy (delta-spark's). Other
dependencies (antlr4-runtime, Scala, Spark itself) are provided by Spark and only listed.

The output path is printed on the last line of stdout. Exit status 1 on any failure (download,
checksum, or a bundle without ``io.delta.sql.DeltaSparkSessionExtension``).
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
import urllib.request
import zipfile
from pathlib import Path
from xml.etree import ElementTree

DEFAULT_REPO = "https://repo1.maven.org/maven2"
DEFAULT_ARTIFACT = "delta-spark_4.2_2.13"  # pinned with pyspark 4.2.0 (Scala 2.13); see ARCHIVE_NOTES.md
GROUP = "io.delta"
EXTENSION_CLASS = "io/delta/sql/DeltaSparkSessionExtension.class"
RUNTIME_SCOPES = {None, "", "compile", "runtime"}
_SIGNATURE = re.compile(r"^META-INF/[^/]+\.(SF|RSA|DSA|EC)$", re.IGNORECASE)
_PROPERTY = re.compile(r"\$\{([^}]+)\}")


class FetchError(RuntimeError):
    """A download, checksum or POM problem (one line for the user)."""


def _url(repo: str, group: str, artifact: str, version: str, ext: str) -> str:
    return f"{repo.rstrip('/')}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.{ext}"


def _get(url: str, timeout_s: float = 120.0) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (http(s) or file URL by design)
            data: bytes = response.read()
            return data
    except OSError as e:  # URLError and HTTPError are OSErrors
        raise FetchError(f"cannot fetch {url}: {e}") from e


def fetch_verified(repo: str, group: str, artifact: str, version: str, ext: str) -> bytes:
    """The artifact's bytes, refused unless they match the repository's ``.sha1``."""
    url = _url(repo, group, artifact, version, ext)
    data = _get(url)
    expected = _get(url + ".sha1").decode("ascii", "replace").split()
    if not expected:
        raise FetchError(f"{url}.sha1 is empty")
    actual = hashlib.sha1(data).hexdigest()  # noqa: S324 (Maven Central's published checksum; integrity, not secrecy)
    if actual.lower() != expected[0].lower():
        raise FetchError(f"{url}: sha1 {actual} does not match the published {expected[0]}")
    return data


def _text(node: ElementTree.Element | None, tag: str, ns: str) -> str | None:
    child = None if node is None else node.find(f"{ns}{tag}")
    return None if child is None or child.text is None else child.text.strip()


def pom_dependencies(pom: bytes, own_version: str) -> list[tuple[str, str, str | None, str | None, bool]]:
    """``(groupId, artifactId, version, scope, optional)`` of a POM's direct dependencies.

    ``${project.version}`` and the POM's own ``<properties>`` are substituted.

    >>> pom = (b'<project xmlns="http://maven.apache.org/POM/4.0.0"><version>9</version><dependencies>'
    ...        b'<dependency><groupId>io.delta</groupId><artifactId>delta-storage</artifactId>'
    ...        b'<version>${project.version}</version></dependency></dependencies></project>')
    >>> pom_dependencies(pom, "9")
    [('io.delta', 'delta-storage', '9', None, False)]
    """
    root = ElementTree.fromstring(pom)
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    props = {"project.version": _text(root, "version", ns) or own_version, "version": own_version}
    properties = root.find(f"{ns}properties")
    if properties is not None:
        for prop in properties:
            props[prop.tag.removeprefix(ns)] = (prop.text or "").strip()

    def resolve(value: str | None) -> str | None:
        return None if value is None else _PROPERTY.sub(lambda m: props.get(m.group(1), m.group(0)), value)

    out = []
    deps = root.find(f"{ns}dependencies")
    for dep in [] if deps is None else deps.findall(f"{ns}dependency"):
        out.append(
            (
                resolve(_text(dep, "groupId", ns)) or "",
                resolve(_text(dep, "artifactId", ns)) or "",
                resolve(_text(dep, "version", ns)),
                _text(dep, "scope", ns),
                (_text(dep, "optional", ns) or "false").lower() == "true",
            )
        )
    return out


def collect(repo: str, artifact: str, version: str) -> tuple[list[tuple[str, bytes]], list[str]]:
    """The JARs to bundle (``artifact`` first, then its ``io.delta`` runtime dependencies) and the others' names."""
    jars: list[tuple[str, bytes]] = []
    provided: list[str] = []
    seen: set[str] = set()
    todo = [(artifact, version)]
    while todo:
        name, ver = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        jars.append((f"{name}-{ver}.jar", fetch_verified(repo, GROUP, name, ver, "jar")))
        pom = fetch_verified(repo, GROUP, name, ver, "pom")
        for group, dep, dep_ver, scope, optional in pom_dependencies(pom, ver):
            if optional or scope not in RUNTIME_SCOPES:
                continue
            if group == GROUP:
                if not dep_ver:
                    raise FetchError(f"{name}-{ver}.pom: no version for {group}:{dep}")
                todo.append((dep, dep_ver))
            else:
                provided.append(f"{group}:{dep}:{dep_ver or '?'}")
    return jars, provided


def bundle(jars: list[tuple[str, bytes]], out: Path) -> Path:
    """Merge ``jars`` (the first wins on duplicates; services files are concatenated) into ``out``."""
    import io

    services: dict[str, list[bytes]] = {}
    written: set[str] = set()
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for _name, data in jars:
            with zipfile.ZipFile(io.BytesIO(data)) as src:
                for info in src.infolist():
                    entry = info.filename
                    if info.is_dir() or _SIGNATURE.match(entry):
                        continue
                    if entry.startswith("META-INF/services/"):
                        lines = [ln for ln in src.read(info).splitlines() if ln.strip()]
                        kept = services.setdefault(entry, [])
                        kept.extend(ln for ln in lines if ln not in kept)
                        continue
                    if entry in written:
                        continue
                    written.add(entry)
                    dst.writestr(info, src.read(info))
        for entry, lines in sorted(services.items()):
            dst.writestr(entry, b"\n".join(lines) + b"\n")
    with zipfile.ZipFile(tmp) as check:
        if EXTENSION_CLASS not in check.namelist():
            tmp.unlink()
            raise FetchError(f"the bundle holds no {EXTENSION_CLASS}: is {jars[0][0]} the Delta Spark connector?")
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", required=True, help="delta-spark version, e.g. 4.4.1")
    parser.add_argument("--artifact", default=DEFAULT_ARTIFACT, help=f"default {DEFAULT_ARTIFACT}")
    parser.add_argument("--repo", default=DEFAULT_REPO, help=f"Maven repository (mirror) URL, default {DEFAULT_REPO}")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    args = parser.parse_args(argv)
    try:
        jars, provided = collect(args.repo, args.artifact, args.version)
        args.out.mkdir(parents=True, exist_ok=True)
        path = bundle(jars, args.out / f"{args.artifact}-{args.version}-bundle.jar")
    except (FetchError, zipfile.BadZipFile, ElementTree.ParseError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("bundled: " + ", ".join(name for name, _ in jars))
    if provided:
        print("expected from Spark's own jars (not bundled): " + ", ".join(provided))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
