"""refresh/spark_job.py: when a job gets Spark's code generation, and the settings' round trip (pure)."""

from __future__ import annotations

import pytest

from pgtrickle.refresh.spark_job import (
    CODEGEN_FACTORY_MODE,
    COMPILED_MIN_ROWS_READ,
    INTERPRETED,
    INTERPRETED_MAX_CHANGES,
    WHOLE_STAGE_CODEGEN,
    code_generation,
    compiles,
    lone_compiles,
)


class Conf:
    """The part of ``spark.conf`` the switch uses, over a dict."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class Session:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = Conf(values)


def test_a_small_delta_reading_few_rows_whole_runs_interpreted() -> None:
    assert not compiles(0, 0)
    assert not compiles(INTERPRETED_MAX_CHANGES - 1, 0)
    assert compiles(INTERPRETED_MAX_CHANGES, 0)
    assert not compiles(1, 150_000), "a small table read whole (TPC-H customer at SF 1) runs interpreted"
    assert not compiles(1, COMPILED_MIN_ROWS_READ - 1)
    assert compiles(1, COMPILED_MIN_ROWS_READ), "a million rows read whole keep code generation"


def test_a_lone_refresh_drops_code_generation_only_for_plans_in_parts() -> None:
    assert lone_compiles(10_000, 0, in_parts=False), "an aggregate over stored state keeps it"
    assert lone_compiles(1, 0, in_parts=False)
    assert not lone_compiles(10_000, 150_000, in_parts=True), "a kept plan over small reads drops it"
    assert lone_compiles(10_000, COMPILED_MIN_ROWS_READ, in_parts=True)
    assert lone_compiles(INTERPRETED_MAX_CHANGES, 0, in_parts=True)


@pytest.mark.parametrize(
    "initial",
    [
        {},
        {WHOLE_STAGE_CODEGEN: "true"},
        {WHOLE_STAGE_CODEGEN: "false"},
        {CODEGEN_FACTORY_MODE: "FALLBACK"},
        {CODEGEN_FACTORY_MODE: INTERPRETED, WHOLE_STAGE_CODEGEN: "true"},
    ],
)
def test_the_switch_restores_the_session_and_never_turns_on_what_it_turned_off(
    initial: dict[str, str],
) -> None:
    spark = Session(dict(initial))
    with code_generation(spark) as switch:
        switch(False)
        assert spark.conf.values[WHOLE_STAGE_CODEGEN] == "false"
        assert spark.conf.values[CODEGEN_FACTORY_MODE] == INTERPRETED, "operators interpreted too"
        switch(True)
        assert spark.conf.values[WHOLE_STAGE_CODEGEN] == initial.get(WHOLE_STAGE_CODEGEN, "true")
        assert spark.conf.values.get(CODEGEN_FACTORY_MODE) == initial.get(CODEGEN_FACTORY_MODE)
        switch(False)
    assert spark.conf.values == initial


def test_the_switch_restores_the_session_after_an_error() -> None:
    spark = Session({WHOLE_STAGE_CODEGEN: "true"})
    with pytest.raises(RuntimeError), code_generation(spark) as switch:
        switch(False)
        raise RuntimeError("the job failed")
    assert spark.conf.values == {WHOLE_STAGE_CODEGEN: "true"}
