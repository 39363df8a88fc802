"""Constructs the lowering refuses up front, wherever they appear in the query.

Pure. Each raises :class:`pgtrickle.errors.NoDeltaRuleError` whose ``construct`` names it:
``WITH RECURSIVE`` (a fixpoint, not an operator tree), ``FOR UPDATE / FOR SHARE``, a named
``WINDOW`` clause, ``LATERAL``, ``TABLESAMPLE``, ``GROUPING SETS / ROLLUP / CUBE``, a
set-returning function (``generate_series``, ``unnest``...) anywhere, and a volatile function
(``random()``, ``clock_timestamp()``, ``nextval()``...: its value changes with no source change,
so no change of the sources can say how the result changed).
"""

from __future__ import annotations

from sqlglot import exp

from pgtrickle.dvm.lower_scope import refuse
from pgtrickle.sql.translate import set_returning_function, volatile_function


def check(query: exp.Expr) -> None:
    """Refuse, up front, constructs that no part of the lowering handles."""
    for node in query.walk():
        if isinstance(node, exp.With) and node.args.get("recursive"):
            raise refuse("WITH RECURSIVE")
        if isinstance(node, exp.Select):
            if node.args.get("locks"):
                raise refuse("FOR UPDATE / FOR SHARE")
            if node.args.get("windows"):
                raise refuse("a named WINDOW clause")
        if isinstance(node, exp.Lateral) or (
            isinstance(node, (exp.Subquery, exp.Table, exp.Join)) and node.args.get("lateral")
        ):
            raise refuse("LATERAL")
        if isinstance(node, exp.TableSample):
            raise refuse("TABLESAMPLE")
        if isinstance(node, (exp.Rollup, exp.Cube, exp.GroupingSets)) or (
            isinstance(node, exp.Group) and any(node.args.get(a) for a in ("rollup", "cube", "grouping_sets"))
        ):
            raise refuse("GROUPING SETS / ROLLUP / CUBE")
        srf = set_returning_function(node)
        if srf is not None:
            raise refuse(f"the set-returning function {srf}()")
    volatile = volatile_function(query)
    if volatile is not None:
        raise refuse(f"the volatile function {volatile}()", "its value changes without any source changing")
