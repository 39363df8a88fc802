"""Runs dbt commands for tests/integration/test_dbt.py in one long-lived process.

Importing dbt costs ~5 s of CPU a process on the 2-core test machine, and the dbt tests run some
25 commands, so this process imports it once and runs each command through dbt's programmatic
entry point (``dbtRunner``, what the ``dbt`` command itself runs; dbt supports one invocation
after the other in a process and resets its adapters after each).

Protocol: one JSON request a line on stdin (``{"args": [...], "cwd": "..."}``); for each, one
JSON line ``{"code": ..., "output": ...}`` on the file descriptor given as the only argument
(stdout stays free for anything that writes to it directly). The exit codes are the ``dbt``
command's: 0 success, 1 a failed run (a model, test or seed failed), 2 an error.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

from dbt.cli.main import dbtRunner


def main(answer_fd: int) -> None:
    with os.fdopen(answer_fd, "w") as answers:
        for line in sys.stdin:
            request = json.loads(line)
            os.chdir(request["cwd"])
            output = io.StringIO()
            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                result = dbtRunner().invoke(request["args"])
            code = 0 if result.success else 2 if result.exception is not None else 1
            if result.exception is not None:
                output.write(f"\n{type(result.exception).__name__}: {result.exception}\n")
            answers.write(json.dumps({"code": code, "output": output.getvalue()}) + "\n")
            answers.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]))
