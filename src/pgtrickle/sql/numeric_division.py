"""PostgreSQL's ``numeric / numeric``, exactly, in pure Python (stdlib only).

PostgreSQL divides two ``numeric`` values (``numeric_div`` -> ``select_div_scale`` and
``div_var`` in ``src/backend/utils/adt/numeric.c``) by rounding the *exact* quotient half away
from zero to the result scale::

    rscale = clamp(max(16 - 4 * qweight, dscale(a), dscale(b)), 0, 1000)

where ``dscale`` is an operand's display scale (the digits after the decimal point it carries,
trailing zeros included: ``1.50`` has 2) and ``qweight`` estimates the quotient's weight in
base-10000 digits: ``weight(a) - weight(b)``, minus one when the first base-10000 digit of ``a``
is not greater than that of ``b`` (a zero operand has weight 0 and first digit 0). So a quotient
keeps at least 16 significant digits, and never fewer fraction digits than either operand.
``avg(numeric)`` and ``avg`` of an integer type are ``sum / count`` by this same division.

This module is the rule itself (:func:`division_scale`, :func:`divide`) and the row function
Spark runs for each quotient (:func:`spark_quotient`, registered by ``pgtrickle.spark.numeric``
and shipped to the executors by value, so it imports nothing but the standard library). The
translation that calls it is ``pgtrickle.sql.numeric_scale``; the rules and their residual
refusals are in docs/TYPES.md.
"""

from __future__ import annotations

import re
from decimal import Decimal

MIN_SIG_DIGITS = 16
"""``NUMERIC_MIN_SIG_DIGITS``: a quotient keeps at least this many significant digits."""

MAX_DISPLAY_SCALE = 1000
"""``NUMERIC_MAX_DISPLAY_SCALE``."""

UNKNOWN_SCALE = -1
"""A display scale the translation cannot see (see :func:`spark_quotient`)."""

REFUSAL_MARKER = "pgtrickle-numeric-refusal"
"""Starts a refusal (:func:`refusal`): the row function returns it instead of a quotient, and the
cast of its result to a decimal fails with it, so a refresh finds it in the failed Spark job's
error text (:func:`refusal_in_text`). The row function never raises: Spark evaluates a Python
function for every row, also those a ``CASE`` around it does not take, while the failing cast
runs only where PostgreSQL would divide."""

_REFUSAL_END = " (end of refusal)"
_REFUSAL = re.compile(re.escape(REFUSAL_MARKER) + r"\[([0-9A-Z]{5})\]: (.*?)" + re.escape(_REFUSAL_END), re.S)

NUMERIC_RANGE_SQLSTATE = "22003"
DIVISION_BY_ZERO_SQLSTATE = "22012"


def refusal(sqlstate: str, message: str) -> str:
    """The text of a refused quotient."""
    return f"{REFUSAL_MARKER}[{sqlstate}]: {message}{_REFUSAL_END}"


def refusal_in_text(text: str) -> tuple[str, str] | None:
    """``(sqlstate, message)`` of the first refusal in an error's text, if there is one."""
    found = _REFUSAL.search(text)
    return None if found is None else (found.group(1), found.group(2))


def _unscaled(value: Decimal) -> tuple[int, int]:
    """``(n, e)`` with ``abs(value) == n * 10**e`` (no rounding: ``Decimal`` arithmetic would
    round to its context's 28 digits)."""
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int), "finite values only"
    return int("".join(map(str, digits)) or "0"), exponent


def _digits(value: Decimal) -> tuple[int, int]:
    """``(weight, first digit)`` of ``value`` in PostgreSQL's base-10000 representation
    (``(0, 0)`` for zero)."""
    if not value:
        return 0, 0
    weight = value.adjusted() // 4
    unscaled, exponent = _unscaled(value)
    shift = exponent - 4 * weight  # abs(value) / 10000**weight == unscaled * 10**shift
    first = unscaled * 10**shift if shift >= 0 else unscaled // 10**-shift
    return weight, first


def division_scale(dividend: Decimal, divisor: Decimal, dividend_scale: int, divisor_scale: int) -> int:
    """PostgreSQL's result scale of ``dividend / divisor`` (``select_div_scale``)."""
    weight1, first1 = _digits(dividend)
    weight2, first2 = _digits(divisor)
    qweight = weight1 - weight2
    if first1 <= first2:
        qweight -= 1
    rscale = max(MIN_SIG_DIGITS - qweight * 4, dividend_scale, divisor_scale, 0)
    return min(rscale, MAX_DISPLAY_SCALE)


def round_quotient(dividend: Decimal, divisor: Decimal, scale: int) -> tuple[Decimal, bool]:
    """The exact quotient rounded half away from zero to ``scale`` fraction digits, and whether
    that rounding was exact (the quotient has no further non-zero digit)."""
    if not divisor:
        raise ZeroDivisionError("division by zero")
    numerator, exponent1 = _unscaled(dividend)
    denominator, exponent2 = _unscaled(divisor)
    # dividend / divisor * 10**scale = numerator * 10**(exponent1 - exponent2 + scale) / denominator
    shift = exponent1 - exponent2 + scale
    if shift >= 0:
        numerator *= 10**shift
    else:
        denominator *= 10**-shift
    quotient, remainder = divmod(numerator, denominator)
    if 2 * remainder >= denominator:
        quotient += 1
    negative = (dividend < 0) != (divisor < 0) and quotient != 0
    result = Decimal((1 if negative else 0, tuple(int(d) for d in str(quotient)), -scale))
    return result, remainder == 0


def divide(dividend: Decimal, divisor: Decimal, dividend_scale: int, divisor_scale: int) -> Decimal:
    """``dividend / divisor`` exactly as PostgreSQL's ``numeric`` division computes it, with the
    display scale as the result's exponent (``divide(Decimal(1), Decimal(3), 0, 0)`` is
    ``0.33333333333333333333``). The operands' display scales are given, since a ``Decimal``'s
    exponent need not be one.

    Raises:
        ZeroDivisionError: ``divisor`` is zero (PostgreSQL: SQLSTATE 22012).
    """
    scale = division_scale(dividend, divisor, dividend_scale, divisor_scale)
    return round_quotient(dividend, divisor, scale)[0]


def _scale_bounds(value: Decimal, scale: int) -> tuple[int, int]:
    """The lowest and highest display scale ``value`` may have: ``scale`` when known, else from
    its own digits (no fewer than it shows without trailing zeros) up to the scale Spark carries
    it with (its exponent: Spark's decimal type never holds fewer digits than PostgreSQL's value
    displays, see docs/TYPES.md)."""
    if scale != UNKNOWN_SCALE:
        return scale, scale
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    carried = max(-exponent, 0)
    if not value:
        return 0, carried
    unscaled, significant = _unscaled(value)
    while unscaled % 10 == 0:
        unscaled //= 10
        significant += 1
    return max(-significant, 0), carried


def spark_quotient(
    dividend: Decimal | int | None,
    divisor: Decimal | int | None,
    dividend_scale: int,
    divisor_scale: int,
    result_scale: int,
    integer_digits: int,
    label: str,
) -> str | None:
    """One row of ``dividend / divisor`` on Spark: PostgreSQL's quotient as plain text with at
    most ``result_scale`` fraction digits and ``integer_digits`` integer digits (Spark casts it
    to ``DECIMAL(integer_digits + result_scale, result_scale)``), NULL when an operand is.

    A display scale of :data:`UNKNOWN_SCALE` (an unconstrained ``numeric``, or a value the
    translation cannot follow) is bounded by the value's digits: the quotient is returned when
    every scale in those bounds gives the same value, and refused otherwise.

    A :func:`refusal` naming ``label`` (the expression) is returned instead when the divisor is
    zero (22012), or the quotient does not fit the Spark type or depends on a display scale Spark
    does not carry (22003).
    """
    if dividend is None or divisor is None:
        return None
    a = Decimal(dividend)
    b = Decimal(divisor)
    if not b:
        return refusal(DIVISION_BY_ZERO_SQLSTATE, f"division by zero in {label}")
    low1, high1 = _scale_bounds(a, dividend_scale)
    low2, high2 = _scale_bounds(b, divisor_scale)
    low = division_scale(a, b, low1, low2)
    high = division_scale(a, b, high1, high2)
    quotient, exact = round_quotient(a, b, low)
    if low != high and not exact:
        return refusal(
            NUMERIC_RANGE_SQLSTATE,
            f"the quotient {label} of {a} and {b} has {low} to {high} fraction digits in "
            "PostgreSQL, depending on a display scale Spark does not carry (an unconstrained "
            "numeric, or a value computed in another step); cast the operand to numeric(p,s) "
            "in the defining query.",
        )
    _, digits, exponent = quotient.as_tuple()
    assert isinstance(exponent, int)
    # The value must fit; its display scale may pass the type's when the digits beyond are zeros
    # (0 with rscale 24 is 0), since a division around it gets the scale from spark_scale.
    unscaled, significant = _unscaled(quotient)
    while unscaled % 10 == 0 and significant < 0:
        unscaled //= 10
        significant += 1
    if -significant > result_scale or len(digits) + exponent > integer_digits:
        return refusal(
            NUMERIC_RANGE_SQLSTATE,
            f"the quotient {label} = {quotient} does not fit "
            f"decimal({integer_digits + result_scale},{result_scale}), the Spark type chosen for "
            f"it (at most {integer_digits} digits before and {result_scale} after the decimal "
            "point); cast the operands to numeric(p,s) with fewer digits, or round the quotient.",
        )
    if -exponent > result_scale:  # only zeros beyond the type's scale: drop them
        quotient = Decimal((quotient.is_signed(), tuple(int(d) for d in str(unscaled)), significant))
    return format(quotient, "f")


def spark_scale(
    dividend: Decimal | int | None, divisor: Decimal | int | None, dividend_scale: int, divisor_scale: int
) -> int | None:
    """The display scale of :func:`spark_quotient`'s result on one row (for a division around it):
    PostgreSQL's rscale, or :data:`UNKNOWN_SCALE` when it depends on a scale Spark does not carry
    (the quotient itself was exact then); NULL when an operand is NULL or the divisor zero."""
    if dividend is None or divisor is None:
        return None
    a = Decimal(dividend)
    b = Decimal(divisor)
    if not b:
        return None
    low1, high1 = _scale_bounds(a, dividend_scale)
    low2, high2 = _scale_bounds(b, divisor_scale)
    low = division_scale(a, b, low1, low2)
    return low if low == division_scale(a, b, high1, high2) else UNKNOWN_SCALE
