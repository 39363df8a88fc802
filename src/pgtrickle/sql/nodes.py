"""Small sqlglot helpers the translation modules share: dialect names, node builders, literals.

Pure: builds and reads sqlglot nodes.  The PostgreSQL type category the type
inference gives a node is kept in its ``meta`` under :data:`META_KEY`
(:func:`pg_type` reads it, :func:`typed` sets it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from decimal import Decimal, InvalidOperation
from typing import TypeVar

from sqlglot import exp

READ = "postgres"

T = TypeVar("T")


WRITE = "spark"


META_KEY = "pgt_type"


INT_CONDITION_KEY = "pgt_int_condition"


_INTERVAL_TOKEN = re.compile(
    r"\s*(?:(?P<num>[+-]?\d+(?:\.\d+)?)\s+"
    r"(?P<unit>years?|mons?|months?|weeks?|days?|hours?|mins?|minutes?|secs?|seconds?)\b"
    r"|(?P<sign>[+-])?(?P<h>\d+):(?P<m>\d{2}):(?P<s>\d{2}(?:\.\d+)?))",
)


#: Blank-padded ``character(n)`` types, whose comparison semantics Spark does not have.
BLANK_PADDED_TYPES = frozenset(
    getattr(exp.DType, n) for n in ("CHAR", "NCHAR", "BPCHAR") if hasattr(exp.DType, n)
)


#: Name of the FROM argument of sqlglot's Select (renamed in recent versions).
FROM_KEY = "from_" if "from_" in exp.Select.arg_types else "from"


#: Operators that may have ``ANY (...)``/``ALL (...)`` on their right.
QUANTIFIED_PARENTS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.ILike)


def array_elements(operand: exp.Expr) -> list[exp.Expr] | None:
    """Elements of an ``ARRAY[...]`` constructor, possibly parenthesised and cast to an array type."""
    node = operand
    while True:
        if isinstance(node, exp.Paren) or (isinstance(node, exp.Cast) and node.to.is_type(exp.DType.ARRAY)):
            node = node.this
        else:
            break
    if isinstance(node, exp.Array):
        return list(node.expressions)
    return None


def subquery_operand(operand: exp.Expr) -> exp.Query | None:
    """The query of a quantified comparison's subquery operand, if it is one."""
    node = operand
    while isinstance(node, (exp.Paren, exp.Subquery)) and not (isinstance(node, exp.Subquery) and node.alias):
        node = node.this
    return node if isinstance(node, (exp.Select, exp.SetOperation)) else None


def regexp_flags(node: exp.RegexpReplace) -> str | None:
    """The flags of a ``regexp_replace`` call ('' when none), or None when not constant."""
    modifiers = node.args.get("modifiers")
    if modifiers is None:
        return ""
    if isinstance(modifiers, exp.Literal) and modifiers.is_string:
        return modifiers.this
    return None


def type_params(datatype: exp.DataType) -> list[int]:
    """Integer type modifiers of a data type (``numeric(10, 2)`` -> ``[10, 2]``)."""
    params: list[int] = []
    for param in datatype.expressions:
        value = param.this if isinstance(param, exp.DataTypeParam) else param
        text = value.name if isinstance(value, exp.Expr) else str(value)
        try:
            params.append(int(text))
        except ValueError:
            return []
    return params


def literal_decimal(node: exp.Expr) -> Decimal | None:
    """The value of a numeric constant (number, numeric string, or negated number)."""
    negate = False
    while isinstance(node, (exp.Paren, exp.Neg)):
        if isinstance(node, exp.Neg):
            negate = not negate
        node = node.this
    if not isinstance(node, exp.Literal):
        return None
    try:
        value = Decimal(node.this.strip())
    except (InvalidOperation, AttributeError):
        return None
    if not value.is_finite():
        return None
    return -value if negate else value


def decimal_shape(value: Decimal) -> tuple[int, int]:
    """Smallest ``(precision, scale)`` holding ``value`` exactly."""
    _sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    scale = max(-exponent, 0)
    integer_digits = max(len(digits) + exponent, 0)
    return max(integer_digits + scale, 1), scale


def decimal_type(precision: int, scale: int) -> exp.DataType:
    """A ``DECIMAL(precision, scale)`` data type."""
    return exp.DataType.build(f"DECIMAL({precision}, {scale})", dialect=WRITE)


def spark_type(name: str) -> exp.DataType:
    """A simple Spark data type by name."""
    return exp.DataType.build(name, dialect=WRITE)


def spark_func(name: str, *args: exp.Expr) -> exp.Anonymous:
    """A Spark function call emitted verbatim."""
    return exp.Anonymous(this=name, expressions=list(args))


def spark_cast(node: exp.Expr, type_name: str) -> exp.Cast:
    """``CAST(node AS type_name)`` with a Spark type name."""
    return exp.Cast(this=node, to=spark_type(type_name))


def typeof_in(node: exp.Expr, names: Iterable[str]) -> exp.In:
    """``typeof(node) IN (names...)`` - a run-time type test on Spark."""
    return exp.In(this=spark_func("TYPEOF", node), expressions=[exp.Literal.string(n) for n in names])


def paren(node: exp.Expr) -> exp.Paren:
    """Wrap an expression in parentheses."""
    return exp.Paren(this=node)


def inferred_type(node: exp.Expr | None) -> str | None:
    """The inferred PostgreSQL type category of a node (None when unknown)."""
    if node is None:
        return None
    value = node.meta.get(META_KEY)
    return value if isinstance(value, str) else None


def typed(node: exp.Expr, pg_type: str | None) -> exp.Expr:
    """Record the PostgreSQL type category of a node built by the rewriter."""
    node.meta[META_KEY] = pg_type
    return node


def is_string_literal(node: exp.Expr) -> bool:
    """Whether a node is a plain string constant."""
    return isinstance(node, exp.Literal) and node.is_string


def extract_field(node: exp.Extract) -> str:
    """The lower-case field name of an ``extract``/``date_part`` call."""
    field = node.this
    while isinstance(field, (exp.Cast, exp.Paren)):
        field = field.this
    if isinstance(field, exp.Expr):
        return field.name.lower()
    return str(field).lower()


def unit_name(unit: exp.Expr | None) -> str:
    """The lower-case unit of a ``date_trunc`` call."""
    while isinstance(unit, (exp.Cast, exp.Paren)):
        unit = unit.this
    if isinstance(unit, exp.Expr):
        return unit.name.lower()
    return str(unit or "").lower()


def parse_interval(text: str) -> tuple[int, int, int, int, int, int, Decimal] | None:
    """Parse PostgreSQL interval text into make_interval arguments.

    Returns ``(years, months, weeks, days, hours, minutes, seconds)`` or None
    when the text is not in PostgreSQL's output format (``1 year 2 mons 3 days
    04:05:06.5``) or the plain unit form (``2 hours``).
    """
    values = {"year": 0, "mon": 0, "week": 0, "day": 0, "hour": 0, "min": 0}
    seconds = Decimal(0)
    position = 0
    text = text.strip().lower()
    if not text:
        return None
    while position < len(text):
        match = _INTERVAL_TOKEN.match(text, position)
        if match is None or match.end() == position:
            return None
        position = match.end()
        if match.group("num") is not None:
            number = Decimal(match.group("num"))
            unit = match.group("unit")
            if unit.startswith("sec"):
                seconds += number
                continue
            if number != number.to_integral_value():
                return None
            key = next(k for k in ("year", "mon", "week", "day", "hour", "min") if unit.startswith(k))
            values[key] += int(number)
        else:
            sign = -1 if match.group("sign") == "-" else 1
            values["hour"] += sign * int(match.group("h"))
            values["min"] += sign * int(match.group("m"))
            seconds += sign * Decimal(match.group("s"))
        while position < len(text) and text[position].isspace():
            position += 1
    return (
        values["year"],
        values["mon"],
        values["week"],
        values["day"],
        values["hour"],
        values["min"],
        seconds,
    )


def to_java_replacement(replacement: str, group_shift: int, whole_match: str) -> str | None:
    """Convert a PostgreSQL ``regexp_replace`` replacement into Java syntax (None if impossible)."""
    out: list[str] = []
    i = 0
    while i < len(replacement):
        char = replacement[i]
        if char == "\\":
            if i + 1 >= len(replacement):
                return None
            following = replacement[i + 1]
            if following in "123456789":
                out.append(f"${int(following) + group_shift}")
            elif following == "&":
                out.append(whole_match)
            elif following == "\\":
                out.append("\\\\")
            else:
                return None
            i += 2
            continue
        out.append("\\$" if char == "$" else char)
        i += 1
    return "".join(out)


def java_pattern(pattern: exp.Expr, flags: str) -> exp.Expr:
    """Prefix a regular expression with Java inline flags (``s`` always: ``.`` matches newlines)."""
    prefix = f"(?{flags}s)"
    if is_string_literal(pattern):
        return exp.Literal.string(prefix + pattern.this)
    return spark_func("CONCAT", exp.Literal.string(prefix), pattern)


def fold_outputs(
    node: exp.Expr,
    index: int,
    leaf: Callable[[exp.Expr | None], T],
    combine: Callable[[list[T]], T],
    *,
    through_values: bool = True,
) -> T:
    """Fold over the ``index``-th output expression of every branch of a (sub)query.

    A ``SELECT`` gives ``leaf`` its ``index``-th projection (``None`` for a
    ``*`` or a missing one); a set operation ``combine``s its two sides,
    pairwise as PostgreSQL resolves a set operation's column types; a
    ``VALUES`` list ``combine``s its rows' ``index``-th values (unless
    ``through_values`` is false: then, like anything else, ``leaf(None)``).
    """
    while isinstance(node, exp.Subquery):
        node = node.this
    if isinstance(node, exp.Select):
        projections = node.expressions
        if index < len(projections) and not isinstance(projections[index], exp.Star):
            return leaf(projections[index])
        return leaf(None)
    if isinstance(node, exp.SetOperation):
        return combine(
            [
                fold_outputs(side, index, leaf, combine, through_values=through_values)
                for side in (node.this, node.expression)
            ]
        )
    if isinstance(node, exp.Values) and through_values:
        return combine(
            [
                leaf(
                    row.expressions[index]
                    if isinstance(row, exp.Tuple) and index < len(row.expressions)
                    else None
                )
                for row in node.expressions
            ]
        )
    return leaf(None)
