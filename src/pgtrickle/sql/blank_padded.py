"""``character(n)`` (``bpchar``) values on Spark: carried without their trailing blanks.

PostgreSQL stores ``character(n)`` padded with blanks to ``n`` characters, but
its trailing blanks are *insignificant*: ``=``, ``<``, ``GROUP BY``,
``DISTINCT``, joins and ``length()`` ignore them, and converting the value to
``text`` / ``varchar`` (which ``||``, ``substring``, ``upper`` ... do) removes
them. Spark has no such type: a padded string compares unequal to the
unpadded literal ``'BUILDING'``. So a ``bpchar`` column crosses to Spark as
its value without trailing blanks (``c::text`` in the JDBC read,
:mod:`pgtrickle.spark.carry`), and written back into a ``character(n)``
column PostgreSQL pads it again. With that representation:

* a cast to ``character(n)`` / ``bpchar`` (``'BUILDING'::bpchar``, how
  PostgreSQL's normalized text writes a literal compared with such a column)
  becomes the value truncated to ``n`` characters without trailing blanks
  (:func:`cast_to_blank_padded`): only blanks (U+0020) are removed, not tabs,
  as in PostgreSQL;
* the few operations that see the *padding* -- ``LIKE`` / ``ILIKE``, regular
  expressions, ``octet_length()``, ``concat()`` / ``concat_ws()`` -- get the
  value padded back to ``n`` (:func:`padded`). For ``bpchar`` without a length
  (values keep whatever blanks they were written with) the padding is not
  known, so such an operation is refused.

The width of an expression comes from the translator's type inference
(``character(n)`` source columns, casts, and derived tables over them) and is
kept in ``node.meta[WIDTH_KEY]``: ``n``, ``0`` for ``bpchar`` without a
length, absent when the value is not blank-padded.
"""

from __future__ import annotations

import re

from sqlglot import exp

from pgtrickle.errors import UnsupportedQueryError

WIDTH_KEY = "pgt_bpchar_width"

_KINDS = frozenset(getattr(exp.DType, n) for n in ("CHAR", "NCHAR", "BPCHAR") if hasattr(exp.DType, n))
_NAME = re.compile(r"^\s*(?:character|char|bpchar)\s*(?:\(\s*(\d+)\s*\))?\s*$")


def width_from_type_name(type_name: str | None) -> int | None:
    """``n`` for ``character(n)``, ``0`` for ``bpchar`` / ``character`` without a length, else ``None``.

    >>> width_from_type_name("character(10)"), width_from_type_name("bpchar"), width_from_type_name('"char"')
    (10, 0, None)
    """
    if not type_name:
        return None
    match = _NAME.match(type_name.lower())
    if match is None:
        return None
    return int(match.group(1)) if match.group(1) else 0


def width_from_datatype(datatype: exp.DataType) -> int | None:
    """The width of a cast's target type (see :func:`width_from_type_name`)."""
    if datatype.this not in _KINDS:
        return None
    params = [p.this for p in datatype.expressions if isinstance(p, exp.DataTypeParam)]
    if params and isinstance(params[0], exp.Literal) and not params[0].is_string:
        return int(params[0].this)
    # PostgreSQL's `character` with no length is character(1); `bpchar` has none.
    return 0 if datatype.this == getattr(exp.DType, "BPCHAR", None) else 1


def cast_to_blank_padded(value: exp.Expr, width: int) -> exp.Expr:
    """``value::character(width)`` (``width`` 0: ``::bpchar``) in the carried form: no trailing blanks.

    >>> cast_to_blank_padded(exp.Literal.string("AB  CD  "), 3).sql("spark")
    "'AB'"
    """
    if isinstance(value, exp.Literal) and value.is_string:
        literal = value.this[:width] if width else value.this
        return exp.Literal.string(literal.rstrip(" "))
    text: exp.Expr = exp.Cast(this=value, to=exp.DataType.build("STRING"))
    if width:
        text = exp.Substring(this=text, start=exp.Literal.number(1), length=exp.Literal.number(width))
    return exp.Anonymous(this="RTRIM", expressions=[text])


def padded(node: exp.Expr, what: str) -> exp.Expr:
    """``node`` padded back to its ``character(n)`` width for an operation that sees the blanks.

    ``what`` names the operation in the refusal of a ``bpchar`` without a length.
    """
    width = node.meta.get(WIDTH_KEY)
    if width is None:
        return node
    if width == 0:
        raise UnsupportedQueryError(
            f"{what} on a bpchar value without a length is not supported: its trailing blanks are significant "
            "there and are not carried to Spark; cast it to text or to character(n) in the query"
        )
    pad = exp.Pad(
        this=node, expression=exp.Literal.number(width), fill_pattern=exp.Literal.string(" "), is_left=False
    )
    pad.meta.update({k: v for k, v in node.meta.items() if k != WIDTH_KEY})
    return pad
