"""The IR compiler's SQL shape, without a JVM or a database: one query, reads listed once,
weights carried as the IR's Z-set semantics say, hostile names quoted in both dialects."""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from pgtrickle.dvm.compile import Compiled, InvalidPlanError, ReadKind, compile_ir, consolidate
from pgtrickle.dvm.compile_ops import weighted_call
from pgtrickle.dvm.compile_types import node_types, statically_positive
from pgtrickle.dvm.ir import (
    Aggregate,
    Delta,
    Distinct,
    Filter,
    Join,
    JoinKind,
    Materialized,
    Negate,
    Project,
    Scan,
    SetOp,
    SetOpKind,
    TopK,
    UnionAll,
    Values,
    Window,
    walk,
)
from pgtrickle.errors import UnsupportedQueryError


def e(text: str) -> exp.Expr:
    return sqlglot.parse_one(text, read="postgres")


class Views:
    def post(self, scan: Scan) -> str:
        return "v_" + scan.relation

    def delta(self, scan: Scan) -> str:
        return "d_" + scan.relation

    def materialized(self, node: Materialized) -> tuple[str, str]:
        return ("hidden", node.name)


A = Scan("public.a", ("k", "x"), ("ak", "ax"))
B = Scan("public.b", ("k", "y"), ("bk", "by"))
TYPES = {"public.a": {"k": "integer", "x": "integer"}, "public.b": {"k": "integer", "y": "numeric(10,2)"}}


def compiled(node, dialect: str = "postgres") -> Compiled:  # type: ignore[no-untyped-def]
    return compile_ir(node, Views(), dialect=dialect, column_types=TYPES)  # type: ignore[arg-type]


@pytest.mark.parametrize("dialect", ["postgres", "spark"])
def test_one_select_statement_with_the_columns_then_the_weight(dialect: str) -> None:
    tree = Aggregate(Join(JoinKind.INNER, A, B, e("ak = bk")), (("g", e("ak")),), (("n", e("count(*)")),))
    result = compiled(tree, dialect)
    statements = sqlglot.parse(result.sql(), read=dialect)
    assert len(statements) == 1 and isinstance(statements[0], exp.Select)
    assert statements[0].named_selects == ["g", "n", "__pgt_w"]
    assert result.columns == ("g", "n")


def test_a_relation_read_by_several_terms_is_listed_once_with_its_uses() -> None:
    a2 = Scan("public.a", ("k", "x"), ("k2", "x2"))
    telescoped = UnionAll(
        (
            Join(JoinKind.INNER, Delta(A), UnionAll((B, Negate(Delta(B))), ("bk", "by")), e("ak = bk")),
            Join(JoinKind.INNER, A, Delta(B), e("ak = bk")),
            Project(
                Join(JoinKind.INNER, A, a2, e("ak = k2")),
                (("ak", e("ak")), ("ax", e("ax")), ("bk", e("k2")), ("by", e("x2"))),
            ),
        ),
        ("ak", "ax", "bk", "by"),
    )
    reads = [(r.kind, r.name, r.uses) for r in compiled(telescoped).reads]
    assert reads == [
        (ReadKind.DELTA, "d_public.a", 1),
        (ReadKind.POST, "v_public.b", 1),
        (ReadKind.DELTA, "d_public.b", 2),
        (ReadKind.POST, "v_public.a", 3),
    ]
    text = compiled(telescoped).sql()
    assert text.count('FROM "d_public.b"') == 2 and text.count('FROM "v_public.a"') == 2  # A is one object


def test_a_shared_subtree_is_one_common_table_expression() -> None:
    shared = Filter(A, e("ax > 0"))
    tree = UnionAll((shared, Project(shared, (("k", e("ak")), ("x", e("ax + 1"))))), ("k", "x"))
    query = compiled(tree).query
    ctes = query.args["with_"].expressions
    assert len(ctes) == 4  # scan, filter, project, union
    assert sum(1 for t in query.find_all(exp.Table) if t.name == "__pgt_n1") == 2


def test_weights_per_node_kind() -> None:
    def body(node, index: int = -1) -> str:  # type: ignore[no-untyped-def]
        return compiled(node).query.args["with_"].expressions[index].this.sql("postgres")

    assert 'CAST(1 AS BIGINT) AS "__pgt_w"' in body(A)
    assert 'CAST("__pgt_w" AS BIGINT) AS "__pgt_w"' in body(Delta(A))
    assert '-"__pgt_w" AS "__pgt_w"' in body(Negate(Delta(A)))
    assert '"__pgt_l"."__pgt_w" * "__pgt_r"."__pgt_w"' in body(Join(JoinKind.INNER, A, B, e("ak = bk")))
    outer = body(Join(JoinKind.LEFT, Delta(A), B, e("ak = bk")))
    assert 'COALESCE("__pgt_l"."__pgt_w", 1) * COALESCE("__pgt_r"."__pgt_w", 1)' in outer
    assert 'HAVING SUM("__pgt_w") > 0' in outer  # the changing side is consolidated, the table is not
    assert outer.count("GROUP BY") == 1
    semi = body(Join(JoinKind.SEMI, A, Negate(Delta(B)), e("ak = bk")))
    assert "EXISTS" in semi and 'HAVING SUM("__pgt_w") > 0' in semi
    assert "LEFT SEMI JOIN" in compiled(Join(JoinKind.SEMI, A, B, e("ak = bk")), "spark").sql()
    assert "LEFT ANTI JOIN" in compiled(Join(JoinKind.ANTI, A, B, e("(ak = bk) IS NOT FALSE")), "spark").sql()
    assert "CROSS JOIN" in body(Join(JoinKind.INNER, A, B))


def test_aggregates_are_weighted_where_exact_and_expanded_otherwise() -> None:
    weighted = compiled(
        Aggregate(A, (("g", e("ak")),), (("n", e("count(*)")), ("s", e("sum(ax)")), ("m", e("max(ax)"))))
    ).sql()
    assert "GENERATE_SERIES" not in weighted and 'SUM("ax" * "__pgt_w")' in weighted
    expanded = compiled(Aggregate(A, (), (("l", e("string_agg(ax::text, ',')")),)))
    assert "GENERATE_SERIES" in expanded.sql()
    assert (
        "EXPLODE(SEQUENCE("
        in compile_ir(
            expanded_tree := Aggregate(A, (), (("l", e("stddev(ax)")),)),
            Views(),
            dialect="spark",
            column_types=TYPES,
        ).sql()
    )
    assert expanded_tree.columns == ("l",)


@pytest.mark.parametrize(
    ("call", "dialect", "weighted"),
    [
        ("count(*)", "spark", True),
        ("count(ax) FILTER (WHERE ax > 1)", "postgres", True),
        ("sum(ax)", "spark", True),
        ("sum(by)", "postgres", True),
        ("sum(by)", "spark", False),
        ("avg(ax)", "postgres", True),
        ("avg(ax)", "spark", False),
        ("sum(DISTINCT by)", "spark", True),
        ("min(by)", "spark", True),
        ("string_agg(ax::text, ',')", "postgres", False),
        ("sum(unknown)", "postgres", False),
    ],
)
def test_weighted_call_decisions(call: str, dialect: str, weighted: bool) -> None:
    types = {"ak": "int4", "ax": "int4", "by": "numeric", "unknown": None}
    assert (weighted_call(e(call), types, dialect) is not None) is weighted  # type: ignore[arg-type]


def test_statically_positive() -> None:
    assert statically_positive(Join(JoinKind.INNER, Filter(A, e("true")), B, e("ak = bk")))
    assert not statically_positive(Join(JoinKind.INNER, Delta(A), B, e("ak = bk")))
    assert not statically_positive(UnionAll((A, Negate(A)), ("ak", "ax")))
    assert statically_positive(Aggregate(Negate(Delta(A)), (), (("n", e("count(*)")),)))
    assert statically_positive(Join(JoinKind.FULL, Delta(A), B, e("ak = bk")))
    assert statically_positive(Join(JoinKind.SEMI, A, Delta(B), e("ak = bk")))


def test_types_propagate_through_the_tree() -> None:
    tree = Project(
        Aggregate(
            Join(JoinKind.INNER, A, B, e("ak = bk")),
            (("g", e("ak")),),
            (("s", e("sum(ax)")), ("t", e("sum(by)")), ("n", e("count(*)"))),
        ),
        (("q", e("s / n")), ("r", e("t / n")), ("g", e("g"))),
    )
    assert node_types(tree, TYPES, {}) == {"q": "int8", "r": "numeric", "g": "int4"}
    mat = Materialized(Project(A, (("h", e("ax / 2")),)), name="m")
    assert node_types(mat, TYPES, {}) == {"h": "int4"}


def test_spark_translation_uses_the_propagated_types() -> None:
    tree = Project(Project(A, (("h", e("ax")),)), (("half", e("h / 2")),))
    assert "DIV" in compiled(tree, "spark").sql()
    untyped = compile_ir(tree, Views(), dialect="spark").sql()
    assert "TYPEOF" in untyped.upper()


@pytest.mark.parametrize(
    ("name", "postgres", "spark"),
    [
        ('a"b', '"a""b"', '`a"b`'),
        ("a`b", '"a`b"', "`a``b`"),
        ("x.y", '"x.y"', "`x.y`"),
        ("two words", '"two words"', "`two words`"),
        ("Upper", '"Upper"', "`Upper`"),
    ],
)
def test_hostile_identifiers_are_quoted_in_both_dialects(name: str, postgres: str, spark: str) -> None:
    scan = Scan("t", (name,), (name,))
    tree = Filter(scan, exp.GT(this=exp.column(name, quoted=True), expression=exp.Literal.number(1)))
    assert f"{postgres} > 1" in compiled(tree).sql()
    assert f"{spark} > 1" in compiled(tree, "spark").sql()


def test_consolidate_groups_by_every_column_and_drops_zero_weights() -> None:
    result = compiled(UnionAll((A, Negate(A)), ("ak", "ax"))).consolidated()
    outer = sqlglot.parse_one(result.sql(), read="postgres")
    assert [c.name for c in outer.args["group"].expressions] == ["ak", "ax"]
    assert outer.args["having"].sql() == 'HAVING SUM("__pgt_w") <> 0'
    assert outer.named_selects == ["ak", "ax", "__pgt_w"]
    with pytest.raises(InvalidPlanError):
        consolidate(result.query, ["__pgt_w"])


def test_every_node_type_compiles_in_both_dialects() -> None:
    ordered = tuple(sqlglot.parse_one("SELECT 1 ORDER BY ax DESC", read="postgres").args["order"].expressions)
    trees = [
        Values(((e("1"), e("'x'")),), ("one", "two")),
        Values((), ("none",)),
        Distinct(A),
        SetOp(SetOpKind.INTERSECT, True, A, B, ("p", "q")),
        SetOp(SetOpKind.EXCEPT, False, A, B, ("p", "q")),
        Window(A, (("rn", e("row_number() OVER (PARTITION BY ak ORDER BY ax)")),)),
        TopK(A, ordered, 3, 1),
        TopK(A, ordered, None, 2),
        Join(JoinKind.RIGHT, A, B, e("ak = bk")),
        Join(JoinKind.FULL, A, B, e("ak = bk")),
        Materialized(Distinct(A), pre=True, name="pgt_hidden_1"),
    ]
    for tree in trees:
        for dialect in ("postgres", "spark"):
            assert len(sqlglot.parse(compiled(tree, dialect).sql(), read=dialect)) == 1
    reads = compiled(trees[-1]).reads
    assert [(r.kind, r.name) for r in reads] == [(ReadKind.MATERIALIZED, ("hidden", "pgt_hidden_1"))]
    assert 'FROM "hidden"."pgt_hidden_1"' in compiled(trees[-1]).sql()


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        (Project(A, (("x", e("ak")), ("x", e("ax")))), "appears twice"),
        (Project(A, (("__pgt_w", e("ak")),)), "reserved for the compiler"),
        (Project(A, (("__pgt_n", e("ak")),)), "reserved for the compiler"),
        (Join(JoinKind.INNER, A, A, e("true")), "appears twice"),
        (Join(JoinKind.SEMI, A, A, e("true")), "both inputs have the columns"),
        (UnionAll((A, Project(A, (("k", e("ak")),))), ("p", "q")), "widths"),
        (SetOp(SetOpKind.EXCEPT, True, A, Project(A, (("k", e("ak")),)), ("p", "q")), "widths"),
        (TopK(A, (), -1), "limit"),
        (Values(((e("1"),),), ("a", "b")), "width"),
        (Join(JoinKind.LEFT, A, B), "needs a condition"),
    ],
)
def test_a_malformed_tree_is_refused_with_a_clear_error(tree, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidPlanError, match=message):
        compiled(tree)


def test_bad_resolver_answers_and_dialects_are_refused() -> None:
    class Broken(Views):
        def post(self, scan: Scan) -> str:
            return 42  # type: ignore[return-value]

    class Empty(Views):
        def delta(self, scan: Scan) -> str:
            return ""

    with pytest.raises(InvalidPlanError, match="relation name"):
        compile_ir(A, Broken(), dialect="postgres")
    with pytest.raises(InvalidPlanError, match="relation name"):
        compile_ir(Delta(A), Empty(), dialect="postgres")
    with pytest.raises(ValueError, match="dialect"):
        compile_ir(A, Views(), dialect="mysql")  # type: ignore[arg-type]


def test_an_expression_spark_cannot_run_is_refused_for_spark_only() -> None:
    tree = Project(A, (("arr", e("ARRAY[ak, ax]")),))
    assert "ARRAY" in compiled(tree).sql()
    with pytest.raises(UnsupportedQueryError, match="array"):
        compiled(tree, "spark")
    dollar = Filter(Scan("t", ("s",), ("s",)), e("s = '${x}'"))
    with pytest.raises(UnsupportedQueryError, match="variable"):
        compiled(dollar, "spark").sql()


def test_the_delta_rules_own_column_names_compile() -> None:
    """The rules name touched keys ``__pgt_k<i>`` and state columns ``__pgt_count``,
    ``__pgt_n_<c>``: ordinary columns to the compiler, which reserves only its own names
    (a grouped aggregate's delta plan, and the algebraic one over stored state, compile)."""
    from pgtrickle.dvm import rules

    grouped = Aggregate(A, (("g", e("ak")),), (("s", e("sum(ax)")), ("m", e("max(ax)"))))
    plan = rules.delta(grouped, frozenset({"public.a"}))
    assert any(c.startswith("__pgt_k") for n in walk(plan) for c in n.columns)
    for dialect in ("postgres", "spark"):
        assert compiled(plan, dialect).sql()
    invertible = Aggregate(A, (("g", e("ak")),), (("s", e("sum(ax)")),))
    algebraic = rules.delta(invertible, frozenset({"public.a"}), stored_state=True)
    from pgtrickle.dvm.pipeline import ViewNames

    assert "__pgt_count" in compile_ir(algebraic, ViewNames(), dialect="postgres").sql()


def test_an_untyped_branch_column_of_a_union_all_is_cast_to_the_other_branches_type() -> None:
    """The outer-join rule pads with a bare NULL; PostgreSQL types it ``text`` in a CTE, which a
    UNION with an integer column refuses: the compiler casts it (PostgreSQL only) to the type of
    the known branches."""
    padded = Project(A, (("pk", e("ak")), ("px", exp.Null())))
    union = UnionAll((A, padded), ("k", "x"))
    assert 'CAST("px" AS INT)' in compiled(union).sql()
    assert node_types(union, TYPES, {})["x"] == "integer"
    assert "CAST(`px`" not in compiled(union, "spark").sql()


def _join_sides(query: exp.Expr) -> list[exp.Expr]:
    """The FROM items the query's joins read (each join's left side and its joined side)."""
    sides: list[exp.Expr] = []
    for join in query.find_all(exp.Join):
        select = join.parent
        assert isinstance(select, exp.Select)
        sides += [select.args["from_"].this, join.this]
    return sides


def test_a_join_side_that_only_reads_a_table_is_read_inline_on_spark() -> None:
    """Spark drops a BROADCAST hint on a view read inside a common table expression (its
    optimizer removes hints before it inlines the CTEs): a join side that is a table read -
    through filters and projections - is that read itself, so a small table's hint (refresh/
    delta_reads.py) reaches the join. Other sides, and PostgreSQL, keep their CTE."""
    changes = Delta(A)
    dims = Project(Filter(B, e("by > 0")), (("bk", e("bk")), ("by2", e("by * 2"))))
    root = Join(JoinKind.INNER, changes, dims, e("ak = bk"))
    spark = compiled(root, "spark")
    sides = _join_sides(spark.query)
    assert len(sides) == 2
    left, right = sides
    assert isinstance(left, exp.Table)  # the change: its CTE
    assert isinstance(right, exp.Subquery) and right.alias == "__pgt_r"
    assert {t.name for t in right.find_all(exp.Table)} == {"v_public.b"}  # the read, no CTE between
    assert right.find(exp.Where) is not None and right.sql(dialect="spark").count("SELECT") == 3
    # The same rows: the reads are still listed once, with their uses.
    assert [(r.kind, r.name, r.uses) for r in spark.reads] == [
        (ReadKind.DELTA, "d_public.a", 1),
        (ReadKind.POST, "v_public.b", 1),
    ]
    postgres = compiled(root, "postgres")
    assert all(isinstance(side, exp.Table) for side in _join_sides(postgres.query))
    # A side computed from more than a table read (an aggregate) stays a CTE on Spark too.
    grouped = Aggregate(B, (("bk", e("bk")),), (("n", e("COUNT(*)")),))
    other = compiled(Join(JoinKind.INNER, changes, grouped, e("ak = bk")), "spark")
    assert all(isinstance(side, exp.Table) for side in _join_sides(other.query))


def _cte_references(query: exp.Expr) -> dict[str, int]:
    """Per CTE a query defines, how many places read it."""
    names = {cte.alias_or_name for w in query.find_all(exp.With) for cte in w.expressions}
    counts = dict.fromkeys(names, 0)
    for found in query.find_all(exp.Table):
        if found.name in counts and not found.args.get("db"):
            counts[found.name] += 1
    return counts


def test_spark_text_writes_a_table_expression_read_once_where_it_is_read() -> None:
    """Spark resolves a chain of CTEs one link per pass of its analyzer over the whole plan, so
    the Spark text writes a CTE read from one place as a derived table there (under the name it
    was read by) and keeps a CTE only where several places read it; the query object, the
    PostgreSQL text and the split into parts (dvm/shared.py) keep every node's CTE."""
    shared = Filter(Delta(A), e("ax > 0"))
    chain = Project(
        Filter(Project(shared, (("k", e("ak")), ("x", e("ax + 1")))), e("x > 1")),
        (("k", e("k")), ("x", e("x"))),
    )
    root = Join(JoinKind.INNER, chain, Project(shared, (("k2", e("ak")), ("x2", e("ax")))), e("k = k2"))
    spark = compiled(root, "spark")
    original = _cte_references(spark.query)
    assert len(original) == len(list(walk(root))) and sorted(original.values()).count(2) == 1
    text = spark.sql()
    after = _cte_references(sqlglot.parse_one(text, read="spark"))
    assert after == {name: 2 for name, uses in original.items() if uses == 2}  # the shared filter only
    assert _cte_references(spark.query) == original  # the query object is untouched
    reparsed = sqlglot.parse_one(text, read="spark")
    assert reparsed.named_selects == ["k", "x", "k2", "x2", "__pgt_w"]
    aliases = {s.alias for s in reparsed.find_all(exp.Subquery)}
    assert {"__pgt_l", "__pgt_r"} <= aliases  # each read place keeps its name
    postgres = compiled(root, "postgres")
    assert _cte_references(sqlglot.parse_one(postgres.sql(), read="postgres")) == _cte_references(
        postgres.query
    )


def test_inlining_keeps_a_query_without_table_expressions_and_unread_ones() -> None:
    from pgtrickle.dvm.compiled import inline_single_references

    plain = sqlglot.parse_one("SELECT a FROM t", read="spark")
    assert inline_single_references(plain.copy()).sql("spark") == plain.sql("spark")
    unread = sqlglot.parse_one(
        "WITH u AS (SELECT 1 AS a), r AS (SELECT a FROM u) SELECT a FROM t", read="spark"
    )
    out = inline_single_references(unread.copy()).sql("spark")
    assert out.startswith("WITH r AS (SELECT a FROM (SELECT 1 AS a) AS `u`) ")  # r unread stays; u inlined
