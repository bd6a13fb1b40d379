"""The names users choose between, defined once: selection strategies, live-and-archived algorithms,
partial-match policies and storages (docs/architecture.md sections 7.4-7.7).

The CLI (``cli/``) and the REST API (``service/schemas``) reuse these enums; the engine accepts their
values as plain strings too (``StrEnum`` members are strings).
"""
from __future__ import annotations

from enum import StrEnum


class Strategy(StrEnum):
    """Event selection strategies (docs/architecture.md section 7.4; SASE+)."""

    skip_till_any_match = "skip_till_any_match"
    skip_till_next_match = "skip_till_next_match"
    strict_contiguity = "strict_contiguity"
    partition_contiguity = "partition_contiguity"


class Algorithm(StrEnum):
    """Live-and-archived algorithms (001 section 4; docs/architecture.md section 7.7)."""

    sllaa = "sllaa"
    ollaa = "ollaa"
    llaa = "llaa"
    alaa = "alaa"


class PmPolicy(StrEnum):
    """Which partial matches to spill first when over the budget (001 section 5): STPM or TPM."""

    stpm = "stpm"
    tpm = "tpm"


class Storage(StrEnum):
    """Partial-match storage for skip_till_any_match: chain-partitioned (000) or one run per partial match."""

    chain = "chain"
    runs = "runs"
