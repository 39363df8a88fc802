"""PostgreSQL's numeric division in pure Python (pgtrickle.sql.numeric_division), no JVM, no database.

The expected texts are PostgreSQL 18's own output of ``SELECT a / b`` (the integration test
tests/integration/test_numeric_division.py compares many more pairs with the server itself).
"""

from __future__ import annotations

from decimal import Decimal, localcontext

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgtrickle.sql.numeric_division import (
    UNKNOWN_SCALE,
    division_scale,
    divide,
    refusal_in_text,
    round_quotient,
    spark_quotient,
    spark_scale,
)


def scale_of(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def pg_div(a: str, b: str) -> str:
    return format(divide(Decimal(a), Decimal(b), scale_of(a), scale_of(b)), "f")


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("1", "3", "0.33333333333333333333"),
        ("2", "3", "0.66666666666666666667"),
        ("-2", "3", "-0.66666666666666666667"),
        ("2", "-3", "-0.66666666666666666667"),
        ("-2", "-3", "0.66666666666666666667"),
        ("0", "3", "0.00000000000000000000"),
        ("0", "-7.25", "0.00000000000000000000"),
        ("10", "4", "2.5000000000000000"),
        ("1.7", "1.5", "1.13333333333333333333"),  # equal first base-10000 digits: one more group
        ("100000", "3", "33333.333333333333"),
        ("1", "300000", "0.000003333333333333333333"),
        ("1.00", "3", "0.33333333333333333333"),
        ("1.0000000000000000000000000", "3", "0.3333333333333333333333333"),  # the operand's scale wins
        ("123456789012345678901234567890", "7", "17636684144620811271604938270"),
        ("0.000000000000000000000000000001", "3", "0.000000000000000000000000000000333333333333333333"),
        ("99999999999999999999", "0.0001", "999999999999999999990000.0000"),
        ("5", "2", "2.5000000000000000"),
        ("0.5", "2", "0.25000000000000000000"),
        ("-0.5", "0.3", "-1.6666666666666667"),
        ("12345.6", "0.001", "12345600.000000000000"),
    ],
)
def test_quotients_match_postgresql(a: str, b: str, expected: str) -> None:
    assert pg_div(a, b) == expected


def test_half_away_from_zero_on_an_exact_tie() -> None:
    # 1/8 = 0.125 rounded to 2 digits: away from zero in both signs (PostgreSQL's round_var).
    assert round_quotient(Decimal(1), Decimal(8), 2) == (Decimal("0.13"), False)
    assert round_quotient(Decimal(-1), Decimal(8), 2) == (Decimal("-0.13"), False)
    assert round_quotient(Decimal(1), Decimal(4), 2) == (Decimal("0.25"), True)


def test_scale_follows_the_base_10000_weights() -> None:
    assert division_scale(Decimal(1), Decimal(3), 0, 0) == 20  # qweight -1
    assert division_scale(Decimal(3), Decimal(1), 0, 0) == 16  # qweight 0
    assert division_scale(Decimal(20000), Decimal(1), 0, 0) == 12  # qweight 1
    assert division_scale(Decimal(10000), Decimal(1), 0, 0) == 16  # equal first digits: one less
    assert division_scale(Decimal(10**40), Decimal(1), 0, 0) == 0  # never below 0
    assert division_scale(Decimal(1), Decimal(10**4000), 0, 0) == 1000  # at most 1000
    assert division_scale(Decimal(1), Decimal(3), 25, 0) == 25


def test_division_by_zero_raises() -> None:
    with pytest.raises(ZeroDivisionError):
        divide(Decimal(1), Decimal(0), 0, 0)
    refused = spark_quotient(Decimal(1), Decimal("0.00"), 0, 2, 20, 18, "a / b")
    assert refusal_in_text(f"[CAST_INVALID_INPUT] The value '{refused}' of the type") == (
        "22012",
        "division by zero in a / b",
    )


def test_more_digits_than_decimals_context_holds() -> None:
    # 38-digit operands: no step may round to the decimal module's 28-digit context.
    a = Decimal("12345678901234567890123456789012345678")
    assert divide(a, Decimal(1), 0, 0) == a
    assert divide(a, Decimal(3), 0, 0) == Decimal("4115226300411522630041152263004115226")


def test_spark_row_function() -> None:
    assert spark_quotient(None, Decimal(1), 0, 0, 20, 18, "a / b") is None
    assert spark_quotient(Decimal("1.00"), 3, 2, 0, 20, 18, "a / b") == "0.33333333333333333333"
    assert spark_quotient(7, 2, 0, 0, 20, 18, "a / b") == "3.5000000000000000"


def refused(result: str | None) -> tuple[str, str]:
    assert result is not None
    found = refusal_in_text(f"Error: the value '{result}' cannot be cast")
    assert found is not None, result
    return found


def test_spark_row_function_refuses_what_does_not_fit() -> None:
    # 1/300000 needs 24 fraction digits.
    sqlstate, message = refused(spark_quotient(Decimal(1), Decimal(300000), 0, 0, 20, 18, "sum(a) / sum(b)"))
    assert sqlstate == "22003"
    assert "sum(a) / sum(b)" in message and "decimal(38,20)" in message
    # 0 at rscale 24, 0.5 at rscale 24: the value fits though the display scale does not
    assert spark_quotient(Decimal(0), Decimal(300000), 0, 0, 20, 18, "a / b") == "0"
    assert spark_quotient(Decimal("0.00002"), Decimal(4), 0, 0, 20, 18, "a / b") == "0.000005"
    # 21 integer digits
    assert refused(spark_quotient(Decimal(10) ** 20, Decimal(1), 0, 0, 20, 18, "a / b"))[0] == "22003"


def test_unknown_scale_exact_when_every_possible_scale_agrees() -> None:
    # Spark carries the value with scale 2: its display scale is 0..2, below the 16 digits
    # the weights ask for, so the quotient is known.
    assert spark_quotient(Decimal("5.00"), 3, UNKNOWN_SCALE, 0, 20, 18, "a / 3") == "1.6666666666666667"
    assert spark_scale(Decimal("5.00"), 3, UNKNOWN_SCALE, 0) == 16
    # Carried with scale 18 (unconstrained numeric): 16 to 18 digits, and they differ.
    sqlstate, message = refused(
        spark_quotient(Decimal("5.000000000000000000"), 3, UNKNOWN_SCALE, 0, 20, 18, "a / 3")
    )
    assert sqlstate == "22003" and "display scale" in message
    # ... unless the quotient ends before: then every scale gives the same value.
    assert spark_quotient(Decimal("5.000000000000000000"), 4, UNKNOWN_SCALE, 0, 20, 18, "a / 4") == (
        "1.2500000000000000"
    )
    assert spark_scale(Decimal("5.000000000000000000"), 4, UNKNOWN_SCALE, 0) == UNKNOWN_SCALE
    # Small quotients get 20 digits from the weights, above the 18 Spark carries: known.
    assert spark_quotient(Decimal("1.000000000000000000"), 3, UNKNOWN_SCALE, 0, 20, 18, "a / 3") == (
        "0.33333333333333333333"
    )
    assert spark_scale(None, 3, 0, 0) is None


numbers = st.decimals(
    min_value=Decimal("-1e12"), max_value=Decimal("1e12"), allow_nan=False, allow_infinity=False, places=6
)


@given(numbers, numbers)
def test_quotient_is_the_exact_quotient_rounded(a: Decimal, b: Decimal) -> None:
    if not b:
        return
    q = divide(a, b, 6, 6)
    scale = -q.as_tuple().exponent  # type: ignore[operator]
    assert scale == division_scale(a, b, 6, 6)
    with localcontext() as ctx:
        ctx.prec = 200
        error = abs(a - q * b) * 2 * 10**scale  # |a/b - q| in halves of the last place, times |b|
        assert error <= abs(b)
        if error == abs(b):  # a tie: rounded away from zero
            assert abs(q) * abs(b) > abs(a)
