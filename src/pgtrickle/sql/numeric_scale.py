"""What is statically known of a ``numeric`` expression, and PostgreSQL's division on Spark.

Pure.  PostgreSQL's ``numeric / numeric`` (and ``avg``) rounds to a scale that depends on the
operands' *display scales* and values (``pgtrickle.sql.numeric_division``); Spark's decimal
division uses other rules. So every numeric quotient is computed on Spark by the row function
:data:`FUNCTION` (``numeric_division.spark_quotient``, registered by ``pgtrickle.spark.numeric``)
and cast to a decimal type chosen here. What that needs of each operand is its **shape**:

* ``digits``: a bound on its integer digits (``None``: unknown);
* ``scale``: its display scale, the same on every row (``None``: unknown).

Shapes follow PostgreSQL's rules: ``numeric(p,s)`` columns and casts are ``(p - s, s)``;
integers ``(5|10|19, 0)``; a constant its own digits (``1.50`` is ``(1, 2)``); ``+``/``-``
keep the larger scale, ``*`` adds them (``numeric_mul``); ``round``/``trunc`` to ``n`` places
give ``n``; ``sum``/``min``/``max`` keep the argument's scale; ``count`` is ``(19, 0)``. An
unconstrained ``numeric`` column's scale is unknown (every row has its own); so is a quotient's
(every row has its own rscale; a quotient inside the same expression passes its scale to an
outer division at run time, see :func:`quotient_scale_call`).

The Spark type of a quotient is ``DECIMAL(digits + scale, scale)``. ``digits`` bounds its
integer digits: the dividend's integer digits plus the divisor's scale (``|a / b| <
10**digits(a) / 10**-scale(b)``), the argument's for ``avg``; where that is not known, 18.
``scale`` is what is left of 38 digits, at least 20 and at least the operands' scales: 20
fraction digits hold every quotient of absolute value 1e-4 or more (its rscale is at most 20
when the operands' scales are), each further digit one more power of ten below. A row whose
quotient needs more is refused by the row function with SQLSTATE 22003, naming the expression.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlglot import exp

from pgtrickle.sql.nodes import decimal_shape, decimal_type, literal_decimal, spark_func, type_params
from pgtrickle.sql.numeric_division import UNKNOWN_SCALE

Shape = tuple[int | None, int | None]
"""(integer digits bound, display scale); ``None`` where unknown."""

UNKNOWN: Shape = (None, None)

SHAPE_KEY = "pgt_numeric_shape"
"""Node meta: the :data:`Shape` the type inference found (PostgreSQL expressions)."""

SCALE_EXPR_KEY = "pgt_numeric_scale_expr"
"""Node meta: a Spark expression giving a quotient's display scale per row (set on rewritten
quotients, for a division around them)."""

FUNCTION = "pgt_numeric_div"
"""The Spark SQL function computing one quotient (``numeric_division.spark_quotient``)."""

SCALE_FUNCTION = "pgt_numeric_div_scale"
"""The Spark SQL function giving one quotient's display scale (``numeric_division.spark_scale``)."""

MIN_QUOTIENT_SCALE = 20
MAX_PRECISION = 38

_INT_DIGITS = {"int2": 5, "int4": 10, "int8": 19}
_NUMERIC_NAME = re.compile(
    r"^\s*(numeric|decimal)\s*(?:\(\s*(\d+)\s*(?:,\s*(-?\d+)\s*)?\))?\s*$", re.IGNORECASE
)


def shape_of_type_name(type_name: str | None, category: str | None) -> Shape:
    """The shape of a column of PostgreSQL type ``type_name`` (``numeric(12,2)``, ``integer``).

    A Spark name (``decimal(38,18)``, as an unconstrained ``numeric`` is read) gives its integer
    digits only: the display scale of the values it holds is not known from it.
    """
    if category in _INT_DIGITS:
        return _INT_DIGITS[category], 0
    if type_name is None:
        return UNKNOWN
    match = _NUMERIC_NAME.match(type_name)
    if match is None or match.group(2) is None:
        return UNKNOWN
    precision, scale = int(match.group(2)), int(match.group(3) or 0)
    if scale < 0 or scale > precision:
        return UNKNOWN
    if match.group(1).lower() == "decimal":
        return precision - scale, None
    return precision - scale, scale


def _max(values: Iterable[int | None]) -> int | None:
    known = list(values)
    return None if any(v is None for v in known) or not known else max(v for v in known if v is not None)


def _same(values: Iterable[int | None]) -> int | None:
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def _places(node: exp.Expr | None) -> int | None:
    """The constant number of places of ``round(x, n)``/``trunc(x, n)`` (0 when absent)."""
    if node is None:
        return 0
    value = literal_decimal(node)
    if value is None or value != value.to_integral_value():
        return None
    return int(value)


def shape_rule(node: exp.Expr, category: str | None, child: dict[int, Shape]) -> Shape | None:
    """The shape of ``node`` from its children's (``child``: by ``id`` of the child node), or
    ``None`` when ``node`` is not one of the forms this module follows (the caller then decides:
    a column, a subquery)."""

    def of(sub: exp.Expr | None) -> Shape:
        return UNKNOWN if sub is None else child.get(id(sub), UNKNOWN)

    if category in _INT_DIGITS and not isinstance(node, (exp.Column, exp.Cast)):
        return _INT_DIGITS[category], 0
    if isinstance(node, exp.Literal):
        value = literal_decimal(node)
        if node.is_string or value is None:
            return UNKNOWN
        precision, scale = decimal_shape(value)
        return precision - scale, scale
    if isinstance(node, exp.Cast):
        if category in _INT_DIGITS:
            return _INT_DIGITS[category], 0
        if category != "numeric":
            return UNKNOWN
        params = type_params(node.to)
        if params:
            scale = params[1] if len(params) > 1 else 0
            return (params[0] - scale, scale) if 0 <= scale <= params[0] else UNKNOWN
        inner = node.this
        constant = literal_decimal(inner)
        if constant is not None:
            precision, scale = decimal_shape(constant)
            return precision - scale, scale
        return of(inner)
    if isinstance(node, (exp.Paren, exp.Neg, exp.Abs, exp.Min, exp.Max, exp.Alias)):
        return of(node.this)
    if isinstance(node, (exp.Add, exp.Sub)):
        (d1, s1), (d2, s2) = of(node.this), of(node.expression)
        digits = _max((d1, d2))
        return (None if digits is None else digits + 1), _max((s1, s2))
    if isinstance(node, exp.Mul):
        (d1, s1), (d2, s2) = of(node.this), of(node.expression)
        digits = None if d1 is None or d2 is None else d1 + d2
        return digits, (None if s1 is None or s2 is None else s1 + s2)
    if isinstance(node, exp.Mod):
        (d1, s1), (d2, s2) = of(node.this), of(node.expression)
        return _max((d1, d2)), _max((s1, s2))
    if isinstance(node, exp.Sum):
        argument = node.this.expressions[0] if isinstance(node.this, exp.Distinct) else node.this
        return None, of(argument)[1]
    if isinstance(node, exp.Count):
        return 19, 0
    if isinstance(node, (exp.Round, exp.Trunc)):
        places = _places(node.args.get("decimals"))
        digits = of(node.this)[0]
        return (None if digits is None else digits + 1), (None if places is None else max(places, 0))
    if isinstance(node, (exp.Ceil, exp.Floor)) and node.args.get("decimals") is None:
        digits = of(node.this)[0]
        return (None if digits is None else digits + 1), 0
    if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
        shapes = [of(a) for a in [node.this, *node.expressions] if not isinstance(a, exp.Null)]
        return _max(d for d, _ in shapes), _same(s for _, s in shapes)
    if isinstance(node, exp.Case):
        branches = [b.args.get("true") for b in node.args.get("ifs") or []]
        default = node.args.get("default")
        shapes = [of(b) for b in [*branches, default] if b is not None and not isinstance(b, exp.Null)]
        return _max(d for d, _ in shapes), _same(s for _, s in shapes)
    if isinstance(node, exp.Avg):
        argument = node.this.expressions[0] if isinstance(node.this, exp.Distinct) else node.this
        return of(argument)[0], None
    if isinstance(node, exp.Div):
        (d1, _), (_, s2) = of(node.this), of(node.expression)
        return (None if d1 is None or s2 is None else d1 + s2), None
    if isinstance(node, (exp.Filter, exp.Window)):
        return of(node.this)
    return None


def shape(node: exp.Expr) -> Shape:
    """The shape the type inference stored on ``node`` (:data:`UNKNOWN` when none)."""
    found = node.meta.get(SHAPE_KEY)
    return found if isinstance(found, tuple) else UNKNOWN


def _scale_argument(node: exp.Expr, static: int | None) -> exp.Expr:
    """An operand's display scale as an argument of the row function: the known constant, the
    run-time scale of a quotient, or :data:`UNKNOWN_SCALE`."""
    if static is not None:
        return exp.Literal.number(static)
    inner = node
    while isinstance(inner, exp.Paren):
        inner = inner.this
    found = inner.meta.get(SCALE_EXPR_KEY)
    if isinstance(found, exp.Expr):
        return found.copy()
    return exp.Literal.number(UNKNOWN_SCALE)


def quotient_type(dividend: Shape, divisor: Shape, digits: int | None) -> tuple[int, int]:
    """``(integer digits, scale)`` of the Spark decimal a quotient is held in (see the module docs)."""
    scales = [s for s in (dividend[1], divisor[1]) if s is not None]
    room = MAX_PRECISION - digits if digits is not None else MIN_QUOTIENT_SCALE
    scale = min(max(MIN_QUOTIENT_SCALE, room, *scales), MAX_PRECISION - 1)
    left = MAX_PRECISION - scale
    return (left if digits is None else max(min(digits, left), 1)), scale


def quotient_call(
    dividend: exp.Expr,
    divisor: exp.Expr,
    dividend_shape: Shape,
    divisor_shape: Shape,
    digits: int | None,
    label: str,
) -> exp.Expr:
    """PostgreSQL's ``dividend / divisor`` (Spark expressions of PostgreSQL ``numeric`` or integer
    values) as a Spark expression of type ``DECIMAL(p, s)`` (:func:`quotient_type`); its per-row
    display scale is kept in the result's meta under :data:`SCALE_EXPR_KEY`."""
    int_digits, scale = quotient_type(dividend_shape, divisor_shape, digits)
    scale_a = _scale_argument(dividend, dividend_shape[1])
    scale_b = _scale_argument(divisor, divisor_shape[1])
    call = spark_func(
        FUNCTION,
        dividend,
        divisor,
        scale_a,
        scale_b,
        exp.Literal.number(scale),
        exp.Literal.number(int_digits),
        exp.Literal.string(label),
    )
    result = exp.Cast(this=call, to=decimal_type(int_digits + scale, scale))
    result.meta[SCALE_EXPR_KEY] = spark_func(
        SCALE_FUNCTION, dividend.copy(), divisor.copy(), scale_a.copy(), scale_b.copy()
    )
    return result


def label_of(node: exp.Expr) -> str:
    """The PostgreSQL text of an expression, short enough for an error message."""
    text = " ".join(node.sql(dialect="postgres").split())
    return text if len(text) <= 160 else text[:157] + "..."
