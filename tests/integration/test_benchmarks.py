"""The benchmark suite cannot rot: its TPC-H generator, one query under its changes with the oracle,
the docs-section writer and the presets' commands.

Fast (well under a minute): TPC-H at the generator's minimum size (1500 orders), one query.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import Database
from tests.integration.helpers import assert_oracle, create_st, refresh

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import revision_ab  # noqa: E402
import suite  # noqa: E402
import tpch_data  # noqa: E402


def test_docs_sections_are_replaced_and_prose_is_kept(tmp_path: Path) -> None:
    docs = tmp_path / "BENCHMARKS.md"
    docs.write_text("# Benchmarks\n\nhand-written prose\n")
    common.write_section("suite-x", "## first", docs)
    common.write_section("suite-y", "## other", docs)
    common.write_section("suite-x", "## second", docs)
    text = docs.read_text()
    assert "hand-written prose" in text and "## other" in text and "## second" in text
    assert "## first" not in text
    assert text.count("<!-- suite-x:begin -->") == 1


def test_every_preset_has_a_command_for_every_piece() -> None:
    for preset in suite.PRESETS:
        cmds = suite.commands(preset, Path("benchmarks/results/x"))
        assert set(cmds) == set(suite.PIECES)
        assert all(f"suite-{name}" in " ".join(cmd) for name, cmd in cmds.items())
        assert suite.estimates(preset)[-1].startswith("total")
    assert 100_000_000 in suite.PRESETS["full"]["differential"]["sizes"]


def test_the_summary_reads_the_scheduler_report_of_either_shape() -> None:
    chain, fan, branch = ({"latency_median_s": x} for x in (0.64, 2.43, 0.22))
    runs = [
        {"parallel": 2, "batch": 1, "chain": {"latency_median_s": 1.9}, "fan": fan, "branch": branch},
        {"parallel": 2, "batch": 32, "chain": chain, "fan": fan, "branch": branch},
    ]
    assert suite.propagation_headline({"runs": runs}) == (
        "propagation (2 at once, batch 32): chain of 10 0.64 s, 3×20 fan 2.43 s, "
        "one branch of depth 3 0.22 s (fan ×11.0)"
    )
    # A report of before max_parallel_refreshes / max_batch_size: one run at its top level.
    assert suite.propagation_headline({"chain": chain, "fan": fan}) == (
        "propagation: chain of 10 0.64 s, 3×20 fan 2.43 s"
    )


@pytest.mark.integration
@pytest.mark.usefixtures("spark")
def test_tpch_generator_and_a_query_stays_exact_under_its_changes(db: Database) -> None:
    sf = 0.001  # the generator's floor: 1500 orders, ~6000 lines
    tpch_data.load(db.conn, sf, progress=lambda _line: None)
    counts = {t: db.scalar(f"SELECT count(*) FROM {t}") for t in tpch_data.TABLES}
    assert counts["region"] == 5 and counts["nation"] == 25 and counts["orders"] == 1500
    assert 1500 <= counts["lineitem"] <= 7 * 1500
    # every line's (part, supplier) is offered in partsupp, as TPC-H's supplier formula guarantees
    assert (
        db.scalar(
            "SELECT count(*) FROM lineitem l WHERE NOT EXISTS (SELECT 1 FROM partsupp"
            " WHERE ps_partkey = l_partkey AND ps_suppkey = l_suppkey)"
        )
        == 0
    )
    assert db.scalar("SELECT count(*) FROM orders WHERE o_totalprice <= 0") == 0
    queries = tpch_data.queries(sf)
    assert len(queries) == 22
    create_st(db, "q06", queries["q06"], refresh_mode="DIFFERENTIAL")
    refresh(db, "q06")
    changed = tpch_data.apply_changes(db.conn, sf, 10, 0.1)
    assert changed["orders_inserted"] == 10 and changed["orders_deleted"] == 10
    assert changed["lineitems_updated"] == 10
    [outcome] = refresh(db, "q06")
    assert outcome.action.value == "DIFFERENTIAL"
    assert_oracle(db, "q06")


def test_revision_ab_compares_medians_and_refuses_revisions_with_other_catalogs() -> None:
    rows = common.median_rows(
        {"q22": {"base": [2.0, 4.0, 3.0], "head": [1.5, 1.5, 9.0]}, "q11": {"base": [1.0], "head": []}},
        "base",
        "head",
    )
    assert rows == [["Q22", "3.000", "1.500", "0.50"]]  # a query without both sides is left out
    assert not revision_ab.catalogs_differ("HEAD", "HEAD")
    empty_tree = revision_ab._git("hash-object", "-t", "tree", "/dev/null")
    assert revision_ab.catalogs_differ(empty_tree, "HEAD")  # a tree without the catalog: refused


def test_revision_ab_gives_the_head_its_spark_settings() -> None:
    env = revision_ab.worker_env(
        {"PATH": "/bin", "PGTRICKLE_SPARK_CONF": "a=1,b=2"}, Path("/x/src"), "dbname=d", "local[2]", "b=3"
    )
    assert env["PYTHONPATH"] == "/x/src" and env["PATH"] == "/bin"
    assert env["PGTRICKLE_AB_DSN"] == "dbname=d" and env["PGTRICKLE_AB_MASTER"] == "local[2]"
    assert env["PGTRICKLE_SPARK_CONF"] == "a=1,b=2,b=3"  # the head's own last: it wins
    assert "PGTRICKLE_SPARK_CONF" not in revision_ab.worker_env({}, Path("/x"), "", "local", "")
