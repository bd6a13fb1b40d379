"""Write ``docs/rest.md`` from the OpenAPI schema: ``python -m service.api.docs_md [OUT]``.

A test checks that the committed file matches the schema, so the reference cannot drift.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[2] / "docs" / "rest.md"
INTRO = """# REST API reference

Generated from the OpenAPI schema by `python -m service.api.docs_md` (do not edit by hand; a test
compares it with the schema). The live schema is at `/openapi.json`, the interactive docs at `/docs`
(Swagger UI) and `/redoc` (ReDoc), their assets served by the service itself: they work on a host
without internet access ([screenshot, taken offline by headless Chromium](img/swagger-ui-offline.png)).

- **Keys**: every route but `/healthz` needs `Authorization: Bearer <key>` (`lace keys create --scope ...`).
  A key holds one or more scopes (`admin`, `ingest`, `read`); a route accepts only its own scope.
  401: no or unknown key; 403: the key lacks the scope.
- **Time** on the wire: ISO-8601 with an offset (`2024-01-10T06:00:00.5+01:00`) or epoch milliseconds
  (a number). Answers give ISO-8601 in UTC with microseconds. RETURN fields that are timestamps are
  int microseconds.
- **Errors**: every 4xx body is `{"detail": [{"field": "body.url", "reason": "...", ...}]}`; bad LQL
  adds `line` and `column`. `POST /events` answers per event (`rejections`: index, NDJSON line, field,
  reason). Bodies are JSON (`application/json` or a `+json` type; `POST /events` and
  `POST /queries/{id}/results` also NDJSON): another `Content-Type` is a 415. Malformed JSON is a 400
  on `body` with `line` and `column`, on every route.
  Request bodies take no unknown keys and convert nothing (`"5"` and `true` are not integers). A value
  from the request is echoed in an error cut to its first 40 characters and its length.
- **Webhooks**: one `POST` per alert; its JSON body is `WebhookAlert` (the fields of the alert's item in
  `GET /alerts`, its query's name, and the deprecated `alert_id` and `query` of earlier versions), documented
  with its headers under *Webhook requests* below (the OpenAPI document's `webhooks`). It comes with
  `Content-Type: application/json`, `Idempotency-Key`
  (`lace-<UUIDv7>`, made with the delivery: the same on every retry and redelivery of it, never
  reused), `X-Lace-Delivery`, `X-Lace-Attempt` and `X-Lace-Signature: t=<unix seconds>,v1=<hex>`,
  where `hex` is HMAC-SHA256(secret, `"<t>." + body`). After `POST /webhooks/{id}/rotate-secret`
  the header carries a second `v1` (the old secret's) during the grace period: accept the request if
  any `v1` matches. Verify it and reject a `t` older than a few minutes (the code is under *Webhook
  requests*).

  A 2xx answer delivers; anything else, or no answer within the timeout, is retried with exponential
  back-off and jitter (the default schedule spans more than 24 hours). No answer, 5xx, 408 or 429
  from an endpoint several times in a row opens its circuit: its deliveries are held (not
  dead-lettered) and one probe is sent at growing intervals until the endpoint answers; then all
  are sent. A delivery the receiver keeps refusing (another 4xx) is dead-lettered after
  `LACE_WEBHOOK_MAX_ATTEMPTS` attempts; `POST /deliveries/{id}/redeliver` sends one again,
  `POST /webhooks/{id}/redeliver` many (by state and detection time). Deliveries are at least once:
  deduplicate on `Idempotency-Key` (a crash between your 2xx and the service's commit of it, a few
  milliseconds, sends that delivery again with the same key).
"""


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " \\| ".join(_type(s) for s in schema[key])
    t = schema.get("type", "any")
    if t == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    return str(t)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _operation(out: list[str], title: str, op: dict[str, Any], key: str) -> None:
    """One operation (a route, or a request the service sends): summary, parameters, body, answers."""
    out.append(f"### `{title}`\n\n{op.get('summary', '')}. {key}\n")
    params = op.get("parameters", [])
    if params:
        out.append("| parameter | in | type | required | description |\n| --- | --- | --- | --- | --- |")
        for p in params:
            desc = _cell(p.get("description", "") or p.get("schema", {}).get("description", ""))
            kind, required = _type(p.get("schema", {})), p.get("required", False)
            out.append(f"| `{p['name']}` | {p['in']} | {kind} | {required} | {desc} |")
        out.append("")
    body = op.get("requestBody", {}).get("content", {})
    if body:
        kinds = ", ".join(f"`{ct}`: {_type(c.get('schema', {}))}" for ct, c in body.items())
        out.append(f"Body: {kinds}\n")
    codes = ", ".join(f"{code} {_cell(r.get('description', ''))}" for code, r in op.get("responses", {}).items())
    out.append(f"Answers: {codes}\n")


def render(spec: dict[str, Any], scopes: dict[tuple[str, str], str]) -> str:
    """``docs/rest.md`` from the OpenAPI document ``spec``: the routes (with the key scope each needs, from
    ``scopes``: (method, path) -> scope), the requests the service sends (the OpenAPI ``webhooks``), the schemas
    with their examples."""
    out = [INTRO, "## Routes\n"]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            scope = scopes.get((method.upper(), path))
            key = f"Key scope: `{scope}`." if scope else "No key needed."
            _operation(out, f"{method.upper()} {path}", op, key)
    if spec.get("webhooks"):
        out.append("## Webhook requests (sent by the service)\n")
        out.append("In the OpenAPI document under `webhooks`: what each webhook URL receives.\n")
        for name, ops in spec["webhooks"].items():
            for method, op in ops.items():
                _operation(out, f"{method.upper()} <webhook URL> ({name})", op, "Sent by the service.")
                if op.get("description"):
                    out.append(op["description"].strip() + "\n")
    out.append("## Schemas\n")
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        out.append(f"### {name}\n")
        if schema.get("description"):
            out.append(_cell(schema["description"]) + "\n")
        props = schema.get("properties", {})
        if props:
            required = set(schema.get("required", []))
            out.append("| field | type | required | description |\n| --- | --- | --- | --- |")
            for field, fs in props.items():
                desc = fs.get("description", "")
                if "default" in fs:
                    desc = f"{desc} (default `{json.dumps(fs['default'])}`)".strip()
                out.append(f"| `{field}` | {_type(fs)} | {field in required} | {_cell(desc)} |")
            out.append("")
        for example in schema.get("examples", [])[:1]:
            out.append(f"Example:\n\n```json\n{json.dumps(example, indent=2)}\n```\n")
    return "\n".join(out).rstrip() + "\n"


def openapi() -> tuple[dict[str, Any], dict[tuple[str, str], str]]:
    """The schema and, per (method, path), the scope its API-key dependency requires."""
    from fastapi.routing import APIRoute

    from service.app import ROUTERS, create_app
    from service.core.config import Settings

    app = create_app(Settings(secret_key=None))
    scopes: dict[tuple[str, str], str] = {}
    for route in (r for router in ROUTERS for r in router.routes):
        if not isinstance(route, APIRoute):
            continue
        stack = list(route.dependant.dependencies)
        while stack:
            dep = stack.pop()
            name = getattr(dep.call, "__name__", "")
            if name.startswith("require_"):
                for method in route.methods or ():
                    scopes[(method, route.path_format)] = name.removeprefix("require_")
            stack.extend(dep.dependencies)
    return app.openapi(), scopes


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else OUT
    out.write_text(render(*openapi()), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
