"""Archive maintenance: compaction, vacuum, checkpoints (docs/architecture.md section 7.8).

Run from ``lace archive compact|vacuum|checkpoint`` (:mod:`archive.cli`) or
periodically by the service (:func:`maintain`). Every operation is a delta-rs commit
(or a log checkpoint) and keeps the writer's exactly-once state: the app
transaction versions live in the snapshot and in checkpoints.

* **compact** rewrites the small files of *closed* days (``date`` before a cutoff,
  default today UTC) into few large ones, optionally z-ordered by the type's key, in
  Parquet row groups of :data:`DEFAULT_ROW_GROUP_ROWS` rows: with the rows clustered by
  key, each row group holds a narrow key range, and its statistics let a key lookup skip
  the others (Arrow and Spark's Parquet reader both do); a small target size cuts a day
  into files of key ranges, which the Delta log's statistics skip. Days already compacted are remembered
  (``_lace/compacted.json``) and skipped until files are added to them. The files it removes stay on disk until vacuum;
  readers never read them (they read the snapshot's active files).
* **vacuum** deletes files no longer in the table and older than the retention. A
  reader that resolved its file list before the vacuum fails if the retention is
  shorter than its job, so retentions shorter than the longest query are refused.
* **checkpoint** writes a Parquet checkpoint of the log so opening the table does not
  replay every JSON commit.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from archive.schema import load_catalog
from archive.writer import table_names

DEFAULT_RETENTION_HOURS = 168
DEFAULT_LONGEST_QUERY_S = 3_600
DEFAULT_ROW_GROUP_ROWS = 16_384  # rows per Parquet row group of compacted files (delta-rs writes ~1M otherwise)
DONE_FILE = "_lace/compacted.json"  # per type and day: the files a compaction left, so it is not redone


class RetentionTooShortError(ValueError):
    """A vacuum retention not longer than the longest query: running readers could lose files."""


def _names(root: str | Path, types: Iterable[str] | None) -> list[str]:
    present = table_names(root)
    if types is None:
        return present
    wanted = list(types)
    missing = [t for t in wanted if t not in present]
    if missing:
        raise ValueError(f"no archived table for type(s) {', '.join(missing)} under {root}")
    return wanted


def compact(
    root: str | Path,
    *,
    types: Iterable[str] | None = None,
    before: date | str | None = None,
    z_order: bool = False,
    target_size: int | None = None,
    row_group_rows: int | None = DEFAULT_ROW_GROUP_ROWS,
) -> list[dict[str, Any]]:
    """Compact each closed day (``date < before``, default today UTC) holding more than one file.

    Parameters
    ----------
    types : Iterable[str], optional
        Event types (default: every table under ``root``).
    before : date | str, optional
        First day that is still open (``YYYY-MM-DD``).
    z_order : bool
        Cluster each day's rows by the type's key (types without a key are compacted):
        files then hold disjoint key ranges and key lookups prune by file statistics.
    target_size : int, optional
        Target file size in bytes (delta-rs default otherwise). With ``z_order``, a
        small target splits a day into several key ranges; e.g. 256 KiB for ~100k
        events a day makes ~10 files a day and lets a batched lookup read a tenth.
    row_group_rows : int, optional
        Rows per Parquet row group of the files written (None: delta-rs's default, about a million,
        i.e. one row group per day for most types).

    A day already compacted in the same way, with no file added since, is skipped, so a
    periodic run only rewrites the days that changed.

    Returns
    -------
    list of dict
        One per rewritten day: ``type``, ``date``, ``files_removed``, ``files_added``.
    """
    from deltalake import DeltaTable, WriterProperties

    cutoff = str(before) if before is not None else datetime.now(UTC).date().isoformat()
    props = None if row_group_rows is None else WriterProperties(max_row_group_size=row_group_rows)
    catalog = load_catalog(root)
    done = _load_done(root)
    out = []
    for name in _names(root, types):
        dt = DeltaTable(str(Path(root) / name))
        key = catalog[name].partition_key if name in catalog else None
        layout = "z_order" if z_order and key is not None else "compact"
        files_by_day: dict[str, list[str]] = {}
        for path in dt.file_uris():
            files_by_day.setdefault(_day_of(path), []).append(path)
        for day, files in sorted(files_by_day.items()):
            fingerprint = [layout, target_size, row_group_rows, sorted(files)]
            if day >= cutoff or done.get(name, {}).get(day) == fingerprint:
                continue  # open, or already in this layout with no file added since
            if len(files) <= 1 and layout == "compact":
                continue
            where = [("date", "=", day)]
            if layout == "z_order":
                metrics = dt.optimize.z_order(
                    [key], partition_filters=where, target_size=target_size, writer_properties=props  # type: ignore[list-item]
                )
            else:
                metrics = dt.optimize.compact(partition_filters=where, target_size=target_size, writer_properties=props)
            kept = dt.file_uris(file_pruning_predicate=where)
            done.setdefault(name, {})[day] = [layout, target_size, row_group_rows, sorted(kept)]
            if metrics.get("numFilesRemoved", 0):
                out.append(
                    {
                        "type": name,
                        "date": day,
                        "files_removed": metrics.get("numFilesRemoved", 0),
                        "files_added": metrics.get("numFilesAdded", 0),
                    }
                )
    _save_done(root, done)
    return out


def _day_of(path: str) -> str:
    return path.split("date=", 1)[1][:10]


def _load_done(root: str | Path) -> dict[str, dict[str, list[Any]]]:
    path = Path(root) / DONE_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _save_done(root: str | Path, done: dict[str, dict[str, list[Any]]]) -> None:
    path = Path(root) / DONE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(done), encoding="utf-8")
    os.replace(tmp, path)


def vacuum(
    root: str | Path,
    *,
    types: Iterable[str] | None = None,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    longest_query_s: int = DEFAULT_LONGEST_QUERY_S,
    dry_run: bool = False,
) -> dict[str, list[str]]:
    """Delete unreferenced files older than ``retention_hours``; return them per type.

    Raises
    ------
    RetentionTooShortError
        When ``retention_hours`` (in seconds) is below ``longest_query_s``, the longest
        archive job expected, in seconds.
    """
    from deltalake import DeltaTable

    if retention_hours < 0 or retention_hours * 3_600 < longest_query_s:
        raise RetentionTooShortError(
            f"vacuum retention {retention_hours} h is shorter than the longest query ({longest_query_s} s): "
            "a running archive request could lose its files"
        )
    return {
        name: DeltaTable(str(Path(root) / name)).vacuum(
            retention_hours=retention_hours, dry_run=dry_run, enforce_retention_duration=False
        )
        for name in _names(root, types)
    }


def checkpoint(root: str | Path, *, types: Iterable[str] | None = None, cleanup: bool = False) -> dict[str, int]:
    """Write a checkpoint at each table's current version (and, with ``cleanup``, drop expired log files).

    Returns
    -------
    dict[str, int]
        The checkpointed version per type.
    """
    from deltalake import DeltaTable

    out = {}
    for name in _names(root, types):
        dt = DeltaTable(str(Path(root) / name))
        dt.create_checkpoint()
        if cleanup:
            dt.cleanup_metadata()
        out[name] = dt.version()
    return out


def maintain(
    root: str | Path,
    *,
    z_order: bool = True,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    longest_query_s: int = DEFAULT_LONGEST_QUERY_S,
) -> dict[str, Any]:
    """The service's periodic job: compact closed days, checkpoint, vacuum."""
    return {
        "compacted": compact(root, z_order=z_order),
        "checkpoints": checkpoint(root),
        "vacuumed": {
            t: len(files)
            for t, files in vacuum(root, retention_hours=retention_hours, longest_query_s=longest_query_s).items()
        },
    }
