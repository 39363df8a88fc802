-- Refresh commands served by a running daemon (`pgtrickle refresh` with a daemon up; docs/CLI.md).
--
-- The command line inserts one row per `pgtrickle refresh` (through pgtrickle._api_submit_refresh,
-- which checks the caller may refresh each stream table), a daemon claims it (claimed_by: the
-- backend pid of its listener connection, which holds the daemon advisory lock while it lives),
-- runs it exactly as the command line would, and stores the result (the `--json` document
-- without schema_version) or the error that refused the whole command. The command line reads
-- it and deletes the row; a daemon deletes rows left behind an hour after they finished.
CREATE TABLE IF NOT EXISTS pgtrickle.pgt_refresh_commands (
    command_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pgt_ids       bigint[],           -- NULL: every stream table (--all)
    force         boolean NOT NULL DEFAULT false,
    requested_by  name NOT NULL DEFAULT session_user,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    claimed_by    integer,
    claimed_at    timestamptz,
    finished_at   timestamptz,
    result        json,               -- json, not jsonb: the document keeps its key order
    error         text,
    CHECK (finished_at IS NULL OR claimed_by IS NOT NULL),
    CHECK (finished_at IS NULL OR (result IS NULL) <> (error IS NULL))
);

REVOKE ALL ON pgtrickle.pgt_refresh_commands FROM PUBLIC;
GRANT SELECT ON pgtrickle.pgt_refresh_commands TO pgtrickle_user;
