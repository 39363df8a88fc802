"""redact_message / public_error: real PostgreSQL, JDBC and Spark error texts lose their row values."""

from __future__ import annotations

import psycopg
import pytest

from pgtrickle.errors import RefreshError, UnsupportedQueryError
from pgtrickle.ops.error_redaction import full_error, public_error, redact_message

# Collected from PostgreSQL 18, pgjdbc and Spark 4 (see tests/integration/test_error_redaction.py,
# which checks the live ones).
REAL = [
    (
        '[CAST_INVALID_INPUT] The value \'ssn-1\' of the type "STRING" cannot be cast to "INT" because it is '
        "malformed. Correct the value as per the syntax, or change its target type. Use `try_cast` to tolerate "
        "malformed input and return NULL instead. SQLSTATE: 22018",
        ["ssn-1"],
        ["[CAST_INVALID_INPUT]", '"STRING"', '"INT"', "SQLSTATE: 22018", "`try_cast`"],
    ),
    (
        '[CAST_OVERFLOW] The value 12345678901L of the type "BIGINT" cannot be cast to "INT" due to an '
        "overflow. Use `try_cast` to tolerate overflow and return NULL instead. SQLSTATE: 22003",
        ["12345678901"],
        ["[CAST_OVERFLOW]", '"BIGINT"', "SQLSTATE: 22003"],
    ),
    (
        '[CAST_INVALID_INPUT] The value \'2020-13-45-secret\' of the type "STRING" cannot be cast to "DATE" '
        "because it is malformed. SQLSTATE: 22018",
        ["2020-13-45-secret", "secret"],
        ['"DATE"'],
    ),
    (
        "[NUMERIC_VALUE_OUT_OF_RANGE.WITH_SUGGESTION]  12345.678 cannot be represented as Decimal(3, 1). If "
        'necessary set "spark.sql.ansi.enabled" to "false" to bypass this error, and return NULL instead. '
        "SQLSTATE: 22003",
        ["12345.678"],
        ["Decimal(3, 1)", "[NUMERIC_VALUE_OUT_OF_RANGE.WITH_SUGGESTION]"],
    ),
    (
        "[DIVIDE_BY_ZERO] Division by zero. Use `try_divide` to tolerate divisor being 0 and return NULL "
        "instead. SQLSTATE: 22012",
        [],
        ["[DIVIDE_BY_ZERO] Division by zero.", "SQLSTATE: 22012"],
    ),
    (
        "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 1 times, "
        "most recent failure: Lost task 0.0 in stage 0.0 (TID 0) (localhost executor driver): "
        'java.sql.BatchUpdateException: Batch entry 0 INSERT INTO public.uq ("id","n") VALUES '
        "(('42'::int4),('5'::int4)) was aborted: ERROR: duplicate key value violates unique constraint "
        '"uq_pkey"  Detail: Key (id)=(42) already exists.  Call getNextException to see other errors in the batch.',
        ["42", "'5'"],
        ['constraint "uq_pkey"', "Key (id)=(***) already exists", "VALUES (***) was aborted"],
    ),
    (
        'java.sql.BatchUpdateException: Batch entry 0 INSERT INTO public.uq ("id","n") VALUES '
        '((\'43\'::int4),(NULL)) was aborted: ERROR: null value in column "n" of relation "uq" violates '
        "not-null constraint  Detail: Failing row contains (43, null).",
        ["43"],
        ['column "n" of relation "uq"', "Failing row contains (***)"],
    ),
    (
        'duplicate key value violates unique constraint "ev_pkey" DETAIL:  Key (id)=(42) already exists.',
        ["42"],
        ['constraint "ev_pkey"', "Key (id)=(***)"],
    ),
    (
        'duplicate key value violates unique constraint "k" DETAIL:  Key (a, b)=(x, 1) already exists.',
        ["x,", "1)"],
        ["Key (a, b)=(***)"],
    ),
    (
        'new row for relation "ev" violates check constraint "c" DETAIL:  Failing row contains '
        "(142, 2026-11-26 15:06:49.474956+00, null, null).",
        ["142", "2026-11-26"],
        ['relation "ev"', 'constraint "c"', "Failing row contains (***)"],
    ),
    (
        'insert or update on table "o" violates foreign key constraint "o_c_fkey" DETAIL:  Key (c)=(77) is not '
        'present in table "c".',
        ["77"],
        ['table "c"', "Key (c)=(***) is not present"],
    ),
    ('invalid input syntax for type integer: "ssn-1"', ["ssn-1"], ["invalid input syntax for type integer"]),
    ('value "99999999999" is out of range for type integer', ["99999999999"], ["type integer"]),
    (
        "invalid input syntax for type date: \"x\" LINE 1: insert into ev values (1, now(), 'x')",
        ["'x'", '"x"'],
        [],
    ),
    ('date/time field value out of range: "2020-02-30"', ["2020-02-30"], []),
    (
        'duplicate key value violates unique constraint "u" DETAIL:  Key (n)=(5) already exists. '
        'CONTEXT:  COPY uniq, line 2: "2\t5"',
        ["5"],
        ['constraint "u"'],
    ),
]


@pytest.mark.parametrize(("message", "hidden", "kept"), REAL)
def test_values_are_masked_and_names_kept(message: str, hidden: list[str], kept: list[str]) -> None:
    redacted = redact_message(message)
    for value in hidden:
        assert value not in redacted, redacted
    for name in kept:
        assert name in redacted, redacted


def test_redaction_is_idempotent() -> None:
    for message, _, _ in REAL:
        once = redact_message(message)
        assert redact_message(once) == once


def test_own_messages_are_kept_whole() -> None:
    own = UnsupportedQueryError(
        "refresh_mode DIFFERENTIAL is not possible: use refresh_mode => 'AUTO' or 'FULL'"
    )
    assert public_error(own) == str(own)


def test_a_foreign_cause_is_redacted_even_when_wrapped() -> None:
    try:
        try:
            raise ValueError("The value 'ssn-9' of the type \"STRING\" cannot be cast")
        except ValueError as inner:
            raise RefreshError("refresh of public.t failed: The value 'ssn-9' of the type") from inner
    except RefreshError as exc:
        assert "ssn-9" not in public_error(exc)
        assert "ssn-9" in full_error(exc)


def test_a_psycopg_error_gets_its_sqlstate_and_its_detail() -> None:
    exc = psycopg.errors.UniqueViolation(
        'duplicate key value violates unique constraint "t_pkey"\nDETAIL:  Key (id)=(42) already exists.'
    )
    assert "Key (id)=(42)" in full_error(exc)
    public = public_error(exc)
    assert "42" not in public and public.endswith("(SQLSTATE 23505)") and '"t_pkey"' in public


def test_a_message_raised_by_user_code_is_withheld() -> None:
    exc = psycopg.errors.RaiseException("row 7 has n = 918273")
    public = public_error(exc)
    assert "918273" not in public and "P0001" in public
