"""Service settings (pydantic-settings): environment variables ``LACE_*`` or a ``.env`` file.

Every setting has an embedded default so ``lace serve`` runs on a fresh checkout: a SQLite
file and a local Delta directory under ``LACE_DATA_DIR`` (``./lace-data``), local Spark.
``LACE_ENV_FILE`` names another env file. Units are in the names (``_s``, ``_bytes``).
"""
from __future__ import annotations

import os
import secrets
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SECRETS = frozenset({"changethis", "changeme", "secret", "lace", "password", "default"})
MIN_SECRET_CHARS = 32
SECRET_KEY_FILE = "secret.key"


class Settings(BaseSettings):
    """What ``lace serve`` reads from its environment.

    Attributes
    ----------
    data_dir : Path
        Where the embedded stores live: ``lace.db`` (SQLite), ``archive/`` (Delta tables and
        WAL), ``secret.key`` (when ``secret_key`` is not set).
    database_url : str | None
        SQLAlchemy URL; default ``sqlite:///<data_dir>/lace.db``. PostgreSQL:
        ``postgresql+psycopg://user@host:5432/db``.
    archive_enabled : bool
        Archive every ingested event (WAL + Delta) and replay it on restart. Off: events
        only feed the live matchers and a restart loses partial matches.
    archive_path : Path | None
        Archive root; default ``<data_dir>/archive``.
    spark_master : str
        Spark master URL of the backfills (``local[2]``, or ``spark://host:7077``).
    secret_key : SecretStr | None
        Derives webhook signing secrets; generated into ``<data_dir>/secret.key`` when unset.
        Known defaults (``changethis``...) and keys shorter than 32 characters are refused.
    bootstrap_admin_key : SecretStr | None
        When set, an admin+read+ingest API key with this value exists after start
        (for deployments that cannot run ``lace keys create``); same rules as ``secret_key``.
    """

    model_config = SettingsConfigDict(
        env_prefix="LACE_", env_file=os.environ.get("LACE_ENV_FILE", ".env"), extra="ignore"
    )

    data_dir: Path = Path("lace-data")
    database_url: str | None = None
    archive_enabled: bool = True
    archive_path: Path | None = None
    archive_flush_rows: Annotated[int, Field(ge=1)] = 50_000
    archive_flush_age_s: Annotated[float, Field(gt=0)] = 5.0
    archive_fsync: bool = True
    archive_maintenance_interval_s: Annotated[float, Field(ge=0)] = 3600.0
    """Seconds between archive maintenance passes (compact, checkpoint, vacuum); 0 disables them."""
    archive_retention_hours: Annotated[int, Field(ge=1)] = 168
    """Vacuum keeps removed files this long: longer than the longest query or backfill."""
    spark_master: str = "local[2]"
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    log_level: str = "info"
    access_log: bool = True

    secret_key: SecretStr | None = None
    bootstrap_admin_key: SecretStr | None = None

    max_body_bytes: Annotated[int, Field(ge=1024)] = 16 << 20
    """Largest ``POST /events`` body, bytes (413 above)."""
    max_admin_body_bytes: Annotated[int, Field(ge=1024)] = 1 << 20
    """Largest body of every other route, bytes."""
    max_events_per_request: Annotated[int, Field(ge=1)] = 100_000
    max_rejections_reported: Annotated[int, Field(ge=1)] = 1_000
    replay_max_s: Annotated[float, Field(gt=0)] = 7 * 86_400.0
    """Restart replay never reaches further back than this much event time (queries without WITHIN)."""

    max_future_skew_s: Annotated[float, Field(gt=0, le=100 * 365 * 86_400)] = 86_400.0
    """An event more than this ahead of the wall clock and of its type's watermark is refused (422)."""
    idle_timeout_s: Annotated[float, Field(gt=0)] = 60.0
    """An event type that sent nothing for this long (wall clock) stops holding queries' watermarks back."""
    dedup_window: Annotated[int, Field(ge=0, le=10_000_000)] = 200_000
    """Producer ids remembered for idempotent ingest (a retry within them is not taken twice)."""
    max_query_components: Annotated[int, Field(ge=1, le=100_000)] = 64
    """Pattern components a query may have (both sides of a live-and-archived query together)."""
    max_window_s: Annotated[float, Field(gt=0)] = 31 * 86_400.0
    """Longest WITHIN a query may have (a restart replays that much of the archive)."""
    max_lookback_s: Annotated[float, Field(gt=0)] = 366 * 86_400.0
    """Longest LOOKBACK a live-and-archived query may have."""
    query_max_match_s: Annotated[float, Field(gt=0)] = 5.0
    """CPU seconds one query may spend matching one request's events (or one watermark's release of its
    derived events; time waiting for the partial-match store or for other threads does not count); past it
    the query stops with the reason in its stats (``failed``) and in the answer's ``query_errors``, and the
    ingest and the other queries go on. Resume or update it to start it again."""
    thread_switch_interval_ms: Annotated[float, Field(gt=0, le=100)] = 1.0
    """Python's thread switch interval in the service (``sys.setswitchinterval``): live-and-archived workers
    and archive requests run on threads; a shorter interval than Python's 5 ms keeps them from holding ingest
    up each time it waits for I/O (the convoy effect)."""
    gc_thaw_s: Annotated[float, Field(ge=0)] = 600.0
    """The garbage-collector policy (:mod:`service.gc_policy`): what survives a full collection is frozen
    (``gc.freeze``), so full collections walk only newer objects instead of pausing every thread for up to
    0.7 s with thousands of statements; every ``gc_thaw_s`` seconds everything is collected once (one pause)
    to reclaim cyclic garbage among frozen objects (replaced statements). 0: CPython's collector unchanged."""
    pm_capacity: Annotated[int | None, Field(ge=1)] = 100_000
    """Partial matches a query keeps in memory by default (``pm_capacity`` per query overrides it); beyond it
    STPM (or TPM) spills to the database's partial-match table (001 section 5). Empty or ``none``: no budget."""
    pm_policy: Literal["stpm", "tpm"] = "stpm"
    """Default spilling policy of a query."""
    la_tolerance_s: Annotated[float, Field(ge=0, le=30 * 86_400)] = 60.0
    """SLLAA's tolerated delay ``T_L`` (event-time seconds) of a live-and-archived query that gives none."""
    la_lookup_workers: Annotated[int, Field(ge=1, le=64)] = 2
    """Archive requests (Spark jobs) of live-and-archived queries that run at once, over all queries."""
    la_requests_in_flight: Annotated[int, Field(ge=1, le=4096)] = 256
    """Archive requests of one live-and-archived query (run in a process of its own) waiting at the shared scheduler
    at once, so that one read answers many; the query's later requests wait in its process until an answer comes
    back (none is dropped). One thread of the query's process per request in flight."""
    la_process: bool = True
    """Run the live-and-archived queries (live matchers, archived matching, joins) in the worker pool's processes
    (``workers``), so they do not share the GIL with ingest; Spark stays in the service (``false``: threads of
    the service)."""
    workers: Annotated[int | None, Field(ge=1, le=256)] = None
    """Worker processes hosting the live-and-archived queries (default: the machine's cores minus one, at least
    one). A query goes to the worker hosting the fewest queries, ties to the lowest index."""
    worker_backlog: Annotated[int, Field(ge=1)] = 1_000_000
    """Events queued in the service for one worker at most (a slow worker, or one restarting after it died);
    past it ``POST /events`` answers 503 with Retry-After and takes nothing."""
    worker_fault: str | None = None
    """A test fault: ``raise:<query name>:<n>`` makes that query raise on its n-th batch in its worker's first
    start (the worker restarts; docs/operations.md)."""
    la_checkpoint_s: Annotated[float, Field(gt=0)] = 1.0
    """How often a live-and-archived query records how far back a restart must replay (wall seconds)."""
    ingest_order_bucket_s: Annotated[float, Field(gt=0, le=3600)] = 1.0
    """Wall seconds one bucket of the ingest order's index covers (service/live/ingest_order.py): a restart replays
    from the first position of the bucket holding a statement's event-time horizon, so finer buckets start replays
    closer to what they need; the index keeps 4,096 buckets (older ones merge, coarser, never wrong)."""

    webhook_max_attempts: Annotated[int, Field(ge=1, le=1000)] = 60
    """Attempts of one delivery (while its endpoint's circuit is closed) before it is dead-lettered."""
    webhook_backoff_base_s: Annotated[float, Field(gt=0)] = 1.0
    webhook_backoff_max_s: Annotated[float, Field(gt=0)] = 3600.0
    """Retry n waits ``min(max, base * 2^(n-1))`` seconds, jittered to ``[d/2, d]``: with the defaults
    the 59 retries span 24.1 h at the least, 36 h on average (:meth:`retry_span_s`)."""
    webhook_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    webhook_concurrency: Annotated[int, Field(ge=1)] = 64
    """Attempts in flight (connections); an attempt holds its slot until its outcome is committed, so this also
    bounds the deliveries a crash sends again (issue 25: 32 held (b)'s commit -> webhook p99 at 8-14 s, 64 at 3-7 s)."""
    webhook_poll_s: Annotated[float, Field(gt=0)] = 1.0
    """The longest the webhook dispatcher sleeps (seconds): new alerts wake it, and after a round that leased nothing
    it sleeps until the next retry, lease end or circuit probe comes due."""
    webhook_batch: Annotated[int, Field(ge=1)] = 200
    """Deliveries leased and not yet finished at most; the dispatcher claims again when half are done."""
    webhook_breaker_failures: Annotated[int, Field(ge=0)] = 5
    """Consecutive endpoint failures (no answer, 5xx, 408, 429) that open a webhook's circuit: its
    deliveries are then held, not retried nor dead-lettered, and one is sent as a probe; 0: no breaker."""
    webhook_breaker_probe_s: Annotated[float, Field(gt=0)] = 30.0
    """First probe this long after the circuit opens; each failed probe doubles the wait (jittered)."""
    webhook_breaker_probe_max_s: Annotated[float, Field(gt=0)] = 600.0
    webhook_rotation_grace_s: Annotated[int, Field(ge=0, le=30 * 86_400)] = 86_400
    """After a secret rotation, deliveries are signed with the old secret too for this long (default)."""
    webhook_allow_loopback: bool = False
    """Accept webhook URLs on loopback addresses (127.0.0.0/8, ::1, ``localhost``)."""
    webhook_allow_private: bool = False
    """Accept private, shared and unique-local addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7)."""
    webhook_allow_link_local: bool = False
    """Accept link-local addresses (169.254/16 with the cloud metadata service, fe80::/10)."""

    @field_validator("pm_capacity", mode="before")
    @classmethod
    def _no_budget(cls, value: object) -> object:
        """``LACE_PM_CAPACITY=`` (empty) or ``none``: no partial-match budget."""
        if isinstance(value, str) and value.strip().lower() in ("", "none"):
            return None
        return value

    @field_validator("secret_key", "bootstrap_admin_key")
    @classmethod
    def _refuse_default_secrets(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        raw = value.get_secret_value()
        if raw.strip().lower() in DEFAULT_SECRETS:
            raise ValueError(
                "is a well-known default; generate one (python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        if len(raw) < MIN_SECRET_CHARS:
            raise ValueError(f"must be at least {MIN_SECRET_CHARS} characters")
        return value

    @model_validator(mode="after")
    def _check_backoff(self) -> Settings:
        if self.webhook_backoff_max_s < self.webhook_backoff_base_s:
            raise ValueError("webhook_backoff_max_s must be >= webhook_backoff_base_s")
        if self.webhook_breaker_probe_max_s < self.webhook_breaker_probe_s:
            raise ValueError("webhook_breaker_probe_max_s must be >= webhook_breaker_probe_s")
        return self

    def retry_span_s(self) -> tuple[float, float]:
        """Shortest and longest time, seconds, from a delivery's first attempt to its last one
        (all retries jittered low / high), not counting request time or a circuit's holding.

        >>> Settings(_env_file=None, webhook_max_attempts=3, webhook_backoff_base_s=1).retry_span_s()
        (1.5, 3.0)
        """
        total = sum(
            min(self.webhook_backoff_max_s, self.webhook_backoff_base_s * 2 ** min(n - 1, 60))
            for n in range(1, self.webhook_max_attempts)
        )
        return total / 2, total

    @cached_property
    def sqlalchemy_url(self) -> str:
        """The database URL, defaulting to the SQLite file under ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'lace.db').resolve()}"

    @cached_property
    def archive_root(self) -> Path:
        return self.archive_path if self.archive_path is not None else self.data_dir / "archive"

    def signing_key(self) -> bytes:
        """The server key that derives webhook secrets (``secret_key``, else a generated file)."""
        if self.secret_key is not None:
            return self.secret_key.get_secret_value().encode()
        path = self.data_dir / SECRET_KEY_FILE
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(48))
        key = path.read_text().strip()
        if len(key) < MIN_SECRET_CHARS:
            raise ValueError(f"{path}: the key must be at least {MIN_SECRET_CHARS} characters")
        return key.encode()


def get_settings() -> Settings:
    """Settings from the environment (a fresh read each call: tests change the environment)."""
    return Settings()
