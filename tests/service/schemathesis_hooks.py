"""Schemathesis hooks of tests/service/test_schemathesis.py (loaded through ``SCHEMATHESIS_HOOKS``).

The run is authenticated with one all-scopes key; ``DELETE /keys/{id}`` with that key's id would
revoke it and turn the rest of the run into 401s, so such a call is sent to an id that does not
exist instead (every other id, and every other call, goes as generated).
"""
from __future__ import annotations

import os
from typing import Any

import schemathesis

KEEP = int(os.environ.get("LACE_FUZZ_KEY_ID", "1"))


def _is_kept_key(value: Any) -> bool:
    try:
        return int(float(str(value).strip())) == KEEP
    except (ValueError, OverflowError):
        return False


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if case.method.upper() == "DELETE" and case.operation.path == "/keys/{id}":
        if _is_kept_key((case.path_parameters or {}).get("id")):
            case.path_parameters = {**case.path_parameters, "id": 9_007_199_254_740_991}
