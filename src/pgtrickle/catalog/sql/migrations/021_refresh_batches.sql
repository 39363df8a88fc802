-- pgtrickle catalog: batched refreshes (issue 18, item 1; src/pgtrickle/refresh/batch.py).
--
-- batch_id: set on the history rows of the stream tables refreshed together by one batch (one
-- snapshot, one Spark job computing every member's delta, one transaction per member): the
-- refresh_id of the batch's first member, whose row records the shared Spark job(s) in
-- spark_jobs; the other members record 0 there. NULL for a refresh that ran on its own.
ALTER TABLE pgtrickle.pgt_refresh_history ADD COLUMN batch_id bigint;
