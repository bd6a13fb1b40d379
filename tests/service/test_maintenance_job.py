"""The service's periodic archive maintenance runs maintain() on the real archive and keeps every event."""
from __future__ import annotations

import asyncio

from archive.writer import ArchiveWriter
from service.core.config import Settings
from service.maintenance_job import MaintenanceJob
from tests.archive.archive_data import TRAFFIC, make_events, read_ids


def test_a_maintenance_pass_compacts_closed_days_and_loses_nothing(tmp_path):
    root = tmp_path / "archive"
    events = make_events(600, types=(TRAFFIC,))
    with ArchiveWriter(root, types=[TRAFFIC], flush_rows=50) as w:  # 12 small commits over 3 days
        w.append(events)
    settings = Settings(data_dir=tmp_path, archive_path=root, archive_maintenance_interval_s=0)
    job = MaintenanceJob(settings)
    result = asyncio.run(job.run_once())
    assert set(result) == {"compacted", "checkpoints", "vacuumed"}
    assert result["compacted"], "closed days with many small files should be compacted"
    assert sorted(read_ids(root, "traffic")) == sorted(e.id for e in events)
    assert job.runs == 1


def test_the_periodic_task_is_off_when_the_interval_is_zero(tmp_path):
    job = MaintenanceJob(Settings(data_dir=tmp_path, archive_maintenance_interval_s=0))

    async def start_stop() -> bool:
        job.start()
        started = job.task is not None
        await job.stop()
        return started

    assert asyncio.run(start_stop()) is False
