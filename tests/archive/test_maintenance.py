"""Maintenance (compact, vacuum, checkpoint) and the ``lace archive`` commands, on real Delta tables."""
from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest
from typer.testing import CliRunner

import archive.cli as cli
import archive.maintenance as maintenance
from archive.cli import archive_app
from archive.maintenance import RetentionTooShortError, checkpoint, compact, maintain, vacuum
from archive.writer import APP_ID, ArchiveWriter, committed_seq
from tests.archive.archive_data import DAY_US, PARKING, TRAFFIC, make_events, read_ids

pytestmark = pytest.mark.integration
runner = CliRunner()


@pytest.fixture
def filled(archive_root):
    events = make_events(600, seed=41)
    with ArchiveWriter(archive_root, types=[TRAFFIC, PARKING], flush_rows=100) as w:
        for i in range(0, 600, 100):
            w.append(events[i : i + 100])
    return archive_root, events


def files_per_day(root, name):
    from deltalake import DeltaTable

    days: dict[str, int] = {}
    for f in DeltaTable(str(root / name)).file_uris():
        day = f.split("date=")[1][:10]
        days[day] = days.get(day, 0) + 1
    return days


def test_compaction_of_closed_days_keeps_the_rows_and_the_writer_state(filled):
    root, events = filled
    seq = committed_seq(root, "traffic")
    days = sorted(files_per_day(root, "traffic"))
    assert max(files_per_day(root, "traffic").values()) > 1
    done = compact(root, types=["traffic"], before=days[-1], z_order=True)  # the last day stays open
    assert {d["date"] for d in done} == set(days[:-1])
    after = files_per_day(root, "traffic")
    assert all(after[d] == 1 for d in days[:-1])
    assert sorted(read_ids(root, "traffic")) == sorted(e.id for e in events if e.type == "traffic")
    from deltalake import DeltaTable

    assert DeltaTable(str(root / "traffic")).transaction_version(APP_ID) == seq  # exactly-once state survives
    assert compact(root, types=["traffic"], before=days[-1], z_order=True) == []  # nothing changed: nothing redone


def test_z_order_with_a_small_target_splits_days_into_key_ranges(archive_root):
    events = make_events(6_000, seed=42, types=(TRAFFIC,), span_us=DAY_US // 4)
    with ArchiveWriter(archive_root, types=[TRAFFIC], flush_rows=1_000) as w:
        w.append(events)
    compact(archive_root, before="2100-01-01", z_order=True, target_size=20_000)
    from deltalake import DeltaTable

    adds = pa.table(DeltaTable(str(archive_root / "traffic")).get_add_actions(flatten=True))
    assert adds.num_rows >= 2 * len(files_per_day(archive_root, "traffic"))  # several files a day
    ranges = sorted(zip(adds["partition.date"].to_pylist(), adds["min.key"].to_pylist(), adds["max.key"].to_pylist()))
    for (d1, _, hi1), (d2, lo2, _) in zip(ranges, ranges[1:]):
        assert d1 != d2 or hi1 <= lo2  # within a day, files hold disjoint key ranges (one key may straddle two)
    assert sorted(read_ids(archive_root, "traffic")) == [e.id for e in events]


def test_a_compacted_day_is_in_row_groups_of_key_ranges_that_a_key_lookup_skips(archive_root):
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    events = make_events(6_000, seed=43, types=(TRAFFIC,), span_us=DAY_US // 4)
    with ArchiveWriter(archive_root, types=[TRAFFIC], flush_rows=1_000) as w:
        w.append(events)
    compact(archive_root, before="2100-01-01", z_order=True, row_group_rows=500)
    files = DeltaTable(str(archive_root / "traffic")).file_uris()
    groups = [pq.ParquetFile(f).metadata.row_group(i) for f in files for i in range(pq.ParquetFile(f).num_row_groups)]
    assert len(groups) >= 6_000 // 500 and all(g.num_rows <= 500 for g in groups)
    fragments = [frag for f in files for frag in ds.dataset(f, format="parquet").get_fragments()]
    read = sum(len(frag.split_by_row_group(ds.field("key") == "s3")) for frag in fragments)
    assert 0 < read < len(groups) / 3  # statistics skip most row groups for one key of 12
    assert sorted(read_ids(archive_root, "traffic")) == sorted(e.id for e in events)
    assert compact(archive_root, before="2100-01-01", z_order=True, row_group_rows=500) == []
    assert compact(archive_root, before="2100-01-01", z_order=True)  # another row group size: rewritten once


def test_vacuum_refuses_a_retention_shorter_than_the_longest_query(filled):
    root, _ = filled
    with pytest.raises(RetentionTooShortError, match="shorter than the longest query"):
        vacuum(root, retention_hours=1, longest_query_s=7_200)
    assert vacuum(root, retention_hours=2, longest_query_s=7_200, dry_run=True) == {"parking": [], "traffic": []}


def test_checkpoint_and_periodic_maintenance(filled):
    root, events = filled
    versions = checkpoint(root)
    assert set(versions) == {"traffic", "parking"}
    assert list((root / "traffic" / "_delta_log").glob("*.checkpoint.parquet"))
    report = maintain(root, retention_hours=0, longest_query_s=0)
    assert report["compacted"] and set(report["vacuumed"]) == {"traffic", "parking"}
    for name in ("traffic", "parking"):
        assert sorted(read_ids(root, name)) == sorted(e.id for e in events if e.type == name)


def test_cli_commands_print_json_and_refuse_bad_input(filled):
    root, _ = filled
    out = runner.invoke(archive_app, ["checkpoint", "--root", str(root), "--type", "traffic"])
    assert out.exit_code == 0, out.output
    assert set(json.loads(out.stdout)) == {"traffic"}
    out = runner.invoke(archive_app, ["compact", "--root", str(root), "--before", "2100-01-01"])
    assert out.exit_code == 0 and json.loads(out.stdout)
    out = runner.invoke(archive_app, ["vacuum", "--root", str(root), "--retention-hours", "0"])
    assert out.exit_code == 2 and out.stderr.startswith("error: vacuum retention 0 h")
    args = ["vacuum", "--root", str(root), "--retention-hours", "0", "--longest-query-s", "0"]
    out = runner.invoke(archive_app, args)
    assert out.exit_code == 0 and json.loads(out.stdout)["traffic"]
    out = runner.invoke(archive_app, ["compact", "--root", str(root / "nowhere")])
    assert out.exit_code == 2 and "no archive there" in out.stderr
    out = runner.invoke(archive_app, ["checkpoint", "--root", str(root), "--type", "weather"])
    assert out.exit_code == 2 and "weather" in out.stderr


def test_the_cli_loads_without_the_archive_libraries_and_shares_the_defaults():
    code = "import sys, archive.cli; print(sorted(m for m in ('pyarrow', 'deltalake', 'pyspark') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert cli.DEFAULT_RETENTION_HOURS == maintenance.DEFAULT_RETENTION_HOURS
    assert cli.DEFAULT_LONGEST_QUERY_S == maintenance.DEFAULT_LONGEST_QUERY_S
    assert cli.DEFAULT_ROW_GROUP_ROWS == maintenance.DEFAULT_ROW_GROUP_ROWS
