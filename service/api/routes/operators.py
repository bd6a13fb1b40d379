"""``GET /operators``: the installed plug-ins (functions, aggregates, operators; issue 16)."""
from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from engine.plugins.registry import catalog
from service.api.deps import ReadKey
from service.schemas.common import ERRORS

router = APIRouter(tags=["queries"], responses=ERRORS)  # type: ignore[arg-type]


class PluginPublic(BaseModel):
    """One installed plug-in, as LQL names it."""

    kind: Literal["function", "aggregate", "operator"]
    name: str = Field(description="the name in LQL")
    source: str = Field(description="the package (distribution and version) that registered it")
    signature: str = Field(description="how LQL uses it, e.g. `round(number, [int]) -> number`")
    doc: str
    cost: float | None = Field(None, description="operators: declared cost per input event")
    pass_estimate: float | None = Field(None, description="operators: declared composites per input event")
    error: str | None = Field(None, description="why it cannot be used (failed to load, wrong shape); None: it works")


class PluginList(BaseModel):
    """Every plug-in installed in the service's environment (entry points lace.functions, lace.aggregates,
    lace.operators), LACE's built-ins included."""

    plugins: list[PluginPublic]


@router.get("/operators", summary="List the installed functions, aggregates and operators (plug-ins)")
def list_operators(_: ReadKey) -> PluginList:
    return PluginList(plugins=[PluginPublic.model_validate(p) for p in catalog()])
