"""Durations written by users (CLI options, REST fields): one parser, one unit table.

The LQL parser uses the same unit table (:data:`UNIT_US`) for ``WITHIN``, ``LOOKBACK`` and duration
literals. Results are int microseconds.
"""
from __future__ import annotations

import re

UNIT_US: dict[str, int] = {
    name: size
    for names, size in (
        ("us µs usec micro micros microsecond microseconds", 1),
        ("ms milli millis millisecond milliseconds", 1_000),
        ("s sec secs second seconds", 1_000_000),
        ("m min mins minute minutes", 60_000_000),
        ("h hr hrs hour hours", 3_600_000_000),
        ("d day days", 86_400_000_000),
    )
    for name in names.split()
}
"""Unit name (lower case) -> microseconds."""

MAX_DURATION_US = (1 << 62) - 1
_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zµ]*)\s*\Z", re.IGNORECASE)


def parse_duration_us(text: str) -> int:
    """A duration such as ``500ms``, ``30 seconds``, ``10 min``, ``2h`` or ``0`` -> int microseconds.

    Raises
    ------
    ValueError
        With a one-line reason: not a duration, an unknown unit, a number without a unit, or more
        than 2^62 microseconds (about 146,000 years).

    >>> parse_duration_us("1.5 s"), parse_duration_us("10 min"), parse_duration_us("0")
    (1500000, 600000000, 0)
    """
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(f"cannot read duration {text[:40]!r} (e.g. '500ms', '30 seconds', '10 min')")
    amount, unit = m.group(1), m.group(2).lower()
    if not unit:
        if float(amount) == 0:
            return 0
        raise ValueError(f"duration {text[:40]!r} needs a unit (us, ms, s, min, h, days)")
    if unit not in UNIT_US:
        raise ValueError(f"unknown duration unit {unit[:20]!r} in {text[:40]!r}")
    value = float(amount) * UNIT_US[unit]
    if value > MAX_DURATION_US:
        raise ValueError(f"duration {text[:40]!r} is too long (at most 2^62 us)")
    return round(value)
