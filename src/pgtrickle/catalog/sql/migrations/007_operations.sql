-- pgtrickle catalog, version 7: operations — auto-suspension, the alert log,
-- stale-data alerts. (No signature changes: functions and views are in api.sql.)

-- Every alert sent on the pg_trickle_alert channel, for tools that poll
-- instead of LISTENing. Written in the transaction that sends the NOTIFY,
-- so an alert is in the table exactly when it was delivered. Pruned by the
-- daemon after alert_retention.
CREATE TABLE pgtrickle.alerts (
    alert_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    event      text NOT NULL,
    -- the stream table the alert is about (NULL for alerts about a slot, a source, a group)
    st_schema  text,
    st_name    text,
    payload    jsonb NOT NULL
);
CREATE INDEX ON pgtrickle.alerts (at);
CREATE INDEX ON pgtrickle.alerts (event, alert_id);

ALTER TABLE pgtrickle.pgt_stream_tables
    -- a stale_data alert was sent at this time; cleared (stale_data_resolved) when fresh again
    ADD COLUMN stale_alerted_at timestamptz;

INSERT INTO pgtrickle.pgt_settings (name, value, description) VALUES
    ('auto_suspend_after', '3',
     'a stream table is SUSPENDED after this many consecutive failed refreshes (0: never)'),
    ('stale_data_factor', '3',
     'alert stale_data when a stream table''s data is older than this many times its schedule''s period (0: never)'),
    ('alert_retention', '7 days',
     'rows of pgtrickle.alerts older than this are pruned by the daemon');
