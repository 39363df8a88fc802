"""Casts with PostgreSQL's conversion rules on Spark (integer rounding, exact numerics, intervals).

Pure.  The choice of Spark types is explained in ``sql/translate.py``'s module
docs ("Numeric", "Integer casts").
"""

from __future__ import annotations

from decimal import Decimal

from sqlglot import exp

from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.sql import blank_padded
from pgtrickle.sql.nodes import (
    BLANK_PADDED_TYPES,
    READ,
    decimal_shape,
    decimal_type,
    inferred_type,
    is_string_literal,
    literal_decimal,
    parse_interval,
    spark_cast,
    spark_func,
    type_params,
    typeof_in,
)
from pgtrickle.sql.typing_rules import DECIMAL_FOR_INT, FLOAT_TYPES, INT_TYPES, SPARK_FLOAT_TYPENAMES


def rewrite_cast(node: exp.Cast) -> exp.Expr:
    """``x::type`` with PostgreSQL's conversion rules (``node``'s operand already rewritten and typed)."""
    value = node.this
    value_type = inferred_type(value)
    to = node.to
    kind = to.this
    if kind == exp.DType.ARRAY:
        return node
    if kind in BLANK_PADDED_TYPES:
        return blank_padded.cast_to_blank_padded(value, blank_padded.width_from_datatype(to) or 0)
    if kind in (exp.DType.TEXT, exp.DType.VARCHAR, exp.DType.NVARCHAR, exp.DType.NAME, exp.DType.UUID):
        text = value if is_string_literal(value) else spark_cast(value, "STRING")
        params = type_params(to)
        if kind in (exp.DType.VARCHAR, exp.DType.NVARCHAR) and params:
            return exp.Left(this=text, expression=exp.Literal.number(params[0]))
        return text
    if kind in (exp.DType.SMALLINT, exp.DType.INT, exp.DType.BIGINT):
        target = {exp.DType.SMALLINT: "SMALLINT", exp.DType.INT: "INT"}.get(kind, "BIGINT")
        return _integer_cast(value, value_type, target)
    if kind == exp.DType.DECIMAL:
        return _decimal_cast(value, value_type, type_params(to))
    if kind in (exp.DType.TIMESTAMP, exp.DType.TIMESTAMPTZ):
        return spark_cast(value, "TIMESTAMP")
    if kind == exp.DType.INTERVAL:
        parts = parse_interval(value.this) if is_string_literal(value) else None
        if parts is None:
            raise UnsupportedQueryError("intervals are only supported as constants such as '1 day'::interval")
        years, months, weeks, days, hours, minutes, seconds = parts
        numbers = [exp.Literal.number(v) for v in (years, months, weeks, days, hours, minutes)]
        return spark_func("MAKE_INTERVAL", *numbers, exp.Literal.number(str(seconds)))
    if kind in (exp.DType.DOUBLE, exp.DType.FLOAT, exp.DType.BOOLEAN, exp.DType.DATE):
        return exp.Cast(this=value, to=exp.DataType(this=kind))
    raise UnsupportedQueryError(f"casts to {to.sql(dialect=READ).lower()} are not supported on Spark")


def _integer_cast(value: exp.Expr, value_type: str | None, target: str) -> exp.Expr:
    """PostgreSQL rounds (never truncates) when converting to an integer type."""
    if isinstance(value, exp.Null) or value_type in (*INT_TYPES, "text", "bool"):
        return spark_cast(value, target)
    if value_type == "numeric":
        return spark_cast(exp.Round(this=value, decimals=exp.Literal.number(0)), target)
    if value_type in FLOAT_TYPES:
        return spark_cast(spark_func("BROUND", value, exp.Literal.number(0)), target)
    as_float = spark_cast(
        spark_func("BROUND", spark_cast(value.copy(), "DOUBLE"), exp.Literal.number(0)), target
    )
    as_decimal = spark_cast(exp.Cast(this=value, to=decimal_type(38, 0)), target)
    return exp.Case(
        ifs=[exp.If(this=typeof_in(value.copy(), SPARK_FLOAT_TYPENAMES), true=as_float)],
        default=as_decimal,
    )


def _decimal_cast(value: exp.Expr, value_type: str | None, params: list[int]) -> exp.Expr:
    """``::numeric`` and ``::numeric(p, s)``; see the module docs for the choice of types."""
    if params:
        target = decimal_type(params[0], params[1] if len(params) > 1 else 0)
    else:
        constant = literal_decimal(value)
        if constant is not None:
            precision, scale = decimal_shape(constant)
            return exp.Cast(
                this=exp.Literal.string(_plain_decimal(constant)), to=decimal_type(precision, scale)
            )
        if isinstance(value, exp.Null):
            # The narrowest decimal: a CASE or COALESCE with a quotient keeps the quotient's type
            # (a wider one would make Spark cut the quotient's scale).
            return exp.Cast(this=value, to=decimal_type(1, 0))
        if value_type in INT_TYPES:
            return exp.Cast(this=value, to=decimal_type(DECIMAL_FOR_INT[value_type], 0))
        if value_type == "numeric":
            return value
        target = decimal_type(38, 18)
    if value_type in FLOAT_TYPES:
        return exp.Cast(this=_float_as_pg_text(value), to=target)
    if value_type is not None or isinstance(value, (exp.Literal, exp.Null)):
        return exp.Cast(this=value, to=target)
    # Unknown type: a double must go through PostgreSQL's 15-digit conversion.
    # Both branches have the same Spark type, so the test costs no precision.
    as_float = exp.Cast(this=_float_as_pg_text(value.copy()), to=target.copy())
    return exp.Case(
        ifs=[exp.If(this=typeof_in(value.copy(), SPARK_FLOAT_TYPENAMES), true=as_float)],
        default=exp.Cast(this=value, to=target),
    )


def _float_as_pg_text(value: exp.Expr) -> exp.Expr:
    """A double as PostgreSQL converts it to numeric: 15 significant digits (NULL stays NULL)."""
    return exp.Nullif(
        this=spark_func("FORMAT_STRING", exp.Literal.string("%.15g"), value),
        expression=exp.Literal.string("null"),
    )


def _plain_decimal(value: Decimal) -> str:
    """A decimal in plain (non-scientific) notation."""
    return format(value, "f")
