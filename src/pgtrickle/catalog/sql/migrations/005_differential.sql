-- pgtrickle catalog, version 5: differential refresh.
-- The refresh engine analyses each defining query (in Python, with sqlglot)
-- and records here which mode runs and why, for explain_refresh_mode().
ALTER TABLE pgtrickle.pgt_stream_tables
    ADD COLUMN diff_fallback_ratio double precision
        CHECK (diff_fallback_ratio IS NULL OR (diff_fallback_ratio > 0 AND diff_fallback_ratio <= 1)),
    ADD COLUMN mode_effective text CHECK (mode_effective IN ('FULL', 'DIFFERENTIAL')),
    ADD COLUMN mode_reason text,
    ADD COLUMN mode_analyzed_at timestamptz;

INSERT INTO pgtrickle.pgt_settings (name, value, description) VALUES
    ('differential_fallback_ratio', '0.15',
     'a DIFFERENTIAL refresh whose pending changes exceed this fraction of its sources'' rows runs FULL instead');
