"""What a failed refresh records as its error: the reason, not py4j's wrapper line."""

from __future__ import annotations

from pgtrickle.ops.error_redaction import public_error as _describe


def test_a_failed_spark_job_is_described_by_the_jvm_reason() -> None:
    exc = RuntimeError(
        "An error occurred while calling o86.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 3 in stage 2.0 "
        "failed 2 times, most recent failure: Lost task 3.1 (ExecutorLostFailure)\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(...)"
    )
    assert _describe(exc) == (
        "org.apache.spark.SparkException: Job aborted due to stage failure: Task 3 in "
        "stage 2.0 failed 2 times, most recent failure: Lost task 3.1 (ExecutorLostFailure)"
    )


def test_other_errors_keep_their_first_line() -> None:
    assert _describe(ValueError("division by zero\nCONTEXT: ...")) == "division by zero"
    assert _describe(ValueError("")) == "ValueError"
    assert _describe(ValueError("  \n  ")) == "ValueError"
    assert len(_describe(ValueError("x" * 5000))) == 2000
