-- pgtrickle catalog: the Spark jobs of every refresh (issue 17, item 4; src/pgtrickle/spark/jobs.py).
--
-- spark_jobs / spark_stages: the Spark jobs (and stages that ran, skipped ones not counted) of the
-- refresh, counted from its own job group. 0 for a refresh that started none (NO_DATA and SKIP rows
-- get the default, as does a refresh that failed before reaching Spark); NULL where they cannot be
-- counted (a Spark Connect session, an atomic group member's failure) and for rows older than this
-- migration. spark_jobs_why: set when more than one job ran, saying which actions ran them.
ALTER TABLE pgtrickle.pgt_refresh_history
    ADD COLUMN spark_jobs integer,
    ADD COLUMN spark_stages integer,
    ADD COLUMN spark_jobs_why text;
-- (Added without a default so older rows stay NULL - not counted - then the default for new rows.)
ALTER TABLE pgtrickle.pgt_refresh_history
    ALTER COLUMN spark_jobs SET DEFAULT 0,
    ALTER COLUMN spark_stages SET DEFAULT 0;

-- get_refresh_history returns the new columns: its result type changes, so the old functions go
-- (api.sql, applied right after the migrations, creates them again).
DROP FUNCTION IF EXISTS pgtrickle.get_refresh_history(text, integer);
DROP FUNCTION IF EXISTS pgtrickle._api_get_refresh_history(text, integer, text);
