"""The FastAPI application: ``create_app(settings)``.

Start-up (the lifespan): open the database, create the bootstrap key when configured,
open the archive writer (its WAL replays into Delta), load the event types and the active
queries into the live runtime, replay the archive's recent past into their matchers,
then start the webhook dispatcher. Shut-down stops the dispatcher and flushes the archive.
Migrations are not run here but by ``lace serve`` / ``lace db upgrade`` before it.
"""
from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

import anyio
from fastapi import FastAPI
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from engine.limits import QueryLimits
from service import statement, statement_lifecycle
from service.api.content_type import ContentTypeMiddleware
from service.api.docs_ui import install_docs
from service.api.limits import BodyLimitMiddleware
from service.api.routes import (
    alerts,
    backfills,
    deliveries,
    event_types,
    events,
    health,
    keys,
    operators,
    queries,
    webhooks,
)
from service.api_key import create_key
from service.core.config import Settings, get_settings
from service.core.errors import install_handlers
from service.core.faults import crash_point
from service.core.metrics import Metrics
from service.core.security import hash_api_key
from service.db.models import ApiKeyRow, EventTypeRow, QueryRow
from service.db.session import make_engine, make_session_factory
from service.event_type import event_type
from service.gc_policy import GcPolicy
from service.live.runtime import LiveRuntime, RunOptions
from service.maintenance_job import MaintenanceJob
from service.webhooks.dispatcher import Dispatcher

log = logging.getLogger("lace.service")
ROUTERS = tuple(
    m.router
    for m in (health, event_types, queries, events, alerts, webhooks, deliveries, backfills, keys, operators)
)


def _version() -> str:
    try:
        return metadata.version("lace")
    except metadata.PackageNotFoundError:
        return "0"


def _bootstrap_key(sessions: sessionmaker[Session], settings: Settings) -> None:
    if settings.bootstrap_admin_key is None:
        return
    token = settings.bootstrap_admin_key.get_secret_value()
    with sessions() as s:
        if s.execute(select(ApiKeyRow.id).where(ApiKeyRow.key_hash == hash_api_key(token))).first() is None:
            create_key(s, name="bootstrap", scopes=["admin", "ingest", "read"], token=token)


def _open_archive(settings: Settings, rows: list[EventTypeRow]) -> Any:
    if not settings.archive_enabled:
        return None
    from archive.writer import ArchiveWriter

    writer = ArchiveWriter(
        settings.archive_root,
        types=[event_type(r) for r in rows],
        flush_rows=settings.archive_flush_rows,
        flush_age_s=settings.archive_flush_age_s,
        fsync=settings.archive_fsync,
        crash_point=crash_point,
    )
    writer.start()
    return writer


def _open_pm_store(settings: Settings) -> Any:
    from service.db.pm_store import SqlPartialMatchStore

    return SqlPartialMatchStore(settings.sqlalchemy_url, migrate=False)


def start_services(settings: Settings, metrics: Metrics) -> tuple[Engine, sessionmaker[Session], LiveRuntime]:
    """Open the stores and rebuild the live runtime (blocking; run in a thread)."""
    from engine.build import engine_build
    from engine.detector import compile_statement
    from engine.lql.errors import QueryError

    log.info("engine: %s", engine_build())  # the mypyc-compiled hot path or pure Python (issue 45)
    engine = make_engine(settings.sqlalchemy_url)
    sessions = make_session_factory(engine)
    _bootstrap_key(sessions, settings)
    with sessions() as s:
        type_rows = list(s.scalars(select(EventTypeRow)))
        query_rows = list(s.scalars(select(QueryRow).where(QueryRow.state == "active").order_by(QueryRow.id)))
    archive = _open_archive(settings, type_rows)
    source = None
    if archive is not None:
        from archive.spark import reader_choice

        reader, why = reader_choice()
        log.info("archive reader: %s (%s)", reader, why)
        from archive.archived_source import LazyArchiveSource

        source = LazyArchiveSource(settings.archive_root, archive.buffer, spark_master=settings.spark_master)
    runtime = LiveRuntime(
        sessions=sessions,
        metrics=metrics,
        archive=archive,
        max_reported=settings.max_rejections_reported,
        source=source,
        pm_store=_open_pm_store(settings),
        defaults=RunOptions(
            algorithm="sllaa",
            tolerance_us=round(settings.la_tolerance_s * 1e6),
            pm_capacity=settings.pm_capacity,
            pm_policy=settings.pm_policy,
        ),
        lookup_workers=settings.la_lookup_workers,
        requests_in_flight=settings.la_requests_in_flight,
        la_process=settings.la_process,
        workers=settings.workers,
        worker_backlog=settings.worker_backlog,
        worker_fault=settings.worker_fault,
        ingest_order_bucket_s=settings.ingest_order_bucket_s,
        max_future_skew_us=round(settings.max_future_skew_s * 1e6),
        idle_timeout_s=settings.idle_timeout_s,
        dedup_window=settings.dedup_window,
        replay_max_us=int(settings.replay_max_s * 1e6),
        limits=QueryLimits(
            max_components=settings.max_query_components,
            max_window_us=round(settings.max_window_s * 1e6),
            max_lookback_us=round(settings.max_lookback_s * 1e6),
            max_match_s=settings.query_max_match_s,
        ),
    )
    for row in type_rows:
        runtime.set_type(event_type(row))
    for q in query_rows:
        try:
            # the plan its trial chose (issue 16); the service's limits are not checked again
            compiled = statement.as_chosen(q, compile_statement(q.text, runtime.schemas()), runtime.schemas())
            statement_lifecycle.run(runtime, q, compiled, q.active_since_us, restored=True)
        except (QueryError, ValueError) as e:
            log.error("query %s (%d) cannot start, left stopped: %s", q.name, q.id, e)
            continue
    if archive is not None:
        from service.live.recovery import rebuild

        stats = rebuild(runtime, settings.archive_root, {r.name: event_type(r) for r in type_rows})
        log.info("restart replay: %s", stats)
    return engine, sessions, runtime


async def _checkpoints(runtime: LiveRuntime, every_s: float, gc_policy: GcPolicy) -> None:
    """Every ``every_s`` seconds: advance queries over idle streams (:meth:`LiveRuntime.tick`), record
    the live-and-archived queries' restart points, and let the GC policy thaw when its time comes."""
    while True:
        await anyio.sleep(every_s)
        try:
            await anyio.to_thread.run_sync(runtime.tick)
            await anyio.to_thread.run_sync(runtime.checkpoint)
            await anyio.to_thread.run_sync(gc_policy.maybe_thaw)
        except Exception:
            log.exception("the periodic watermark advance or restart checkpoint failed")


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def integer_bounds(node: Any) -> Any:
    """``node`` (an OpenAPI document, or part of it) with the bounds of its integer schemas as integers, in place:
    FastAPI's OpenAPI models hold every bound as a float (``"maximum": 2592000000.0`` for ``le=2592000000``).

    >>> integer_bounds({"type": "integer", "minimum": 0.0, "items": [{"type": "number", "maximum": 1.0}]})
    {'type': 'integer', 'minimum': 0, 'items': [{'type': 'number', 'maximum': 1.0}]}
    """
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for k in _BOUNDS:
                v = node.get(k)
                if isinstance(v, float) and v.is_integer():
                    node[k] = int(v)
        for v in node.values():
            integer_bounds(v)
    elif isinstance(node, list):
        for v in node:
            integer_bounds(v)
    return node


def create_app(settings: Settings | None = None) -> FastAPI:
    """The LACE REST service (OpenAPI at ``/openapi.json``; Swagger UI at ``/docs`` and ReDoc at ``/redoc``,
    their assets served by the service itself)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics = Metrics()
        sys.setswitchinterval(settings.thread_switch_interval_ms / 1_000)
        engine, sessions, runtime = await anyio.to_thread.run_sync(lambda: start_services(settings, metrics))
        dispatcher = Dispatcher(sessions=sessions, settings=settings, metrics=metrics)
        app.state.settings, app.state.metrics = settings, metrics
        app.state.sessions, app.state.runtime, app.state.dispatcher = sessions, runtime, dispatcher
        await dispatcher.start()
        runtime.results.on_deliveries = dispatcher.wake
        maintenance = MaintenanceJob(settings)
        app.state.maintenance = maintenance
        maintenance.start()
        runner = None
        if runtime.archive is not None:
            from service.backfills import BackfillRunner

            runner = BackfillRunner(
                sessions,
                settings.archive_root,
                settings.spark_master,
                flush_archive=runtime.archive.flush,
                on_deliveries=dispatcher.wake,
                metrics=metrics,
            )
            await anyio.to_thread.run_sync(runner.start)
        app.state.backfills = runner
        gc_policy = GcPolicy(settings.gc_thaw_s)
        gc_policy.install()  # after the stored queries started: they are frozen
        checkpoints = asyncio.create_task(_checkpoints(runtime, settings.la_checkpoint_s, gc_policy))
        try:
            yield
        finally:
            gc_policy.uninstall()
            checkpoints.cancel()
            runtime.results.on_deliveries = None
            await anyio.to_thread.run_sync(runtime.checkpoint)
            await anyio.to_thread.run_sync(runtime.close)
            if runner is not None:
                await anyio.to_thread.run_sync(runner.stop)
            await maintenance.stop()
            await dispatcher.stop()
            if runtime.archive is not None:
                await anyio.to_thread.run_sync(runtime.archive.close)
            engine.dispose()

    app = FastAPI(
        title="LACE",
        version=_version(),
        summary="Live-and-archived complex event detection: register LQL queries, ingest events, get alerts.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    install_handlers(app)
    install_docs(app)
    app.add_middleware(ContentTypeMiddleware)
    app.add_middleware(
        BodyLimitMiddleware, ingest_bytes=settings.max_body_bytes, other_bytes=settings.max_admin_body_bytes
    )
    for router in ROUTERS:
        app.include_router(router)
    app.webhooks.include_router(webhooks.outgoing)  # documented under the OpenAPI `webhooks` (what is sent)
    make_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = integer_bounds(make_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
