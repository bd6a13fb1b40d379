"""One long-lived, warmed SparkSession per process (docs/architecture.md section 7.8, ARCHIVE_NOTES.md).

Starting Spark costs ~9 s and its first jobs several more, so the session is built
once (:func:`get_spark`), warmed with a job of the extractor's shape, and reused.

Configuration (environment, or :class:`SparkSettings` fields):

* ``LACE_SPARK_MASTER``: Spark master, default ``local[*]``; a ``spark://`` URL runs
  the same code on a cluster.
* ``LACE_SPARK_CONF``: extra ``spark.*`` settings, ``key=value`` separated by ``;`` or
  newlines (e.g. ``spark.driver.memory=2g;spark.sql.shuffle.partitions=8``). They
  override the defaults below.
* ``LACE_DELTA_JAR``: the Delta Spark connector: a folder of JARs (every ``*.jar`` in it
  goes on ``spark.jars``) or one JAR. Default: the folder ``make delta-jars``
  (``deploy/fetch_delta_jars.py``) fills in the checkout, ``.jars/delta-spark_<spark
  major.minor>_2.13-<delta-spark version>``, named by the installed ``pyspark`` and
  ``delta-spark`` (both pinned in ``pyproject.toml``). ``none`` turns the connector off.
  Only when one of the JARs holds the Delta extension class are the Delta extension and
  catalog configured (with them but without the JAR every query fails) and the
  ``native`` reader chosen (:func:`reader_choice` says which, and why).

Always set: UTC everywhere (``TZ``, ``-Duser.timezone`` for driver and executors,
``spark.sql.session.timeZone``), the driver's class archive when the venv has one (``LACE_SPARK_CDS``,
:mod:`archive.class_archive`: a third of the JVM's start-up CPU), no UI, a raised parallel partition discovery
threshold (explicit file lists), Parquet dictionary filtering off (the main cost
of key lookups) and adaptive query execution off (it re-plans every small lookup).
Local masters also bind to 127.0.0.1 and, with the Delta connector, keep a table
version's file list in as many partitions as there are cores (Delta's data skipping
is a Spark job over it in every query).
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archive.class_archive import class_archive_setting, java_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
_UTC_JAVA = "-Duser.timezone=UTC"
_LOG4J = Path(__file__).with_name("log4j2.properties")
_DRIVER_JAVA = f"{_UTC_JAVA} -Dlog4j2.configurationFile=file:{_LOG4J}"  # errors only: no start-up banner

REPO = Path(__file__).resolve().parents[1]
JARS_DIR = REPO / ".jars"  # filled by `make delta-jars`; ignored by git
SCALA = "2.13"

_lock = threading.Lock()
_session: SparkSession | None = None
_timings: dict[str, float] = {}


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """How to build the process's SparkSession.

    Parameters
    ----------
    master : str
        Spark master URL (``local[*]``, ``local[2]``, ``spark://host:7077``).
    app_name : str
        Application name shown by the cluster.
    delta_jar : str, optional
        The Delta Spark connector: a folder of JARs or one JAR (enables the ``native`` reader).
    conf : Mapping[str, str]
        Extra ``spark.*`` settings, applied last.
    class_archive : str, optional
        The driver JVM's class-data-sharing archive (:mod:`archive.class_archive`), mapped when given.
    """

    master: str = "local[*]"
    app_name: str = "lace"
    delta_jar: str | None = None
    conf: Mapping[str, str] = field(default_factory=dict)
    class_archive: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SparkSettings:
        """Settings from ``LACE_SPARK_MASTER``, ``LACE_SPARK_CONF``, ``LACE_DELTA_JAR`` and ``LACE_SPARK_CDS``.

        An unset or empty ``LACE_DELTA_JAR`` means :func:`default_delta_jars`; ``none`` means no connector.

        >>> s = SparkSettings.from_env({"LACE_SPARK_CONF": "spark.driver.memory=2g; spark.a.b = c"})
        >>> s.master, dict(s.conf)
        ('local[*]', {'spark.driver.memory': '2g', 'spark.a.b': 'c'})
        """
        env = os.environ if environ is None else environ
        return cls(
            master=env.get("LACE_SPARK_MASTER") or "local[*]",
            delta_jar=_delta_jar_setting(env.get("LACE_DELTA_JAR", "")),
            conf=parse_conf(env.get("LACE_SPARK_CONF", "")),
            class_archive=class_archive_setting(env.get("LACE_SPARK_CDS", "")),
        )


def parse_conf(text: str) -> dict[str, str]:
    """``key=value`` items separated by ``;`` or newlines -> dict; keys must start with ``spark.``.

    Raises
    ------
    ValueError
        For an item without ``=`` or a key outside ``spark.*``.
    """
    out = {}
    for item in text.replace("\n", ";").split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.startswith("spark."):
            raise ValueError(f"LACE_SPARK_CONF item {item.strip()!r} must be spark.<name>=<value>")
        out[key] = value.strip()
    return out


def _delta_jar_setting(value: str) -> str | None:
    value = value.strip()
    if value.lower() == "none":
        return None
    return value or default_delta_jars()


def default_delta_jars() -> str | None:
    """The checkout's connector folder for the installed ``pyspark`` and ``delta-spark``, if it was fetched.

    ``.jars/delta-spark_<spark major.minor>_2.13-<delta-spark version>`` under the repository (the
    name ``deploy/fetch_delta_jars.py`` gives it); None when ``delta-spark`` is not installed or the
    folder is missing.
    """
    from importlib import metadata

    try:
        spark_version, delta_version = metadata.version("pyspark"), metadata.version("delta-spark")
    except metadata.PackageNotFoundError:
        return None
    folder = JARS_DIR / f"delta-spark_{'.'.join(spark_version.split('.')[:2])}_{SCALA}-{delta_version}"
    return str(folder) if folder.is_dir() else None


def delta_jar_paths(path: str | None) -> list[str]:
    """The JARs ``path`` names: every ``*.jar`` of a folder (sorted), or the file itself; [] for None or nothing."""
    if not path:
        return []
    p = Path(path)
    if p.is_dir():
        return [str(j) for j in sorted(p.glob("*.jar"))]
    return [str(p)] if p.is_file() else []


def jar_has_delta(path: str | None) -> bool:
    """Whether ``path`` (a JAR, or a folder of JARs) holds the Delta Spark extension class (checked before the JVM
    starts)."""
    wanted = DELTA_EXTENSION.replace(".", "/") + ".class"
    for jar in delta_jar_paths(path):
        try:
            with zipfile.ZipFile(jar) as z:
                if wanted in z.namelist():
                    return True
        except (OSError, zipfile.BadZipFile):
            continue
    return False


def reader_choice(settings: SparkSettings | None = None) -> tuple[str, str]:
    """``("native" | "filelist", why)``: the archive reader a session built with ``settings`` will use.

    Decided from the files alone (no JVM started): ``native`` when the connector is configured and
    holds the Delta extension class. The service logs this line once at start.
    """
    settings = settings or SparkSettings.from_env()
    if jar_has_delta(settings.delta_jar):
        return "native", f"Delta Spark connector from {settings.delta_jar}"
    if settings.delta_jar:
        return "filelist", f"{settings.delta_jar} holds no {DELTA_EXTENSION}; Spark reads the snapshots' Parquet files"
    return "filelist", (
        "no Delta Spark connector (run `make delta-jars`, which needs Maven, or set LACE_DELTA_JAR); "
        "Spark reads the Delta snapshots' Parquet files, listed by delta-rs"
    )


def build_conf(settings: SparkSettings) -> dict[str, str]:
    """Every ``spark.*`` setting the session is built with."""
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": (
            f"{_DRIVER_JAVA} {java_options(settings.class_archive)}" if settings.class_archive else _DRIVER_JAVA
        ),
        "spark.executor.extraJavaOptions": _UTC_JAVA,
        "spark.executorEnv.TZ": "UTC",
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
        "spark.hadoop.parquet.filter.dictionary.enabled": "false",
        # Archive requests are small broadcast joins collected at once: adaptive re-planning only adds
        # latency to them (measured: 0.85 s -> 0.42 s a lookup). Backfills may turn it back on.
        "spark.sql.adaptive.enabled": "false",
    }
    if settings.master.startswith("local"):
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.sql.shuffle.partitions"] = str(2 * (os.cpu_count() or 2))
    if jar_has_delta(settings.delta_jar):
        conf["spark.jars"] = ",".join(delta_jar_paths(settings.delta_jar))
        conf["spark.sql.extensions"] = DELTA_EXTENSION
        conf["spark.sql.catalog.spark_catalog"] = DELTA_CATALOG
        if settings.master.startswith("local"):
            # Delta keeps a version's file list (its snapshot state) in this many partitions and filters it with a
            # Spark job per query (data skipping): 50 by default, i.e. 50 tasks per lookup on a 2-core machine
            # (measured: a native lookup's JVM CPU 1.6-1.8 s -> 0.9 s with 2)
            conf["spark.databricks.delta.snapshotPartitions"] = str(os.cpu_count() or 2)
    for key, value in settings.conf.items():
        if key.endswith("extraJavaOptions") and _UTC_JAVA not in value:
            value = f"{value} {_UTC_JAVA}".strip()  # UTC is not negotiable
        conf[key] = value
    conf["spark.sql.session.timeZone"] = "UTC"
    return conf


def get_spark(settings: SparkSettings | None = None, *, warm: bool = True) -> SparkSession:
    """The process's SparkSession, built (and warmed) on the first call.

    Parameters
    ----------
    settings : SparkSettings, optional
        Used by the first call only (default: :meth:`SparkSettings.from_env`).
    warm : bool
        Run :func:`warm_up` right after the session starts.
    """
    global _session
    with _lock:
        if _session is not None:
            return _session
        settings = settings or SparkSettings.from_env()
        # The JVM inherits the environment: UTC and loopback before it starts.
        os.environ["TZ"] = "UTC"
        time.tzset()
        if settings.master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            # Python workers (applyInArrow in backfills) need this interpreter's packages, not plain python3
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        t0 = time.perf_counter()
        builder = SparkSession.builder.master(settings.master).appName(settings.app_name)
        for key, value in build_conf(settings).items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        _timings["start_s"] = time.perf_counter() - t0
        if warm:
            t1 = time.perf_counter()
            warm_up(session)
            _timings["warm_up_s"] = time.perf_counter() - t1
        _session = session
        return session


def stop_spark() -> None:
    """Stop the process's session (tests and shutdown); the next :func:`get_spark` starts a new one."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None


def timings() -> dict[str, float]:
    """Seconds spent starting (``start_s``) and warming (``warm_up_s``) the session."""
    return dict(_timings)


def native_delta_available(spark: SparkSession) -> bool:
    """Whether ``format("delta")`` works: the extension is configured and its class is on the classpath."""
    if spark.conf.get("spark.sql.extensions", "") != DELTA_EXTENSION:
        return False
    jvm: Any = spark.sparkContext._jvm
    try:
        loader = jvm.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(DELTA_EXTENSION, False, loader)
        return True
    except Exception:
        return False


def jvm_memory(spark: SparkSession) -> dict[str, int]:
    """Driver JVM heap in bytes: ``used``, ``committed``, ``max``."""
    rt: Any = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()  # type: ignore[union-attr]
    total, free, most = int(rt.totalMemory()), int(rt.freeMemory()), int(rt.maxMemory())
    return {"used": total - free, "committed": total, "max": most}


def warm_up(spark: SparkSession) -> None:
    """Run one job shaped like an archive request (Parquet file list, broadcast range join, toArrow).

    The first jobs of a session pay for class loading and code generation; paying it
    at start keeps it out of the first user request.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    with tempfile.TemporaryDirectory(prefix="lace-spark-warm-") as tmp:
        ts = pa.array(range(0, 2_000_000, 1_000), pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        n = len(ts)
        keys = pa.array([str(i % 7) for i in range(n)])
        data = pa.table({"id": pa.array(range(n), pa.int64()), "ts": ts, "key": keys})
        path = Path(tmp) / "date=1970-01-01"
        path.mkdir()
        pq.write_table(data, path / "part-0.parquet")
        df = spark.read.option("basePath", tmp).parquet(str(path / "part-0.parquet"))
        req = spark.createDataFrame(pa.table({"k": ["1", "2"], "lo": [0, 500_000], "hi": [400_000, 900_000]}))
        req = req.select("k", F.timestamp_micros("lo").alias("lo"), F.timestamp_micros("hi").alias("hi"))
        cond = (df["key"] == req["k"]) & (df["ts"] >= req["lo"]) & (df["ts"] < req["hi"])
        df.join(F.broadcast(req), cond).select("id", F.unix_micros("ts").alias("ts")).toArrow()
