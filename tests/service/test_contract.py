"""The API contract (issue 13, failure 8), on a real service: content types, one answer to malformed
JSON, echoed values cut short, LQL nesting with a real position, ``Allow`` on 405, the documented
401/403 of ``/metrics``, and Swagger UI / ReDoc served without any other host (headless Chromium)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.service_process import ServiceProcess
from tests.service.test_api_e2e import drop_query, ev, make_type, post


def _events_seen(c: httpx.Client, qid: int) -> int:
    return int(c.get(f"/queries/{qid}").json()["stats"]["events"])


@pytest.fixture
def typed(service: ServiceProcess, t0: int) -> tuple[httpx.Client, str, int, int]:
    c = service.client()
    t = make_type(c)
    qid = c.post("/queries", json={"text": drop_query(t)}).json()["id"]
    return c, t, qid, t0


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_is_415_and_changes_nothing(
    typed: tuple[httpx.Client, str, int, int], content_type: str
) -> None:
    c, t, qid, t0 = typed
    body = [ev(t, t0 + 1_000, "A", 1.0)]
    import json

    r = c.post("/events", content=json.dumps(body), headers={"content-type": content_type})
    assert r.status_code == 415, r.text
    assert r.json()["detail"][0]["field"] == "header.Content-Type"
    assert _events_seen(c, qid) == 0
    r = c.post("/queries", content=json.dumps({"text": drop_query(t, "other")}), headers={"content-type": content_type})
    assert r.status_code == 415 and all(q["name"] != "other" for q in c.get("/queries").json())
    # JSON (with a charset, or a +json type) and NDJSON still go through
    ok = post(c, body)
    assert ok.status_code == 200 and _events_seen(c, qid) == 1
    nd = json.dumps(ev(t, t0 + 2_000, "A", 1.0)) + "\n"
    assert c.post("/events", content=nd, headers={"content-type": "application/x-ndjson"}).status_code == 200
    r = c.patch(f"/event-types/{t}", content=b"{}", headers={"content-type": "application/merge-patch+json"})
    assert r.status_code == 200
    r = c.patch(f"/event-types/{t}", content=b"{}", headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def test_malformed_json_is_one_400_with_line_and_column_everywhere(typed: tuple[httpx.Client, str, int, int]) -> None:
    c, t, qid, _ = typed
    broken = b'{\n  "name": "x",\n  "oops" 1\n}'  # line 3, column 10: a ':' is missing
    answers: dict[str, Any] = {}
    for method, path in [("POST", "/events"), ("POST", "/queries"), ("POST", "/event-types"),
                         ("PATCH", f"/event-types/{t}"), ("POST", "/webhooks"), ("POST", "/keys"),
                         ("PUT", f"/queries/{qid}"), ("POST", "/backfills")]:  # fmt: skip
        r = c.request(method, path, content=broken, headers={"content-type": "application/json"})
        assert r.status_code == 400, (path, r.text)
        (err,) = r.json()["detail"]
        assert err["field"] == "body" and err["reason"].startswith("malformed JSON: "), (path, err)
        answers[path] = (err["line"], err["column"])
    assert set(answers.values()) == {(3, 10)}, answers


def test_values_from_the_request_are_not_echoed_whole(typed: tuple[httpx.Client, str, int, int]) -> None:
    c, t, _, t0 = typed
    long = "S" * 400_000
    r = post(c, [{"type": long, "ts": t0}, {**ev(t, t0 + 1, "A", 1.0), long: 1}])
    assert r.status_code == 422 and len(r.content) < 2_000, len(r.content)
    reasons = " ".join(x["field"] + " " + x["reason"] for x in r.json()["rejections"])
    assert reasons.count("… (4000") == 2, reasons
    r = c.post("/queries", json={"text": f"NAME q\nPATTERN SEQ({'T' * 60_000} a)\nWITHIN 1 min"})
    assert r.status_code == 422 and len(r.content) < 2_000 and r.json()["detail"][0]["line"] == 2
    r = c.post("/keys", json={"name": "k" * 100_000, "scopes": ["read"]})
    assert r.status_code == 422 and len(r.content) < 2_000


def test_a_query_nested_too_deeply_names_where(service: ServiceProcess) -> None:
    c = service.client()
    t = make_type(c)
    text = "NAME deep\nPATTERN " + "SEQ(" * 400 + f"{t} a" + ")" * 400 + "\nWITHIN 1 min"
    r = c.post("/queries", json={"text": text})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert "nested too deeply" in err["reason"] and err["line"] == 2 and err["column"] > 1
    assert text.splitlines()[1][err["column"] - 1 :].startswith("SEQ(")


def test_405_allows_every_method_of_the_path(service: ServiceProcess) -> None:
    c = service.client()
    cases = {"/queries": "GET, POST", "/queries/1": "DELETE, GET, PUT", "/event-types/x": "DELETE, GET, PATCH",
             "/healthz": "GET", "/webhooks/1": None}  # fmt: skip
    for path, allow in cases.items():
        r = c.request("OPTIONS", path)
        assert r.status_code == 405
        if allow is not None:
            assert r.headers["allow"] == allow, (path, r.headers["allow"])
        assert "GET" in r.headers["allow"]


def test_every_route_that_needs_a_key_documents_401_and_403(service: ServiceProcess) -> None:
    spec = httpx.get(service.base + "/openapi.json").json()
    assert httpx.get(service.base + "/metrics").status_code == 401
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if path != "/healthz":
                assert {"401", "403"} <= set(op["responses"]), (method, path)
            if "requestBody" in op:
                assert "415" in op["responses"], (method, path)


# ------------------------------------------------------------------------------ docs pages


def test_docs_pages_load_only_from_the_service(service: ServiceProcess) -> None:
    for page, asset in (("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")):
        html = httpx.get(service.base + page).text
        urls = re.findall(r"""(?:src|href|url)\s*[=:(]\s*['"]([^'"]+)['"]""", html)
        assert any(asset in u for u in urls), html
        assert not [u for u in urls if u.startswith(("http:", "https:", "//"))], urls
        for u in urls:
            r = httpx.get(service.base + u)
            assert r.status_code == 200 and len(r.content) > 0, u
    js = httpx.get(service.base + "/docs-assets/swagger-ui-bundle.js")
    assert len(js.content) > 500_000 and "javascript" in js.headers["content-type"]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _headless(browser: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    # every host but the loopback resolves to nothing: a page that needs a CDN stays blank
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--virtual-time-budget=15000",
         "--window-size=1280,1000", *args, url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_swagger_ui_renders_offline_in_a_headless_browser(service: ServiceProcess, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on PATH (apt-get install chromium): the page is checked without a browser above")
    dom = _headless(browser, service.base + "/docs", "--dump-dom").stdout
    assert "opblock" in dom and "/event-types" in dom and "/queries/{id}" in dom, dom[:2000]
    dom = _headless(browser, service.base + "/redoc", "--dump-dom").stdout
    assert "Ingest events" in dom and "Register a query" in dom, dom[:2000]
    shot = tmp_path / "swagger-ui.png"
    _headless(browser, service.base + "/docs", f"--screenshot={shot}")
    from PIL import Image

    with Image.open(shot) as img:
        colors = img.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 50, "the screenshot is blank"
