-- pgtrickle catalog, version 3: the circuit breaker.

ALTER TABLE pgtrickle.pgt_stream_tables
    -- 'default' follows the circuit_breaker_default setting
    ADD COLUMN cb_mode text NOT NULL DEFAULT 'default'
        CHECK (cb_mode IN ('default', 'none', 'fixed', 'adaptive')),
    ADD COLUMN cb_state text NOT NULL DEFAULT 'closed' CHECK (cb_state IN ('closed', 'open')),
    ADD COLUMN cb_tripped_at timestamptz,
    ADD COLUMN cb_trip_reason text,
    ADD COLUMN cb_last_delta bigint,
    ADD COLUMN cb_last_deletes bigint,
    ADD COLUMN cb_ceiling bigint CHECK (cb_ceiling > 0),
    ADD COLUMN cb_max_ratio double precision CHECK (cb_max_ratio > 0),
    ADD COLUMN cb_sensitivity double precision NOT NULL DEFAULT 3.0 CHECK (cb_sensitivity > 0),
    ADD COLUMN cb_window integer NOT NULL DEFAULT 20 CHECK (cb_window BETWEEN 2 AND 10000),
    ADD COLUMN cb_baseline text NOT NULL DEFAULT 'window' CHECK (cb_baseline IN ('window', 'ewma')),
    -- the baseline as of the last check, for circuit_breaker_status()
    ADD COLUMN cb_baseline_mean double precision,
    ADD COLUMN cb_baseline_stddev double precision,
    ADD COLUMN cb_threshold double precision;

-- Deletions per refresh, for the breaker's deletion baseline.
ALTER TABLE pgtrickle.pgt_refresh_history ADD COLUMN delta_deletes bigint;

INSERT INTO pgtrickle.pgt_settings (name, value, description) VALUES
    ('circuit_breaker_default', 'none',
     'circuit breaker mode of stream tables that do not set their own: none | fixed | adaptive'),
    ('circuit_breaker_cold_start_ceiling', '100000',
     'until an adaptive breaker has a full window of refreshes, more pending changes than this trip it');

-- The changes a tripped breaker held back, kept for inspection until reset.
CREATE TABLE pgtrickle.pgt_quarantine (
    pgt_id      bigint NOT NULL REFERENCES pgtrickle.pgt_stream_tables ON DELETE CASCADE,
    source      text NOT NULL,
    change_id   bigint NOT NULL,
    xid         xid8 NOT NULL,
    action      "char" NOT NULL,
    captured_at timestamptz,
    change      jsonb NOT NULL,
    PRIMARY KEY (pgt_id, source, change_id)
);

-- The signatures of these functions change: drop the old ones (api.sql re-creates them).
DROP FUNCTION IF EXISTS pgtrickle.alter_stream_table(text, text, text, text);
DROP FUNCTION IF EXISTS pgtrickle.refresh_stream_table(text);
