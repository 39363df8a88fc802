"""Rewrite a typed PostgreSQL expression tree into one with the same result on Spark.

Pure.  The rules and why are in ``sql/translate.py``'s module docs ("Semantic
decisions"); casts are in ``sql/rewrite_casts.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlglot import exp

from pgtrickle.sql import blank_padded
from pgtrickle.sql.functions import EXTRACT_FIELDS, TIMESTAMP_FUNCTIONS, TRUNC_UNITS, UUID_FUNCTIONS
from pgtrickle.sql.nodes import (
    INT_CONDITION_KEY,
    META_KEY,
    decimal_type,
    extract_field,
    inferred_type,
    is_string_literal,
    java_pattern,
    paren,
    regexp_flags,
    spark_cast,
    spark_func,
    to_java_replacement,
    typed,
    typeof_in,
    unit_name,
)
from pgtrickle.sql.numeric_scale import SHAPE_KEY, label_of, quotient_call, shape
from pgtrickle.sql.rewrite_casts import rewrite_cast
from pgtrickle.sql.typing_rules import (
    FLOAT_TYPES,
    INT_TYPES,
    SPARK_FLOAT_TYPENAMES,
    SPARK_INT_TYPENAMES,
)


class Rewriter:
    """Post-order rewrite of a typed PostgreSQL tree into Spark semantics."""

    def __init__(self) -> None:
        self._handlers: dict[type[exp.Expr], Callable[[Any], exp.Expr]] = {
            exp.Div: self._div,
            exp.Cast: rewrite_cast,
            exp.Round: self._round,
            exp.Trunc: self._trunc,
            exp.Log: self._log,
            exp.Extract: self._extract,
            exp.TimestampTrunc: self._date_trunc,
            exp.DateTrunc: self._date_trunc,
            exp.RegexpLike: self._regexp_like,
            exp.RegexpILike: self._regexp_like,
            exp.RegexpReplace: self._regexp_replace,
            exp.Substring: self._substring,
            exp.Left: self._left,
            exp.Right: self._right,
            exp.Concat: self._concat,
            exp.ConcatWs: self._concat_ws,
            exp.WithinGroup: self._within_group,
            exp.UnixToTime: self._unix_to_time,
            exp.Anonymous: self._anonymous,
            exp.Add: self._date_arithmetic,
            exp.Sub: self._date_arithmetic,
            exp.Collate: self._collate,
            exp.Like: self._blank_sensitive,
            exp.ILike: self._blank_sensitive,
            exp.Avg: self._avg,
            exp.Filter: self._aggregate_around_avg,
            exp.Window: self._aggregate_around_avg,
        }

    def rewrite(self, node: exp.Expr) -> exp.Expr:
        """Rewrite ``node``'s subtree bottom-up and return its replacement."""
        if isinstance(node, (exp.Div, exp.Avg)):
            node.meta[_LABEL_KEY] = label_of(node)
        for child in list(node.iter_expressions()):
            self.rewrite(child)
        handler = self._handlers.get(type(node))
        if handler is None:
            return node
        parent, arg_key, index = node.parent, node.arg_key, node.index
        pg_type = inferred_type(node)
        replacement = handler(node)
        if replacement is node:
            return node
        if META_KEY not in replacement.meta:
            replacement.meta[META_KEY] = pg_type
        if SHAPE_KEY in node.meta and SHAPE_KEY not in replacement.meta:
            replacement.meta[SHAPE_KEY] = node.meta[SHAPE_KEY]
        if blank_padded.WIDTH_KEY in node.meta and blank_padded.WIDTH_KEY not in replacement.meta:
            replacement.meta[blank_padded.WIDTH_KEY] = node.meta[blank_padded.WIDTH_KEY]
        if parent is not None and arg_key is not None:
            parent.set(arg_key, replacement, index)
        return replacement

    # -- arithmetic

    def _div(self, node: exp.Div) -> exp.Expr:
        """PostgreSQL division: integer operands truncate; numeric quotients are rounded to
        PostgreSQL's scale (``sql/numeric_scale.py``)."""
        left, right = node.this, node.expression
        left_type, right_type = inferred_type(left), inferred_type(right)
        exact = (*INT_TYPES, "numeric")
        if left_type in exact and right_type in exact and "numeric" in (left_type, right_type):
            return quotient_call(
                left,
                right,
                shape(left),
                shape(right),
                shape(node)[0],
                node.meta.get(_LABEL_KEY) or label_of(node),
            )
        if left_type in INT_TYPES and right_type in INT_TYPES:
            quotient = exp.IntDiv(this=left, expression=right)
            widest = max((left_type, right_type), key=INT_TYPES.index)
            if widest == "int8":
                return typed(quotient, "int8")
            return typed(spark_cast(quotient, "INT" if widest == "int4" else "SMALLINT"), widest)
        fractional = exp.Div(this=left, expression=right, typed=False, safe=False)
        if any(t is not None and t not in INT_TYPES for t in (left_type, right_type)):
            # A known non-integer operand (numeric, float, NULL...) makes it a true division.
            return fractional
        condition = _and_conditions(_integer_condition(left), _integer_condition(right))
        if condition is False:
            return fractional
        assert not isinstance(condition, bool), "both operands known to be integers is handled above"
        integral = exp.IntDiv(
            this=spark_cast(left.copy(), "BIGINT"), expression=spark_cast(right.copy(), "BIGINT")
        )
        dispatch = exp.Case(ifs=[exp.If(this=condition, true=integral)], default=fractional)
        dispatch.meta[INT_CONDITION_KEY] = condition.copy()
        return dispatch

    def _date_arithmetic(self, node: exp.Add | exp.Sub) -> exp.Expr:
        """``date - date`` is a day count; dates combined with intervals become timestamps."""
        left, right = node.this, node.expression
        left_type, right_type = inferred_type(left), inferred_type(right)
        date_or_unknown = {left_type, right_type} <= {"date", None}
        if isinstance(node, exp.Sub) and "date" in (left_type, right_type) and date_or_unknown:
            # date - date counts days (Spark would return an interval).  With one side of
            # unknown type the other is assumed to be a date as well: PostgreSQL's only
            # other choice, date - integer, is refused by Spark's DATEDIFF rather than
            # silently computed differently.
            return typed(spark_func("DATEDIFF", left, right), "int4")
        # date +/- interval is a timestamp in PostgreSQL (Spark keeps a date, or fails when the
        # interval has a time part).  An operand of unknown type next to an interval is a date
        # or a timestamp, and casting a timestamp to TIMESTAMP changes nothing.
        if right_type == "interval" and left_type in ("date", None):
            node.set("this", spark_cast(left, "TIMESTAMP"))
        elif isinstance(node, exp.Add) and left_type == "interval" and right_type in ("date", None):
            node.set("expression", spark_cast(right, "TIMESTAMP"))
        return node

    # -- numeric functions

    def _round(self, node: exp.Round) -> exp.Expr:
        """``round(double precision)`` rounds half to even in PostgreSQL."""
        if node.args.get("decimals") is not None:
            return node
        value = node.this
        value_type = inferred_type(value)
        if value_type in FLOAT_TYPES:
            return spark_func("BROUND", value, exp.Literal.number(0))
        if value_type in (*INT_TYPES, "numeric"):
            return node
        return exp.Case(
            ifs=[
                exp.If(
                    this=typeof_in(value.copy(), SPARK_FLOAT_TYPENAMES),
                    true=spark_func("BROUND", value.copy(), exp.Literal.number(0)),
                )
            ],
            default=exp.Round(this=value, decimals=exp.Literal.number(0)),
        )

    def _trunc(self, node: exp.Trunc) -> exp.Expr:
        """``trunc`` rounds toward zero."""
        value = node.this
        decimals = node.args.get("decimals")
        if decimals is None and inferred_type(value) in FLOAT_TYPES:
            down, up = spark_func("FLOOR", value.copy()), spark_func("CEIL", value.copy())
        else:
            places = decimals if decimals is not None else exp.Literal.number(0)
            down, up = (
                spark_func("FLOOR", value.copy(), places.copy()),
                spark_func("CEIL", value.copy(), places.copy()),
            )
        negative = exp.LT(this=value, expression=exp.Literal.number(0))
        return exp.Case(ifs=[exp.If(this=negative, true=up)], default=down)

    def _log(self, node: exp.Log) -> exp.Expr:
        """``log(x)`` is the base-10 logarithm in PostgreSQL."""
        if node.args.get("expression") is None:
            return spark_func("LOG10", node.this)
        return node

    # -- date and time

    def _extract(self, node: exp.Extract) -> exp.Expr:
        """``extract``/``date_part`` fields with PostgreSQL's numbering."""
        field = extract_field(node)
        value = node.expression
        if field in EXTRACT_FIELDS:
            return exp.Extract(this=exp.var(EXTRACT_FIELDS[field]), expression=value)
        if field == "dow":
            sunday_is_one = exp.Extract(this=exp.var("DOW"), expression=value)
            return paren(exp.Sub(this=sunday_is_one, expression=exp.Literal.number(1)))
        if field == "epoch":
            micros = spark_func("UNIX_MICROS", spark_cast(value, "TIMESTAMP"))
            return paren(
                exp.Div(
                    this=exp.Cast(this=micros, to=decimal_type(20, 0)),
                    expression=exp.Literal.number(1000000),
                    typed=False,
                    safe=False,
                )
            )
        factor = 1000 if field.startswith("milli") else 1000000
        seconds = exp.Extract(this=exp.var("SECOND"), expression=value)
        return paren(exp.Mul(this=seconds, expression=exp.Literal.number(factor)))

    def _date_trunc(self, node: exp.Expr) -> exp.Expr:
        """``date_trunc(unit, x)`` with Spark's unit names."""
        unit = TRUNC_UNITS[unit_name(node.args.get("unit"))]
        return spark_func("DATE_TRUNC", exp.Literal.string(unit), node.this)

    def _unix_to_time(self, node: exp.UnixToTime) -> exp.Expr:
        """``to_timestamp(seconds)`` keeps fractional seconds."""
        return spark_func("TIMESTAMP_SECONDS", node.this)

    # -- text

    def _regexp_like(self, node: exp.Expr) -> exp.Expr:
        """``~`` and ``~*``: ``.`` matches newlines in PostgreSQL regular expressions."""
        flags = "i" if isinstance(node, exp.RegexpILike) else ""
        return exp.RegexpLike(
            this=blank_padded.padded(node.this, "a regular expression match"),
            expression=java_pattern(node.expression, flags),
        )

    def _blank_sensitive(self, node: exp.Like | exp.ILike) -> exp.Expr:
        """LIKE / ILIKE see a ``character(n)`` value's padding blanks in PostgreSQL."""
        node.set("this", blank_padded.padded(node.this, "LIKE"))
        return node

    def _regexp_replace(self, node: exp.RegexpReplace) -> exp.Expr:
        """``regexp_replace``: first match only unless the ``g`` flag is given."""
        flags = regexp_flags(node) or ""
        case_flag = "i" if "i" in flags else ""
        replacement = node.args["replacement"].this
        pattern = node.expression
        if "g" in flags:
            java_replacement = to_java_replacement(replacement, 0, "$0")
            assert java_replacement is not None
            return spark_func(
                "REGEXP_REPLACE",
                node.this,
                java_pattern(pattern, case_flag),
                exp.Literal.string(java_replacement),
            )
        # Group 1 is the text before the first match, group 2 the match itself
        # (numbered, not named: Spark would substitute "${name}" as a variable).
        java_replacement = to_java_replacement(replacement, 2, "$2")
        assert java_replacement is not None
        first_only = f"(?{case_flag}s)^(.*?)({pattern.this})"
        return spark_func(
            "REGEXP_REPLACE",
            node.this,
            exp.Literal.string(first_only),
            exp.Literal.string("$1" + java_replacement),
        )

    def _substring(self, node: exp.Substring) -> exp.Expr:
        """``substring`` positions before 1 count as characters that do not exist."""
        start = node.args.get("start")
        length = node.args.get("length")
        if start is None or _positive_int_literal(start):
            return node
        clamped = spark_func("GREATEST", start.copy(), exp.Literal.number(1))
        if length is None:
            return exp.Substring(this=node.this, start=clamped)
        remaining = exp.Sub(
            this=exp.Add(this=paren(start), expression=paren(length)), expression=clamped.copy()
        )
        new_length = spark_func("GREATEST", remaining, exp.Literal.number(0))
        return exp.Substring(this=node.this, start=clamped, length=new_length)

    def _left(self, node: exp.Left) -> exp.Expr:
        """``left(s, -n)`` drops the last n characters."""
        text, count = node.this, node.expression
        if _non_negative_int_literal(count):
            return node
        all_but = exp.Substring(
            this=text.copy(),
            start=exp.Literal.number(1),
            length=spark_func(
                "GREATEST",
                exp.Add(this=exp.Length(this=text.copy()), expression=paren(count.copy())),
                exp.Literal.number(0),
            ),
        )
        return exp.If(
            this=exp.LT(this=count.copy(), expression=exp.Literal.number(0)), true=all_but, false=node
        )

    def _right(self, node: exp.Right) -> exp.Expr:
        """``right(s, -n)`` drops the first n characters."""
        text, count = node.this, node.expression
        if _non_negative_int_literal(count):
            return node
        all_but = exp.Substring(
            this=text.copy(), start=exp.Sub(this=exp.Literal.number(1), expression=paren(count.copy()))
        )
        return exp.If(
            this=exp.LT(this=count.copy(), expression=exp.Literal.number(0)), true=all_but, false=node
        )

    def _concat(self, node: exp.Concat) -> exp.Expr:
        """``concat`` ignores NULL arguments in PostgreSQL."""
        return spark_func(
            "CONCAT_WS",
            exp.Literal.string(""),
            *(_as_pg_text(blank_padded.padded(arg, "concat()")) for arg in node.expressions),
        )

    def _concat_ws(self, node: exp.ConcatWs) -> exp.Expr:
        """``concat_ws`` with every argument converted to text."""
        separator, *values = node.expressions
        return spark_func(
            "CONCAT_WS", separator, *(_as_pg_text(blank_padded.padded(arg, "concat_ws()")) for arg in values)
        )

    def _collate(self, node: exp.Collate) -> exp.Expr:
        """``COLLATE "C"`` is Spark's default code-point ordering."""
        return node.this

    # -- aggregates and others

    def _avg(self, node: exp.Avg) -> exp.Expr:
        """``avg`` of integers or numerics is ``sum / count`` by PostgreSQL's numeric division
        (under a FILTER or OVER, :meth:`_aggregate_around_avg` rewrites it)."""
        if not _numeric_average(node) or (
            isinstance(node.parent, (exp.Filter, exp.Window)) and node.arg_key == "this"
        ):
            return node
        return self._average(node, lambda aggregate: aggregate)

    def _aggregate_around_avg(self, node: exp.Filter | exp.Window) -> exp.Expr:
        """``avg(x) FILTER (...)`` / ``avg(x) OVER (...)``: the sum and the count each under it."""
        inner = node.this
        if not isinstance(inner, exp.Avg) or not _numeric_average(inner):
            return node

        def around(aggregate: exp.Expr) -> exp.Expr:
            wrapper = node.copy()
            wrapper.set("this", aggregate)
            return wrapper

        label = node.meta.get(_LABEL_KEY) or inner.meta.get(_LABEL_KEY) or label_of(node)
        return self._average(inner, around, label)

    def _average(
        self, node: exp.Avg, around: Callable[[exp.Expr], exp.Expr], label: str | None = None
    ) -> exp.Expr:
        argument = node.this
        value = _average_argument(node)
        total = around(exp.Sum(this=argument.copy()))
        count = around(exp.Count(this=argument.copy()))
        value_shape = shape(value)
        return quotient_call(
            total,
            count,
            (None, value_shape[1]),
            (19, 0),
            value_shape[0],
            label or node.meta.get(_LABEL_KEY) or label_of(node),
        )

    def _within_group(self, node: exp.WithinGroup) -> exp.Expr:
        """Exact percentiles (sqlglot would make them approximate)."""
        function = node.this
        if isinstance(function, (exp.PercentileCont, exp.PercentileDisc)):
            name = "PERCENTILE_CONT" if isinstance(function, exp.PercentileCont) else "PERCENTILE_DISC"
            return exp.WithinGroup(this=spark_func(name, function.this), expression=node.expression)
        return node

    def _anonymous(self, node: exp.Anonymous) -> exp.Expr:
        """Functions sqlglot does not model that have a direct Spark replacement."""
        name = node.name.lower()
        if name == "octet_length":
            node.set("expressions", [blank_padded.padded(arg, "octet_length()") for arg in node.expressions])
            return node
        if name in TIMESTAMP_FUNCTIONS:
            return exp.CurrentTimestamp()
        if name in UUID_FUNCTIONS:
            return spark_func("UUID")
        return node


def _average_argument(node: exp.Avg) -> exp.Expr:
    argument = node.this
    return argument.expressions[0] if isinstance(argument, exp.Distinct) else argument


def _numeric_average(node: exp.Avg) -> bool:
    """Whether PostgreSQL's ``avg`` here is ``numeric`` (of an integer or numeric argument)."""
    return inferred_type(_average_argument(node)) in (*INT_TYPES, "numeric")


_LABEL_KEY = "pgt_label"
"""Node meta: the PostgreSQL text of a division or ``avg``, for the row function's messages."""


def _integer_condition(node: exp.Expr) -> exp.Expr | bool:
    """Whether ``node`` has a PostgreSQL integer type: True/False, or a run-time Spark test.

    The run-time test is ``typeof(...)`` of the leaves whose type is unknown.
    Arithmetic is looked through, so a division nested in another one is
    judged by its operands rather than by the Spark type of the inner
    division (which is ``DOUBLE`` when it was decided at run time).
    """
    pg_type = inferred_type(node)
    if pg_type is not None:
        return pg_type in INT_TYPES
    recorded = node.meta.get(INT_CONDITION_KEY)
    if isinstance(recorded, exp.Expr):
        return recorded.copy()
    if isinstance(node, (exp.Paren, exp.Neg)):
        return _integer_condition(node.this)
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Mod)):
        return _and_conditions(_integer_condition(node.this), _integer_condition(node.expression))
    return typeof_in(node.copy(), SPARK_INT_TYPENAMES)


def _and_conditions(left: exp.Expr | bool, right: exp.Expr | bool) -> exp.Expr | bool:
    """Three-way AND of conditions that may be known constants."""
    if left is False or right is False:
        return False
    if left is True:
        return right
    if right is True:
        return left
    return exp.and_(left, right)


def _as_pg_text(node: exp.Expr) -> exp.Expr:
    """An argument of ``concat`` converted to text as PostgreSQL's output function would.

    Booleans print as ``t``/``f`` (the first letter of Spark's ``true``/``false``).
    """
    pg_type = inferred_type(node)
    if is_string_literal(node) or pg_type == "text":
        return node
    if pg_type == "bool":
        return exp.Left(this=spark_cast(node, "STRING"), expression=exp.Literal.number(1))
    if pg_type is not None or isinstance(node, exp.Literal):
        return spark_cast(node, "STRING")
    as_bool = exp.Left(this=spark_cast(node.copy(), "STRING"), expression=exp.Literal.number(1))
    is_bool = exp.EQ(this=spark_func("TYPEOF", node.copy()), expression=exp.Literal.string("boolean"))
    return exp.Case(ifs=[exp.If(this=is_bool, true=as_bool)], default=spark_cast(node, "STRING"))


def _positive_int_literal(node: exp.Expr) -> bool:
    """Whether a node is an integer constant of at least 1."""
    return (
        isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit() and int(node.this) >= 1
    )


def _non_negative_int_literal(node: exp.Expr) -> bool:
    """Whether a node is an integer constant of at least 0."""
    return isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit()
