-- pgtrickle catalog, version 8: user triggers on stream tables during refreshes.
-- (Functions are in api.sql: pgtrickle.set_user_triggers, pgtrickle.publish_stream_table.)

ALTER TABLE pgtrickle.pgt_stream_tables
    -- per-table override of the user_triggers setting; NULL follows the setting
    ADD COLUMN user_triggers text CHECK (user_triggers IN ('auto', 'on', 'off'));

INSERT INTO pgtrickle.pgt_settings (name, value, description) VALUES
    ('user_triggers', 'auto',
     'user triggers on stream tables during refreshes: auto (fire on DIFFERENTIAL, disabled on FULL + NOTIFY '
     'pg_trickle_refresh) | on (always fire) | off (never fire; every refresh sends the NOTIFY)');

-- Settings with a fixed set of values are checked when written, so a typo fails
-- with a clear message and changes nothing (rather than failing every refresh).
CREATE FUNCTION pgtrickle._check_setting() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.name = 'user_triggers' THEN
        NEW.value := lower(btrim(NEW.value));
        IF NEW.value NOT IN ('auto', 'on', 'off') THEN
            RAISE EXCEPTION 'invalid user_triggers %', quote_literal(left(NEW.value, 80))
                USING ERRCODE = 'invalid_parameter_value', HINT = 'Use ''auto'', ''on'' or ''off''.';
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER validate_setting BEFORE INSERT OR UPDATE ON pgtrickle.pgt_settings
    FOR EACH ROW EXECUTE FUNCTION pgtrickle._check_setting();
