"""The values of one column of an event file, typed as a whole with pyarrow (docs/architecture.md section 7.3).

The rules (:mod:`engine.event_files`, module docstring): every attribute column has one type for the whole file
(one of :data:`engine.event_files.COLUMN_TYPES`: declared, or inferred from all of its values by
:func:`infer_text`); the missing spellings of CSV text (:data:`NULL_TEXT`) and NaN become nulls; a value that does
not fit its column's type is a :class:`ColumnError` naming its row and column. Timestamp columns
(:func:`timestamp_column`: ISO-8601 text with a UTC offset, numbers in the file's ts unit, or Arrow timestamps)
become int64 microseconds UTC, exactly as :class:`engine.io.TimestampParser` reads one value.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NULL_TEXT = ("", "null", "NULL", "NaN", "nan", "NAN")
"""CSV spellings of a missing value (after trimming)."""

_INT_ANY = r"^[+-]?\d+$"
_INT_CANON = r"^[+-]?(0|[1-9]\d*)$"
_FLOAT_ANY = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$|^[+-]?([iI][nN][fF]|[iI]nfinity)$"
_FLOAT_CANON = r"^[+-]?((0|[1-9]\d*)(\.\d*)?|\.\d+)([eE][+-]?\d+)?$"
_DECIMAL = r"^[+-]?(\d+\.\d*|\.\d+)$"
_BOOL = r"^(?i)(true|false)$"
_DIGITS_PER_UNIT = {"us": 0, "ms": 3, "s": 6}


def _strings(words: tuple[str, ...]) -> pa.Array:
    """A string array from its buffers (``pa.array`` of Python strings would import pandas: see below)."""
    data = "".join(words).encode()
    offsets = np.cumsum([0, *(len(w.encode()) for w in words)], dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(words), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


_NULL_SPELLINGS = _strings(NULL_TEXT)
_ONE = pa.Array.from_buffers(pa.int32(), 1, [None, pa.py_buffer(np.array([1], dtype=np.int32))])[0]
"""1 as an Arrow scalar (a Python 1 in a compute call would import pandas: see below)."""


class ColumnError(ValueError):
    """A value of one column that does not fit (``row`` 0-based within the file's rows)."""

    def __init__(self, row: int, column: str, reason: str) -> None:
        super().__init__(reason)
        self.row = row
        self.column = column
        self.reason = reason


# ---------------------------------------------------------------- values of one column


# Kept free of Python-object conversions (pa.array/pa.scalar of Python values, to_numpy of bitmaps): pyarrow
# imports pandas for those on first use, 0.2 s of every `lace match` run.


def _null(t: pa.DataType) -> pa.Scalar:
    return pa.nulls(1, t)[0]


def _int64(value: int) -> pa.Scalar:
    return pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(np.array([value], dtype=np.int64))])[0]


def _first(mask: pa.Array) -> int:
    """Index of the first true value of a boolean array (nulls are false); -1 if none."""
    hits = pc.indices_nonzero(mask)
    return int(hits[0].as_py()) if len(hits) else -1


def _all_match(values: pa.Array, pattern: str, plain: Callable[[pa.Array], bool] | None = None) -> tuple[bool, int]:
    """(every non-null value matches, index of the first that does not). ``plain``: a cheaper check that, when true,
    means every value matches (:func:`_canonical_ints`); when false the regex decides."""
    # without nulls the first value is row 0: no validity mask and index pass over the column (2-4 ms each)
    first = (0 if len(values) else -1) if not values.null_count else _first(values.is_valid())
    if first >= 0 and not pc.match_substring_regex(values.slice(first, 1), pattern)[0].as_py():
        return False, first  # the first value decides it: no pass over the column (type inference tries many)
    if plain is not None and plain(values):
        return True, -1
    ok = pc.match_substring_regex(values, pattern)
    bad = _first(pc.invert(ok))
    return bad < 0, bad


# An int column's plain spelling, checked by Arrow's string kernels (3 passes, 6 ms per 1M values) before the regex
# (25-30 ms); the same check for decimals (a point among digits) cost as much as their regexes.


def _canonical_ints(values: pa.Array) -> bool:
    """True when every present value matches ``_INT_CANON`` because it is ASCII digits (``\\d`` in RE2: ASCII only)
    without a leading zero, or ``0``; False decides nothing (signs: the regex)."""
    if not pc.all(pc.ascii_is_decimal(values)).as_py():
        return False
    long_zero = pc.and_(pc.starts_with(values, "0"), pc.greater(pc.binary_length(values), _ONE))
    return not pc.any(long_zero).as_py()


def _without_plus(values: pa.Array) -> pa.Array:
    """Text values without their leading ``+`` (as ``int64`` casts need them): the regex replacement runs only
    when some value starts with one (a check 15x as cheap; the same values either way)."""
    if pc.any(pc.starts_with(values, "+")).as_py():
        return pc.replace_substring_regex(values, r"^\+", "")
    return values


def _nan_to_null(values: pa.Array) -> pa.Array:
    if pa.types.is_floating(values.type):
        nan = pc.is_nan(values)
        if pc.any(nan).as_py():
            return pc.if_else(nan, _null(values.type), values)
    return values


def text_column(values: pa.Array) -> pa.Array:
    """CSV text: trimmed, with the missing spellings (``NULL_TEXT``) as nulls."""
    trimmed = pc.utf8_trim_whitespace(values)
    missing = pc.is_in(trimmed, value_set=_NULL_SPELLINGS)  # a hash lookup: cheaper than the regex
    if pc.any(missing).as_py():
        return pc.if_else(missing, _null(pa.string()), trimmed)
    return trimmed


def _cast_text(values: pa.Array, kind: str, column: str) -> pa.Array:
    """Text values to a declared type; ColumnError at the first that does not fit."""
    if kind == "string":
        return values
    if kind == "int":
        ok, bad = _all_match(values, _INT_ANY)
        if ok:
            try:
                return pc.cast(_without_plus(values), pa.int64())
            except pa.ArrowInvalid:
                bad = next(i for i, v in enumerate(values.to_pylist()) if v is not None and not _fits_int64(int(v)))
                raise ColumnError(bad, column, f"{values[bad].as_py()!r} is out of the int64 range") from None
        raise ColumnError(bad, column, f"{values[bad].as_py()!r} is not an int")
    if kind == "float":
        ok, bad = _all_match(values, _FLOAT_ANY)
        if ok:
            return pc.cast(values, pa.float64())
        raise ColumnError(bad, column, f"{values[bad].as_py()!r} is not a float")
    if kind == "bool":
        ok, bad = _all_match(values, _BOOL)
        if ok:
            return pc.match_substring_regex(values, r"^(?i)true$")
        raise ColumnError(bad, column, f"{values[bad].as_py()!r} is not a bool (true or false)")
    raise AssertionError(kind)  # timestamps go through timestamp_column


def _fits_int64(v: int) -> bool:
    return -(1 << 63) <= v < (1 << 63)


def infer_text(values: pa.Array) -> str:
    """The type of a CSV column from all of its values (module docstring); ``string`` when in doubt."""
    return infer_column(values)[0]


def infer_column(values: pa.Array) -> tuple[str, pa.Array]:
    """A CSV column typed by :func:`infer_text`'s rule, in one pass of its checks.

    Parameters
    ----------
    values : pa.Array
        The column's text (:func:`text_column`: trimmed, nulls for the missing spellings).

    Returns
    -------
    tuple[str, pa.Array]
        ``(kind, typed)``: the type :func:`infer_text` gives (``bool``, ``int``, ``float`` or ``string``) and the
        values as ``_cast_text(values, kind, column)`` gives them (bool, int64, float64, or ``values`` itself),
        the conversion inference already made reused rather than made again. Raises nothing: every value fits the
        type inferred.
    """
    if values.null_count == len(values):
        return "string", values
    if _all_match(values, _BOOL)[0]:
        return "bool", pc.match_substring_regex(values, r"^(?i)true$")
    if _all_match(values, _INT_CANON, _canonical_ints)[0]:
        try:
            return "int", pc.cast(_without_plus(values), pa.int64())
        except pa.ArrowInvalid:
            return "string", values  # beyond int64: an identifier, not a number
    if _all_match(values, _FLOAT_CANON)[0]:
        floats = pc.cast(values, pa.float64())
        if not pc.any(pc.is_inf(floats)).as_py():
            return "float", floats
    return "string", values


@dataclass(frozen=True, slots=True)
class StringFallback:
    """A CSV column inferred as string because of a minority of its values (:func:`string_fallback`).

    Attributes
    ----------
    column : str
        The column's name.
    row : int
        0-based row (within the file's rows) of the first value that kept it a string.
    value : str
        That value.
    majority : str
        The type most of its values have (``int``, ``float`` or ``bool``).
    """

    column: str
    row: int
    value: str
    majority: str


def string_fallback(values: pa.Array, column: str) -> StringFallback | None:
    """Why a CSV column that :func:`infer_text` types as string is one, when a minority of values is the reason.

    Parameters
    ----------
    values : pa.Array
        The column's text (:func:`text_column`), inferred as ``string``.
    column : str
        Its name.

    Returns
    -------
    StringFallback or None
        When more than half of its present values are numbers (ints and floats, finite, written without leading
        zeros) or booleans: that type and the first value that is not; None when most values are text (an
        identifier column such as ``060030`` codes stays a string without a word).

    Examples
    --------
    >>> string_fallback(text_column(pa.array(["1.5", "2", "high", "3"])), "alt")
    StringFallback(column='alt', row=2, value='high', majority='float')
    >>> string_fallback(text_column(pa.array(["AIG", "IBM", "7"])), "symbol") is None
    True
    """
    present = len(values) - values.null_count
    for kind, pattern in (("bool", _BOOL), ("float", _FLOAT_CANON)):
        ok = pc.match_substring_regex(values, pattern)
        if kind == "float":  # a finite float: 86e430 is no number
            finite = pc.is_finite(pc.cast(pc.if_else(ok, values, _null(values.type)), pa.float64()))
            ok = pc.and_kleene(ok, finite)
        n_ok = pc.sum(pc.cast(ok, pa.int64())).as_py() or 0
        if 2 * n_ok > present:
            bad = _first(pc.invert(ok))
            if bad < 0:
                return None  # all of them: ints beyond int64, an identifier
            if kind == "float":
                ints = pc.match_substring_regex(pc.if_else(ok, values, _null(values.type)), _INT_CANON)
                kind = "int" if pc.all(ints).as_py() else "float"
            return StringFallback(column, bad, str(values[bad].as_py()), kind)
    return None


def value_column(values: pa.Array, kind: str | None, column: str, ts_unit: str) -> tuple[pa.Array, str]:
    """A JSON or Parquet column (already typed by the reader) as one of ``COLUMN_TYPES``.

    Returns ``(values, type)``; NaN becomes null; ColumnError when a value does not fit ``kind``.
    """
    t = values.type
    if pa.types.is_dictionary(t):
        values = values.cast(t.value_type)
        t = values.type
    if kind == "timestamp":
        return timestamp_column(values, ts_unit, column), "timestamp"
    if pa.types.is_null(t):
        return pa.nulls(len(values), pa.string()), kind or "string"
    if pa.types.is_timestamp(t):
        if kind is not None:
            raise ColumnError(_first(values.is_valid()), column, f"a timestamp, but the column is {kind}")
        return timestamp_column(values, ts_unit, column), "timestamp"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        have = "string"
    elif pa.types.is_boolean(t):
        have = "bool"
    elif pa.types.is_integer(t):
        have = "int"
    elif pa.types.is_floating(t):
        have = "float"
    else:
        raise ColumnError(_first(values.is_valid()), column, f"nested objects and arrays are not supported ({t})")
    want = kind or have
    if want == have or (want == "float" and have == "int"):
        target = {"string": pa.string(), "bool": pa.bool_(), "int": pa.int64(), "float": pa.float64()}[want]
        try:
            return _nan_to_null(values.cast(target)), want
        except pa.ArrowInvalid as e:
            raise ColumnError(_first(values.is_valid()), column, str(e)) from None
    raise ColumnError(_first(values.is_valid()), column, f"a {have}, but the column is {want}")


# ---------------------------------------------------------------- timestamps


def timestamp_column(values: pa.Array, unit: str, column: str) -> pa.Array:
    """Timestamps (ISO-8601 text with offset, numbers in ``unit``, or Arrow timestamps) -> int64 microseconds.

    Follows :class:`engine.io.TimestampParser` exactly (``auto``: integers are epoch milliseconds,
    decimals epoch seconds, one file does not mix them); the vectorised paths cover whole columns
    of one kind and anything else goes value by value through the parser, which names the bad row.
    Nulls stay null (the caller decides whether a missing timestamp is allowed).
    """
    t = values.type
    if pa.types.is_timestamp(t):
        if t.tz is None:
            raise ColumnError(_first(values.is_valid()), column, "a timestamp without time zone (UTC offset)")
        return values.cast(pa.timestamp("us", "UTC")).cast(pa.int64())
    if pa.types.is_integer(t) and not pa.types.is_boolean(t):
        kind = "ms" if unit == "auto" else unit
        try:
            return pc.multiply_checked(values.cast(pa.int64()), _int64(10 ** _DIGITS_PER_UNIT[kind]))
        except pa.ArrowInvalid:
            return _timestamps_slow(values, unit, column)
    if pa.types.is_floating(t):
        values = _nan_to_null(values)
        # the shortest text that reads back as the same double, as repr() gives
        return _timestamps_text(values.cast(pa.string()), unit, column, numeric_only=True)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _timestamps_text(values.cast(pa.string()), unit, column)
    raise ColumnError(_first(values.is_valid()), column, f"a {t} is not a timestamp")


def _timestamps_text(values: pa.Array, unit: str, column: str, numeric_only: bool = False) -> pa.Array:
    try:
        if _all_match(values, _INT_ANY)[0]:
            kind = "ms" if unit == "auto" else unit
            ints = pc.cast(_without_plus(values), pa.int64())
            return pc.multiply_checked(ints, _int64(10 ** _DIGITS_PER_UNIT[kind]))
        if _all_match(values, _DECIMAL)[0] and unit != "us":
            digits = _DIGITS_PER_UNIT["s" if unit == "auto" else unit]
            return _decimal_units(values, digits)
        if not numeric_only and not pc.any(pc.match_substring_regex(values, r"^[+-]?[\d.]+$")).as_py():
            return pc.cast(values, pa.timestamp("us", "UTC")).cast(pa.int64())
    except (pa.ArrowInvalid, OverflowError):
        pass
    return _timestamps_slow(values, unit, column)


_EXACT_UNITS = float(1 << 50)
"""Below this many units a decimal read as the nearest double and scaled is within 1/4 of its exact unit count."""


def _decimal_units(values: pa.Array, digits: int) -> pa.Array:
    """Decimal text -> exact int64 of ``10**-digits`` units (ArrowInvalid if finer or out of range)."""
    fast = _decimal_units_by_float(values, digits)
    if fast is not None:
        return fast
    dec = pc.cast(values, pa.decimal128(38, digits))
    words = np.frombuffer(dec.buffers()[1], dtype=np.int64)[2 * dec.offset : 2 * (dec.offset + len(dec))]
    low, high = words[0::2], words[1::2]
    if not np.array_equal(high, low >> 63):
        raise OverflowError("timestamp out of the int64 range")
    validity = dec.buffers()[0] if dec.null_count and dec.offset == 0 else None
    if dec.null_count and validity is None:
        return pc.if_else(dec.is_null(), _null(pa.int64()), pa.array(low, pa.int64()))
    return pa.Array.from_buffers(
        pa.int64(), len(dec), [validity, pa.py_buffer(np.ascontiguousarray(low))], null_count=dec.null_count
    )


def _decimal_units_by_float(values: pa.Array, digits: int) -> pa.Array | None:
    """:func:`_decimal_units` of decimal text (``_DECIMAL``, no nulls) through doubles, 2-3x as cheap as Arrow's
    decimal cast, when that is certainly exact: every value has at most ``digits`` digits after its point (so it is
    ``N / 10**digits`` for an int ``N``) and every ``|N|`` is below 2**50. The double nearest the text, times
    ``10**digits`` (exact as a double), is then within ``|N| * 2**-52 < 1/4`` of ``N``, and rounds to it. None for
    any other column (it takes the decimal cast)."""
    if values.null_count or not len(values):
        return None
    # the digits after the point, and the point: no Python scalar in the arithmetic (pyarrow would import pandas)
    from_point = pc.subtract(pc.binary_length(values), pc.find_substring(values, "."))
    if pc.max(from_point).as_py() > digits + 1:
        return None
    floats = pc.cast(values, pa.float64())
    scaled = np.frombuffer(floats.buffers()[1], np.float64, len(floats), floats.offset * 8) * float(10**digits)
    if not (scaled.max() < _EXACT_UNITS and scaled.min() > -_EXACT_UNITS):
        return None
    units = np.rint(scaled, out=scaled).astype(np.int64)
    return pa.Array.from_buffers(pa.int64(), len(units), [None, pa.py_buffer(units)])


def _timestamps_slow(values: pa.Array, unit: str, column: str) -> pa.Array:
    from engine.io import TimestampParser

    parse = TimestampParser(unit)  # type: ignore[arg-type]
    out: list[int | None] = []
    for i, v in enumerate(values.to_pylist()):
        if v is None:
            out.append(None)
            continue
        try:
            out.append(parse(v))
        except ValueError as e:
            raise ColumnError(i, column, str(e)) from None
    try:
        return pa.array(out, type=pa.int64())
    except (pa.ArrowInvalid, OverflowError):
        bad = next(i for i, v in enumerate(out) if v is not None and not _fits_int64(v))
        raise ColumnError(bad, column, "timestamp out of the int64 range") from None
