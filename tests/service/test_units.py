"""Fast checks of the service's pure parts: settings, wire formats, signing, back-off."""
from __future__ import annotations

import hashlib
import hmac
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from engine.event_type import EventType
from service.core.config import Settings
from service.core.security import hash_api_key, new_api_key, signature_header, verify_signature, webhook_secret
from service.live.events import BodyError, EventInvalid, parse_body, validate_event
from service.webhooks.dispatcher import backoff_s


@pytest.mark.parametrize("value", ["changethis", "CHANGEME", "short-key"])
def test_settings_refuse_default_or_short_secrets(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LACE_SECRET_KEY", value)
    with pytest.raises(ValidationError, match="secret_key"):
        Settings()


def test_settings_default_to_embedded_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("LACE_DATABASE_URL", "LACE_ARCHIVE_PATH", "LACE_SECRET_KEY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("LACE_DATA_DIR", str(tmp_path))
    s = Settings()
    assert s.sqlalchemy_url == f"sqlite:///{tmp_path.resolve() / 'lace.db'}"
    assert s.archive_root == tmp_path / "archive"
    key = s.signing_key()
    assert len(key) >= 32 and (tmp_path / "secret.key").stat().st_mode & 0o077 == 0
    assert Settings().signing_key() == key  # generated once, then reused


def test_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    body = b'{"alert_id":1}'
    header = signature_header("whsec_k", body, timestamp_s=1_700_000_000)
    mac = hmac.new(b"whsec_k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={mac}"
    assert verify_signature("whsec_k", body, header, now_s=1_700_000_100)
    assert not verify_signature("whsec_k", body + b" ", header, now_s=1_700_000_100)
    assert not verify_signature("whsec_k", body, header, now_s=1_700_009_999)  # stale


def test_webhook_secrets_differ_per_webhook_and_server_key() -> None:
    a = webhook_secret(b"k" * 32, 1, "salt")
    assert a == webhook_secret(b"k" * 32, 1, "salt")
    assert len({a, webhook_secret(b"k" * 32, 2, "salt"), webhook_secret(b"j" * 32, 1, "salt")}) == 3


def test_api_keys_are_random_and_hashed() -> None:
    k1, k2 = new_api_key(), new_api_key()
    assert k1 != k2 and k1.startswith("lace_") and len(k1) > 40
    assert hash_api_key(k1) == hashlib.sha256(k1.encode()).hexdigest()


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    rng = random.Random(1)
    for attempt, (lo, hi) in enumerate([(0.5, 1), (1, 2), (2, 4), (4, 8), (5, 10), (5, 10)], start=1):
        assert all(lo <= backoff_s(attempt, base_s=1, max_s=10, rng=rng) <= hi for _ in range(50))


def test_bodies_json_array_object_and_ndjson() -> None:
    assert parse_body(b'[{"a":1},{"a":2}]', "application/json") == [({"a": 1}, None), ({"a": 2}, None)]
    assert parse_body(b'{"a":1}', "application/json") == [({"a": 1}, None)]
    assert parse_body(b'{"a":1}\n\n{"a":2}\n', "application/x-ndjson") == [({"a": 1}, 1), ({"a": 2}, 3)]
    assert parse_body(b'{"a":1}\n{"a":2}', "application/json") == [({"a": 1}, 1), ({"a": 2}, 2)]
    with pytest.raises(BodyError) as e:
        parse_body(b'{"a":1}\n{"a":', "application/x-ndjson")
    assert e.value.line == 2
    with pytest.raises(BodyError):
        parse_body(b"42", "application/json")


def test_event_validation_types_and_units() -> None:
    spec = EventType("T", {"s": "string", "i": "int", "f": "float", "b": "bool", "t": "timestamp"})
    raw: dict[str, Any] = {
        "type": "T",
        "ts": "2024-01-10T06:00:00+01:00",
        "s": "x",
        "i": 3,
        "f": 2,
        "b": True,
        "t": 1500,
    }
    _, eid, ts, attrs, ts_end = validate_event(raw, {"T": spec})
    assert ts_end == ts  # a point type
    assert eid is None and ts == 1_704_862_800_000_000
    assert attrs == {"s": "x", "i": 3, "f": 2.0, "b": True, "t": 1_500_000}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"i": 1.5}, "i"),
        ({"b": 1}, "b"),
        ({"i": True}, "i"),
        ({"f": "1"}, "f"),
        ({"i": 1 << 64}, "i"),
    ]
    for bad, field in cases:
        with pytest.raises(EventInvalid) as e:
            validate_event({**raw, **bad}, {"T": spec})
        assert e.value.field == field


def test_event_validation_null_is_a_missing_value_and_nan_is_refused() -> None:
    spec = EventType("T", {"s": "string", "f": "float"})
    _, _, _, attrs, _ = validate_event({"type": "T", "ts": 1, "s": None, "f": 2.5}, {"T": spec})
    assert attrs == {"f": 2.5}  # as an empty CSV cell or a JSONL null: left out of the event
    _, _, _, attrs, _ = validate_event({"type": "T", "ts": 1, "attrs": {"s": "x", "f": None}}, {"T": spec})
    assert attrs == {"s": "x"}
    with pytest.raises(EventInvalid) as e:
        validate_event({"type": "T", "ts": 1, "s": "x"}, {"T": spec})
    assert e.value.field == "f"  # absent is still refused: the attribute must be given, null or not
    with pytest.raises(BodyError):
        parse_body(b'{"type": "T", "ts": 1, "s": "x", "f": NaN}', "application/json")


def test_docs_rest_md_matches_the_openapi_schema() -> None:
    from service.api.docs_md import OUT, openapi, render

    assert OUT.read_text(encoding="utf-8") == render(*openapi()), "run: python -m service.api.docs_md"


def test_a_float_ts_too_large_to_scale_is_out_of_range_not_an_overflow() -> None:
    from service.live.events import parse_ts

    for raw in (-1.7976931348623157e308, 3.78e279, 1e17):
        with pytest.raises(ValueError, match="out of range"):
            parse_ts(raw)


@pytest.mark.parametrize("value", ["", "none", "None"])
def test_an_empty_pm_capacity_means_no_budget(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LACE_PM_CAPACITY", value)
    assert Settings().pm_capacity is None
    monkeypatch.setenv("LACE_PM_CAPACITY", "0")
    with pytest.raises(ValidationError):
        Settings()


def test_an_ended_type_holds_no_set_back_and_a_set_of_ended_types_reaches_the_end_of_time() -> None:
    from service.live.event_time import END_OF_TIME, EventTime

    et = EventTime(lambda t: 10, idle_timeout_s=3_600)
    et.observe("a", 1_000)
    et.observe("b", 2_000)
    assert et.watermark(["a", "b"]) == 1_000 - 10 - 1
    assert not et.idle(["a", "b"])
    et.end("a", 1_000)
    assert et.watermark(["a", "b"]) == 2_000 - 10 - 1  # a no longer holds b back
    assert et.watermark(["a"]) == END_OF_TIME  # every window of a statement reading only a closes
    assert et.idle(["a"]) and not et.idle(["a", "b"])
    assert et.furthest() == 2_000 - 10 - 1  # the rule graph's clock does not jump to the end of time
    et.reopen("a")
    assert et.watermark(["a"]) == 1_000 - 10 - 1


def test_the_replay_watermark_needs_every_type_and_ignores_idleness_and_ends() -> None:
    """:meth:`EventTime.watermark_reached`, what the restart replay advances to before the first checkpointed
    position (``recovery.settle``): never past the service's watermark then."""
    from service.live.event_time import EventTime

    et = EventTime(lambda t: {"a": 10, "b": 20}.get(t, 0), idle_timeout_s=0.0)  # every type idle at once
    assert et.watermark_reached(["a"]) is None and et.furthest() is None
    et.observe("a", 1_000)
    assert et.watermark_reached(["a", "b"]) is None  # b has no event: its watermark then is unknown
    assert et.watermark(["a", "b"]) == 1_000 - 10 - 1  # the live one skips it
    et.observe("b", 2_000)
    et.observe("a", 900)  # older: the newest stays
    assert et.watermark_reached(["a", "b", "a"]) == 1_000 - 10 - 1
    assert et.watermark_reached(["b"]) == 2_000 - 20 - 1
    assert et.watermark_reached([]) is None
    et.end("a", 1_000)
    assert et.watermark_reached(["a", "b"]) == 1_000 - 10 - 1  # no end of time
    assert et.furthest() == 2_000 - 20 - 1


def test_an_idle_sllaa_closes_its_open_subwindow_and_only_that() -> None:
    from engine.events import Event
    from engine.live_archived.plan import compile_live_archived
    from engine.live_archived.runner import make_runner
    from engine.live_archived.source import MemoryArchive

    plan = compile_live_archived(
        "LIVE PATTERN Pass p WHERE p.at = 'B' ARCHIVED PATTERN Pass q WHERE q.at = 'A' PARTITION BY car "
        "LOOKBACK 20 min JOIN p.car = q.car RETURN p.car AS car")
    archive = MemoryArchive()
    runner = make_runner("sllaa", plan, archive, tolerance_us=86_400_000_000)
    for e in (Event(1, "Pass", 0, {"car": 7, "at": "A"}), Event(2, "Pass", 60_000_000, {"car": 7, "at": "B"})):
        archive.append(e)
        assert runner.push(e) == []
    assert len(runner.waiting()) == 1  # T_L = 1 day: the subwindow waits
    assert [r.ids() for r in runner.idle()] == [{"p": [2], "q": [1]}]
    assert runner.waiting() == [] and runner.idle() == []
    assert runner.stats()["sllaa"]["closed_idle"] == 1


def test_the_receiver_of_operations_md_verifies_what_the_service_signs() -> None:
    """docs/operations.md *Your first alert*: its copy-paste receiver accepts the service's signatures (two `v1`
    during a rotation) and refuses a wrong secret or a changed body."""
    import re
    import time

    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text[text.index("## Your first alert"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    ns: dict[str, Any] = {"__name__": "receiver"}
    exec(code.group(1), ns)  # noqa: S102 (the documented receiver, as a user copies it)
    body, now = b'{"id": 1}', int(time.time())
    header = signature_header("whsec_new", body, timestamp_s=now, also=["whsec_old"])
    assert ns["verify"]("whsec_new", body, header) and ns["verify"]("whsec_old", body, header)
    assert not ns["verify"]("whsec_x", body, header) and not ns["verify"]("whsec_new", body + b" ", header)
    assert not ns["verify"]("whsec_new", body, signature_header("whsec_new", body, timestamp_s=now - 3_600))
