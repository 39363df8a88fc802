"""Spark job counting (spark/jobs.py) and the explain operator tree (cli/explain_tree.py): the pure
parts, no JVM, no database. The real status tracker and PostgreSQL: tests/integration/test_spark_jobs.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from prometheus_client.parser import text_string_to_metric_families

from pgtrickle.catalog.store import Column, Source, StreamTable
from pgtrickle.cli.history import HistoryRow, history_document, history_table
from pgtrickle.cli.render import render_text
from pgtrickle.cli.explain_tree import plan_tree, relations_of, tree_document, tree_lines
from pgtrickle.cli.json_output import refresh_document
from pgtrickle.daemon.manual import ManualRefresh, Result
from pgtrickle.dvm import materialize
from pgtrickle.ops.metrics import Metrics
from pgtrickle.refresh.engine import RefreshOutcome
from pgtrickle.refresh.plan import Action
from pgtrickle.spark import jobs

NOW = datetime(2026, 11, 27, 4, 0, tzinfo=timezone.utc)


# ------------------------------------------------------------------------------- counting


def test_each_count_has_its_own_group_and_restores_the_outer_one() -> None:
    assert jobs.active() is None and jobs.group_for("pgtrickle-7") == "pgtrickle-7"
    with jobs.counting("pgtrickle-7", "refresh a") as outer:
        assert outer.group.startswith("pgtrickle-7-") and jobs.group_for("pgtrickle-7") == outer.group
        with jobs.counting("pgtrickle-8", "refresh b") as inner:
            assert inner.group != outer.group and jobs.active() is inner
        assert jobs.active() is outer
    assert jobs.active() is None


def test_figures_outside_a_count_without_a_session_and_on_spark_connect() -> None:
    assert jobs.figures() == jobs.NOT_COUNTED
    with jobs.counting("pgtrickle-1", "refresh") as count:
        assert jobs.figures() == jobs.NO_JOBS == jobs.JobFigures(0, 0)  # nothing reached Spark
        session = object()
        assert jobs.note_session(session, connect=True)
        assert not jobs.note_session(session, connect=True)  # known already
        assert jobs.figures() == jobs.NOT_COUNTED and count.recorded == jobs.NOT_COUNTED


def test_a_failing_tracker_never_fails_the_refresh() -> None:
    class Broken:
        @property
        def sparkContext(self):  # noqa: N802 - PySpark's name
            raise RuntimeError("the JVM is gone")

    with jobs.counting("pgtrickle-1", "refresh"):
        jobs.note_session(Broken(), connect=False)
        assert jobs.figures() == jobs.NOT_COUNTED


def test_why_several_jobs_ran() -> None:
    assert jobs.explain_jobs([]) is None
    assert jobs.explain_jobs(["collect at /a/b/engine.py:771"]) is None
    text = jobs.explain_jobs(
        ["collect at /a/b/engine.py:771", "collect at /a/b/engine.py:771", "jdbc at /x/jdbc.py:120"]
    )
    assert text == (
        f"3 jobs: 2x collect at engine.py:771, 1x jdbc at jdbc.py:120 ({jobs.SEVERAL_JOBS_PER_ACTION})"
    )
    assert (
        jobs.explain_jobs(["count at x.py:1", "no call site"])
        == "2 jobs: 1x count at x.py:1, 1x no call site"
    )


def test_broadcasts_are_not_one_action_running_several_jobs() -> None:
    """Two jobs broadcasting small tables (named so by :func:`jobs._tracked`, from their tags)
    beside the plan's own are not "one action, several jobs"."""
    broadcast = jobs.BROADCAST_SITE
    text = jobs.explain_jobs([broadcast, "collect at /a/differential.py:435", broadcast])
    assert text == f"3 jobs: 2x {jobs.BROADCAST_SITE}, 1x collect at differential.py:435"


# ------------------------------------------------------------------------------- outputs


def _st(query: str, sources: tuple[Source, ...]) -> StreamTable:
    return StreamTable(
        pgt_id=1,
        relid=1,
        schema="public",
        name="st",
        defining_query=query,
        normalized_query=query,
        schedule="1m",
        refresh_mode="AUTO",
        status="ACTIVE",
        needs_reinit=False,
        frontier=None,
        last_refresh_at=None,
        last_attempt_at=None,
        consecutive_errors=0,
        created_at=NOW,
        last_error=None,
        columns=(Column("k", "text"),),
        sources=sources,
    )


ORDERS = Source(
    11, "public", "orders", "TABLE", "changes_11", column_types=(("customer", "text"), ("amount", "numeric"))
)
UPSTREAM = Source(
    12,
    "public",
    "up",
    "STREAM_TABLE",
    "changes_12",
    column_types=(("customer", "text"), ("n", "bigint"), ("__pgt_row_id", "bigint")),
)


def test_relations_of_leave_out_hidden_columns() -> None:
    columns, types = relations_of(_st("", (ORDERS, UPSTREAM)))
    assert columns == {"public.orders": ["customer", "amount"], "public.up": ["customer", "n"]}
    assert types["public.up"] == {"customer": "text", "n": "bigint"}


def test_tree_text_and_document_of_an_aggregate_of_an_aggregate() -> None:
    st = _st(
        "SELECT x.n, count(*) AS c FROM (SELECT orders.customer, count(*) AS n FROM public.orders"
        " GROUP BY orders.customer) x GROUP BY x.n",
        (ORDERS,),
    )
    tree = plan_tree(st, {0: "pgtrickle_changes.state_1_0_abc", 1: "pgtrickle_changes.state_1_1_def"})
    lines = tree_lines(tree)
    assert lines[0].startswith("Project ") and lines[1].startswith("  Project ")
    root_state, inner = [line for line in lines if "materialized:" in line]
    assert inner.startswith("          Aggregate ") and materialize.AGGREGATE_OF_AGGREGATE in inner
    # The inner COUNT keeps its state (with the group's row count), read through its projection;
    # so does the root COUNT (the stream table stores no state when the query keeps nodes).
    assert "__pgt_count = COUNT(*)" in inner and "delta: algebraic over stored state" in inner
    assert root_state.startswith("    Aggregate ") and materialize.ROOT_STATE in root_state
    assert "delta: algebraic over stored state" in root_state
    assert lines[-3:] == [
        "hidden state tables:",
        f"  pgtrickle_changes.state_1_0_abc: Aggregate, {materialize.AGGREGATE_OF_AGGREGATE}",
        f"  pgtrickle_changes.state_1_1_def: Aggregate, {materialize.ROOT_STATE}",
    ]
    doc = tree_document(tree)
    assert doc["error"] is None and doc["full_refresh_reason"] is None
    assert doc["state_tables"] == [
        {
            "position": 0,
            "table": "pgtrickle_changes.state_1_0_abc",
            "operator": "Aggregate",
            "reason": materialize.AGGREGATE_OF_AGGREGATE,
        },
        {
            "position": 1,
            "table": "pgtrickle_changes.state_1_1_def",
            "operator": "Aggregate",
            "reason": materialize.ROOT_STATE,
        },
    ]
    unmade = tree_lines(plan_tree(st))
    assert unmade[-1].startswith("  (not made yet: the next refresh makes and fills it): Aggregate, ")
    root = doc["root"]
    assert set(root) == {"operator", "facts", "columns", "rule", "materialized", "shared", "inputs"}
    assert (root["operator"], root["columns"], root["rule"]) == ("Project", ["n", "c"], "linear")
    state = root["inputs"][0]["inputs"][0]
    assert state["operator"] == "Aggregate" and state["materialized"] == materialize.ROOT_STATE
    inner = state["inputs"][0]["inputs"][0]["inputs"][0]
    assert inner["operator"] == "Aggregate" and inner["materialized"] == materialize.AGGREGATE_OF_AGGREGATE
    assert inner["inputs"][0]["operator"] == "Scan" and inner["inputs"][0]["inputs"] == []


def test_a_subtree_read_twice_is_described_once() -> None:
    st = _st(
        "WITH c AS (SELECT orders.customer FROM public.orders WHERE orders.amount > 1)"
        " SELECT c.customer FROM c UNION ALL SELECT c.customer FROM c",
        (ORDERS,),
    )
    doc = tree_document(plan_tree(st))

    def walk(node: dict) -> list[dict]:
        return [node] + [n for child in node["inputs"] for n in walk(child)]

    shared = [n for n in walk(doc["root"]) if n["shared"]]
    assert shared and all(n["inputs"] == [] and "rule" not in n for n in shared)


def test_an_unplannable_query_gives_the_construct_not_a_traceback() -> None:
    tree = plan_tree(_st("SELECT orders.customer, random() AS r FROM public.orders", (ORDERS,)))
    assert tree.plan is None and tree.error is not None
    assert tree.error.type == "NoDeltaRuleError" and tree.error.construct == "the volatile function random()"
    assert tree_lines(tree) == [f"no operator tree: {tree.error.message}"]
    doc = tree_document(tree)
    assert doc["root"] is None and doc["error"]["construct"] == "the volatile function random()"
    other = plan_tree(_st("SELECT nope.x FROM public.nope", (ORDERS,)))  # unknown relation
    assert other.error is not None and other.error.construct is None and other.error.message


def test_refresh_document_and_metrics_carry_the_job_count() -> None:
    st = _st("", ())
    outcome = RefreshOutcome(st, Action.FULL, "initial", 3, 0, 0, 1.0, 0.5, spark_jobs=2)
    doc = refresh_document([ManualRefresh(st, Result.REFRESHED, "initial", outcome)])
    assert doc["stream_tables"][0]["spark_jobs"] == 2
    assert RefreshOutcome(st, Action.NO_DATA, "nothing").spark_jobs == 0
    m = Metrics()
    m.observe_outcome(outcome)
    m.observe_outcome(RefreshOutcome(st, Action.DIFFERENTIAL, "d", spark_jobs=None))  # Spark Connect
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(m.render().decode())
        for s in f.samples
    }
    assert got[("pgtrickle_refresh_spark_jobs_sum", (("mode", "FULL"), ("st", "public.st")))] == 2
    assert (
        got[("pgtrickle_refresh_spark_jobs_bucket", (("le", "1.0"), ("mode", "FULL"), ("st", "public.st")))]
        == 0
    )
    assert ("pgtrickle_refresh_spark_jobs_count", (("mode", "DIFFERENTIAL"), ("st", "public.st"))) not in got


def _row(
    refresh_id: int, action: str, jobs_ran: int | None, why: str | None = None, **kw: object
) -> HistoryRow:
    values: dict = dict(
        refresh_id=refresh_id,
        action=action,
        status="COMPLETED",
        initiated_by="MANUAL",
        rows_inserted=1,
        rows_deleted=0,
        delta_row_count=2,
        start_time=NOW,
        end_time=NOW,
        duration=timedelta(seconds=1.5),
        was_full_fallback=False,
        mode_reason="initial",
        skip_reason=None,
        error_message=None,
        spark_jobs=jobs_ran,
        spark_stages=jobs_ran,
        spark_jobs_why=why,
    )
    values.update(kw)
    return HistoryRow(**values)


def test_history_table_and_document() -> None:
    rows = [
        _row(3, "NO_DATA", 0),
        _row(2, "DIFFERENTIAL", None),
        _row(
            1, "FULL", 2, "2 jobs: 2x collect at engine.py:771", error_message="boom\x1b[2J", status="FAILED"
        ),
    ]
    text = render_text(history_table(rows), 200)
    lines = [line for line in text.splitlines() if line.startswith("│ ")]  # the header's are ┃
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines[:2]]
    assert cells[0][2] == "NO_DATA" and cells[0][9:11] == ["0", "0"]
    assert cells[1][2] == "DIFFERENTIAL" and cells[1][9:11] == ["-", "-"]
    assert "boom\\x1b[2J; 2 jobs: 2x collect at engine.py:771" in text and "\x1b" not in text
    doc = history_document("public.st", rows)
    assert [r["spark_jobs"] for r in doc["refreshes"]] == [0, None, 2]
    assert (
        doc["refreshes"][2]["spark_jobs_why"].startswith("2 jobs") and doc["refreshes"][0]["seconds"] == 1.5
    )
