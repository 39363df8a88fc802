"""character(n) on Spark (sql/blank_padded.py), its carry, and the translation around it. Pure."""

from __future__ import annotations

import pytest

from pgtrickle.errors import UnsupportedQueryError
from pgtrickle.spark import carry
from pgtrickle.sql.blank_padded import width_from_type_name
from pgtrickle.sql.translate import translate_to_spark, unsupported_reason

TABLES = {("public", "t"): "vt"}
TYPES = {("public", "t"): {"c": "character(4)", "b": "bpchar", "v": "text", "i": "integer"}}


def spark(query: str) -> str:
    return " ".join(translate_to_spark(query, TABLES, TYPES).split())


@pytest.mark.parametrize(
    ("name", "width"),
    [
        ("character(10)", 10),
        ("character(1)", 1),
        ("bpchar", 0),
        ("character", 0),
        ('"char"', None),
        ("character varying(3)", None),
        ("text", None),
        ("character(3)[]", None),
        (None, None),
    ],
)
def test_width_from_type_name(name: str | None, width: int | None) -> None:
    assert width_from_type_name(name) == width


def test_carry_reads_character_n_as_text() -> None:
    assert carry.decide("character(10)") == carry.Carry(carry.RECARRIED, "", "text")
    assert carry.decide("bpchar").read_as == "text"
    assert carry.decide('"char"').kind == carry.NATIVE


def test_literals_cast_to_bpchar_lose_trailing_blanks_only() -> None:
    assert "c = 'ab'" in spark("SELECT c FROM public.t WHERE c = 'ab  '::bpchar")
    assert "'ab\\t'" in spark("SELECT c FROM public.t WHERE c = 'ab\t '::bpchar")
    assert "'x'" in spark("SELECT 'xy'::character(1) AS z, c FROM public.t")
    assert "RTRIM(SUBSTRING(CAST(i AS STRING), 1, 3))" in spark("SELECT i::character(3) AS a FROM public.t")
    assert unsupported_reason("SELECT c FROM public.t WHERE c = 'ab'::bpchar") is None


def test_padding_sensitive_operations_see_the_padding() -> None:
    out = spark(
        "SELECT octet_length(c) AS o, concat(c, '|') AS cc, c || '|' AS cat, length(c) AS l "
        "FROM public.t WHERE c ~~ 'a%' AND c ~ 'b $'"
    )
    assert "OCTET_LENGTH(RPAD(c, 4, ' '))" in out and "CONCAT_WS('', RPAD(c, 4, ' '), '|')" in out
    assert "RPAD(c, 4, ' ') LIKE 'a%'" in out and "RPAD(c, 4, ' ') RLIKE" in out
    assert "c || '|' AS cat" in out and "LENGTH(c) AS l" in out  # text conversions drop the blanks
    assert "RPAD(s.c, 4, ' ') LIKE" in spark("SELECT s.c FROM (SELECT c FROM public.t) s WHERE s.c ~~ '%b'")
    assert "RPAD" not in spark("SELECT v FROM public.t WHERE v ~~ '%b'")


def test_padding_of_bpchar_without_length_is_refused() -> None:
    with pytest.raises(UnsupportedQueryError, match="without a length"):
        spark("SELECT b FROM public.t WHERE b ~~ '%b'")
