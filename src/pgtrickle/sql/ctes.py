"""Common table expressions whose names clash across nesting levels, renamed apart.

PostgreSQL scopes a CTE to the query whose ``WITH`` defines it, so an inner
``WITH a AS (...)`` may shadow an outer ``a``. sqlglot's Spark generator
moves every ``WITH`` to the top of the statement (it assumes, as Hive did,
that CTEs live only there) and leaves clashing names as they are, which
Spark refuses (``DUPLICATED_CTE_NAMES``) or, worse, could resolve to the
other definition. :func:`rename_clashing_ctes` gives every CTE whose name
occurs more than once its own name first, respecting PostgreSQL's scoping.

Pure: rewrites a sqlglot tree.
"""

from __future__ import annotations

from collections import Counter

from sqlglot import exp


def rename_clashing_ctes(query: exp.Expr) -> exp.Expr:
    """Rename (in place) every CTE whose name is defined more than once in ``query``; return it.

    The innermost ``WITH`` goes first: once its clashing names are renamed,
    an unqualified table name left in an outer ``WITH``'s scope can only mean
    that outer CTE (PostgreSQL's normalized text qualifies real tables).

    >>> import sqlglot
    >>> q = sqlglot.parse_one("WITH a AS (SELECT 1 AS x) SELECT * FROM (WITH a AS (SELECT 2 AS x) "
    ...                       "SELECT * FROM a) s, a", read="postgres")
    >>> out = rename_clashing_ctes(q).sql("postgres")
    >>> out.startswith("WITH __pgt_cte_a_2 AS (SELECT 1 AS x) SELECT * FROM (WITH __pgt_cte_a_1 AS")
    True
    >>> out.endswith("SELECT * FROM __pgt_cte_a_1 AS a) AS s, __pgt_cte_a_2 AS a")
    True
    """
    withs = list(query.find_all(exp.With))
    counts = Counter(cte.alias_or_name for w in withs for cte in w.expressions)
    serial = 0
    for with_ in sorted(withs, key=lambda w: -w.depth):
        owner = with_.parent
        ctes = list(with_.expressions)
        for position, cte in enumerate(ctes):
            old = cte.alias_or_name
            if counts[old] < 2:
                continue
            serial += 1
            new = f"__pgt_cte_{old}_{serial}"
            alias = cte.args["alias"]
            alias.set("this", exp.to_identifier(new))
            scopes: list[exp.Expr] = [later.this for later in ctes[position + 1 :]]
            if with_.args.get("recursive"):
                scopes.append(cte.this)
            if owner is not None:
                scopes.extend(child for child in owner.iter_expressions() if child is not with_)
            for scope in scopes:
                _rename_references(scope, old, new)
    return query


def _rename_references(node: exp.Expr, old: str, new: str) -> None:
    for table in list(node.find_all(exp.Table)):
        if table.text("db") or table.name != old:
            continue
        if not table.alias:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(old)))
        table.set("this", exp.to_identifier(new))
