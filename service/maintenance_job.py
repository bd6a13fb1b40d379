"""The service's periodic archive maintenance (issue 3): compact closed days, checkpoint, vacuum.

Runs ``archive.maintenance.maintain`` in a worker thread every
``LACE_ARCHIVE_MAINTENANCE_INTERVAL_S`` seconds (0 disables it); vacuum keeps
``LACE_ARCHIVE_RETENTION_HOURS`` of removed files, which ``maintain`` refuses to set below the
longest query it is told about.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio

from service.core.config import Settings

log = logging.getLogger("lace.maintenance")


class MaintenanceJob:
    """An asyncio task that maintains the archive periodically; ``last`` holds the latest result."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.task: asyncio.Task[None] | None = None
        self.last: dict[str, Any] | None = None
        self.runs = 0

    def start(self) -> None:
        if self.settings.archive_enabled and self.settings.archive_maintenance_interval_s > 0:
            self.task = asyncio.create_task(self._loop(), name="lace-archive-maintenance")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
            self.task = None

    async def run_once(self) -> dict[str, Any]:
        """One maintenance pass (in a worker thread: delta-rs calls block)."""
        from archive.maintenance import maintain

        s = self.settings
        self.last = await anyio.to_thread.run_sync(
            lambda: maintain(s.archive_root, retention_hours=s.archive_retention_hours)
        )
        self.runs += 1
        return self.last

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.archive_maintenance_interval_s)
            try:
                log.info("archive maintenance: %s", await self.run_once())
            except Exception:  # keep the service up; the next pass tries again
                log.exception("archive maintenance failed")
