"""Pure helpers of the JDBC layer, the DSN handling and the settings."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgtrickle.config import Settings, _parse_spark_conf
from pgtrickle.db.connection import jdbc_target, redact
from pgtrickle.errors import ConfigError
from pgtrickle.refresh.delta_reads import broadcasts
from pgtrickle.spark.jdbc import TableStats, ctid_predicates, partition_count, snapshot_init_statement


def _ranges(preds: list[str]) -> list[tuple[int, int | None]]:
    out = []
    for p in preds:
        lo = int(re.search(r">= '\((\d+),0\)'", p).group(1))  # type: ignore[union-attr]
        hi_match = re.search(r"< '\((\d+),0\)'", p)
        out.append((lo, int(hi_match.group(1)) if hi_match else None))
    return out


@given(pages=st.integers(2, 10_000_000), parts=st.integers(2, 64))
def test_ctid_ranges_cover_every_page_once(pages: int, parts: int) -> None:
    ranges = _ranges(ctid_predicates(TableStats(1e9, pages), parts))
    assert ranges[0][0] == 0
    assert ranges[-1][1] is None, "the last range is open-ended (the table may have grown)"
    for (lo, hi), (next_lo, _) in zip(ranges, ranges[1:], strict=False):
        assert hi == next_lo and lo < hi
    assert len(ranges) <= parts


def test_small_tables_are_one_read() -> None:
    assert ctid_predicates(TableStats(10, 1), 4) == ["true"]
    assert ctid_predicates(TableStats(1e6, 5000), 1) == ["true"]
    assert partition_count(TableStats(1000, 10), 500_000, 2) == 1


def test_partition_count_is_bounded_by_parallelism() -> None:
    assert partition_count(TableStats(1_200_000, 9000), 500_000, 8) == 3
    assert partition_count(TableStats(100_000_000, 9000), 500_000, 2) == 4


def test_snapshot_statement_refuses_anything_but_a_snapshot_id() -> None:
    assert "SET TRANSACTION SNAPSHOT '00000003-0000001B-1'" in snapshot_init_statement("00000003-0000001B-1")
    with pytest.raises(ValueError):
        snapshot_init_statement("1'; DROP TABLE x; --")


def test_jdbc_target_from_uri_and_keywords() -> None:
    t = jdbc_target("postgresql://u:p%40ss@db.example:6543/my%20db?sslmode=require")
    assert t.url == "jdbc:postgresql://db.example:6543/my%20db?ApplicationName=pgtrickle-spark"
    assert t.properties["user"] == "u" and t.properties["password"] == "p@ss"
    assert t.properties["sslmode"] == "require"
    t = jdbc_target("host=::1 port=5432 dbname=x user=y")
    assert t.url == "jdbc:postgresql://[::1]:5432/x?ApplicationName=pgtrickle-spark"


def test_unix_socket_dsn_is_refused_for_spark() -> None:
    with pytest.raises(ConfigError, match="TCP"):
        jdbc_target("host=/var/run/postgresql dbname=x")


def test_redact_hides_passwords() -> None:
    assert "secret" not in redact("postgresql://u:secret@h/db")
    assert "secret" not in redact("host=h password=secret dbname=x")
    assert redact("this is not a dsn ===") == "<unparseable DSN>"


def test_spark_conf_parsing() -> None:
    assert _parse_spark_conf("a=1, b = x=y ,") == {"a": "1", "b": "x=y"}
    with pytest.raises(ConfigError, match="key=value"):
        _parse_spark_conf("novalue")


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTRICKLE_SPARK_MASTER", "local-cluster[2,1,1024]")
    monkeypatch.setenv("PGTRICKLE_PORT", "6000")
    s = Settings.from_env()
    assert s.spark_master == "local-cluster[2,1,1024]" and s.embedded_port == 6000
    assert s.with_overrides(spark_master=None).spark_master == "local-cluster[2,1,1024]"
    monkeypatch.setenv("PGTRICKLE_PORT", "many")
    with pytest.raises(ConfigError, match="PGTRICKLE_PORT"):
        Settings.from_env()


def test_small_tables_are_broadcast_where_the_plan_joins_small_tables_more_than_once() -> None:
    small = TableStats(reltuples=25, relpages=1, bytes=8192)
    assert broadcasts(small, small_reads=2) and broadcasts(small, small_reads=5)
    # The plan's one read of a small table: the one join's shuffle of a small change costs less
    # than a broadcast's own job.
    assert not broadcasts(small, small_reads=1)
    # Too big by pages, by rows (relpages lags a bulk load: 0 pages, 6M live rows), or not sized
    # (partitioned, foreign).
    assert not broadcasts(TableStats(reltuples=1000, relpages=2000, bytes=2000 * 8192), small_reads=3)
    assert not broadcasts(TableStats(reltuples=6_000_000, relpages=0, bytes=0), small_reads=3)
    assert not broadcasts(TableStats(reltuples=25, relpages=0, bytes=None), small_reads=3)
