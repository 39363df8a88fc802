-- Stream tables whose defining query reads the clock (now(), current_timestamp, current_date,
-- localtimestamp, clock_timestamp(), ...): their result changes while their sources stay idle,
-- so they are recomputed on every scheduled refresh (docs/SQL_API.md, "Queries that read the clock").
-- Detected from PostgreSQL's own parse tree of the defining view (pgtrickle._reads_clock).
ALTER TABLE pgtrickle.pgt_stream_tables ADD COLUMN IF NOT EXISTS reads_clock boolean NOT NULL DEFAULT false;

UPDATE pgtrickle.pgt_stream_tables s
   SET reads_clock = true
 WHERE EXISTS (
        SELECT 1 FROM pg_catalog.pg_rewrite r
         WHERE r.ev_class = s.def_view
           AND (r.ev_action::text ~ 'SQLVALUEFUNCTION :op [0-9]+ :type (1082|1083|1114|1184|1266) '
                OR EXISTS (SELECT 1
                             FROM regexp_matches(r.ev_action::text, ':funcid ([0-9]+) ', 'g') AS f(id)
                             JOIN pg_catalog.pg_proc p ON p.oid = f.id[1]::oid
                            WHERE p.pronamespace = 'pg_catalog'::regnamespace
                              AND p.proname IN ('now', 'clock_timestamp', 'statement_timestamp',
                                                'transaction_timestamp', 'timeofday'))));
