"""Spark settings: UTC and loopback always, LACE_SPARK_* from the environment, the Delta connector only with its JAR."""
from __future__ import annotations

import os
import zipfile

import pytest

from archive.spark import DELTA_EXTENSION, SparkSettings, build_conf, jar_has_delta, parse_conf


def test_defaults_are_utc_loopback_no_ui_and_cheap_key_lookups():
    conf = build_conf(SparkSettings())
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert "-Duser.timezone=UTC" in conf["spark.driver.extraJavaOptions"]
    assert "-Duser.timezone=UTC" in conf["spark.executor.extraJavaOptions"]
    assert conf["spark.executorEnv.TZ"] == "UTC"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.hadoop.parquet.filter.dictionary.enabled"] == "false"
    assert int(conf["spark.sql.sources.parallelPartitionDiscovery.threshold"]) >= 10_000
    assert "spark.sql.extensions" not in conf  # without the JAR the Delta catalog breaks every query


def test_environment_sets_master_and_extra_settings_but_not_the_time_zone():
    s = SparkSettings.from_env(
        {
            "LACE_SPARK_MASTER": "spark://head:7077",
            "LACE_SPARK_CONF": "spark.driver.memory=2g\nspark.sql.session.timeZone=Europe/Paris;"
            "spark.executor.extraJavaOptions=-Xss4m",
        }
    )
    conf = build_conf(s)
    assert s.master == "spark://head:7077"
    assert conf["spark.driver.memory"] == "2g"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.executor.extraJavaOptions"] == "-Xss4m -Duser.timezone=UTC"
    assert "spark.driver.bindAddress" not in conf  # a cluster driver must be reachable


def test_bad_extra_settings_are_refused():
    with pytest.raises(ValueError, match="spark.<name>=<value>"):
        parse_conf("driver.memory=2g")


def test_the_delta_connector_is_configured_only_when_the_jar_holds_it(tmp_path):
    jar = tmp_path / "delta-spark.jar"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr(DELTA_EXTENSION.replace(".", "/") + ".class", b"")
    other = tmp_path / "other.jar"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("x.class", b"")
    assert jar_has_delta(str(jar)) and not jar_has_delta(str(other)) and not jar_has_delta(str(tmp_path / "none.jar"))
    conf = build_conf(SparkSettings(delta_jar=str(jar)))
    assert conf["spark.jars"] == str(jar) and conf["spark.sql.extensions"] == DELTA_EXTENSION
    assert int(conf["spark.databricks.delta.snapshotPartitions"]) <= (os.cpu_count() or 2)  # not 50 tasks a lookup
    assert "spark.sql.extensions" not in build_conf(SparkSettings(delta_jar=str(other)))
    cluster = build_conf(SparkSettings(master="spark://h:7077", delta_jar=str(jar)))
    assert "spark.databricks.delta.snapshotPartitions" not in cluster


def test_driver_logs_errors_only_with_the_bundled_log4j_config() -> None:
    """The driver JVM gets archive/log4j2.properties (no start-up banner in `lace demo` / `lace backfill`)."""
    from pathlib import Path

    from archive.spark import SparkSettings, build_conf

    opts = build_conf(SparkSettings(master="local[1]"))["spark.driver.extraJavaOptions"]
    path = Path(opts.split("-Dlog4j2.configurationFile=file:")[1].split()[0])
    assert path.is_file() and "rootLogger.level = error" in path.read_text()
    assert "-Duser.timezone=UTC" in opts


def test_the_driver_maps_the_class_archive_only_when_it_exists(tmp_path) -> None:
    """``LACE_SPARK_CDS``: a file given (or the venv's) is mapped, silently ignored by a JVM that cannot use it;
    ``none`` or a missing file starts the driver without one (archive/class_archive.py)."""
    jsa = tmp_path / "classes.jsa"
    assert SparkSettings.from_env({"LACE_SPARK_CDS": str(jsa)}).class_archive is None  # not written yet
    jsa.write_bytes(b"x")
    settings = SparkSettings.from_env({"LACE_SPARK_CDS": str(jsa)})
    assert settings.class_archive == str(jsa)
    opts = build_conf(settings)["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={jsa}" in opts and "-Xshare:auto" in opts and "-Xlog:cds=off" in opts
    assert "-Duser.timezone=UTC" in opts and "-Dlog4j2.configurationFile=" in opts
    assert SparkSettings.from_env({"LACE_SPARK_CDS": "none"}).class_archive is None
    assert "SharedArchiveFile" not in build_conf(SparkSettings())["spark.driver.extraJavaOptions"]
    assert "SharedArchiveFile" not in build_conf(settings)["spark.executor.extraJavaOptions"]


def test_no_class_archive_is_written_when_turned_off(tmp_path, monkeypatch, capsys) -> None:
    """``LACE_SPARK_CDS=none``: ``make spark-cds`` writes nothing (it wrote a file named ``none`` before) and starts
    no JVM."""
    from archive.class_archive import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LACE_SPARK_CDS", "none")
    assert main([]) == 0
    assert "none" in capsys.readouterr().out and not list(tmp_path.iterdir())
