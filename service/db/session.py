"""Engines and sessions.

SQLite (the embedded default) runs in WAL mode with ``synchronous=FULL`` (a committed alert
survives a power cut), foreign keys on and a busy timeout; PostgreSQL through psycopg 3.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


def now_us() -> int:
    """Wall clock, int microseconds since the Unix epoch (UTC)."""
    return time.time_ns() // 1_000


def make_engine(url: str, **kwargs: Any) -> Engine:
    """A SQLAlchemy engine for ``url`` with the pragmas above (creates the SQLite file's directory)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


_write_gates: weakref.WeakKeyDictionary[Engine, threading.RLock] = weakref.WeakKeyDictionary()
_gates_lock = threading.Lock()


def _write_gate(factory: sessionmaker[Session]) -> AbstractContextManager[Any]:
    """One lock per SQLite engine that the service's own transactions (alerts, delivery marks, checkpoints)
    take in turn: SQLite has one writer at a time, and a writer that finds the file locked sleeps in its
    busy handler (1 ms, 2 ms, 5 ms ... up to 100 ms steps) instead of being woken when the lock is free;
    queued on a Python lock, the next one starts at once. Nothing for PostgreSQL (row locks)."""
    return _gate_of(factory.kw.get("bind"))


def session_write_gate(session: Session) -> AbstractContextManager[Any]:
    """The write gate (:func:`_write_gate`) of ``session``'s engine, for a request's commit that must not sleep
    in SQLite's busy handler while others wait for it (a deferred statement update commits under the
    runtime's stamp lock: those sleeps made its p99 0.19 s). Take no other lock inside it."""
    return _gate_of(session.get_bind())


def _gate_of(bind: Any) -> AbstractContextManager[Any]:
    if not isinstance(bind, Engine) or bind.dialect.name != "sqlite":
        return nullcontext()
    with _gates_lock:
        gate = _write_gates.get(bind)
        if gate is None:
            gate = _write_gates[bind] = threading.RLock()
    return gate


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on error (on SQLite, one such transaction at a
    time per engine: see :func:`_write_gate`; the body must not wait for another lock)."""
    with _write_gate(factory), factory() as session, session.begin():
        yield session
