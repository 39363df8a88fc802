-- pgtrickle catalog: bounds on input (issue 16, items 11 and 13).

-- The longest defining query create_stream_table accepts, in bytes (1 MiB).
INSERT INTO pgtrickle.pgt_settings (name, value, description) VALUES
    ('max_query_length', '1048576',
     'the longest defining query pgtrickle.create_stream_table accepts, in bytes (1024 to 104857600)')
ON CONFLICT (name) DO NOTHING;

-- Every numeric, interval, schedule and enumerated setting is checked when written against its
-- documented range (pgtrickle._validate_setting in api.sql, re-created on every install): an
-- out-of-range value is refused with SQLSTATE 22023 and changes nothing. Fires after
-- validate_setting (triggers fire in name order).
CREATE FUNCTION pgtrickle._check_setting_bounds() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    NEW.value := pgtrickle._validate_setting(NEW.name, NEW.value);
    RETURN NEW;
END
$$;

CREATE TRIGGER validate_setting_bounds BEFORE INSERT OR UPDATE ON pgtrickle.pgt_settings
    FOR EACH ROW EXECUTE FUNCTION pgtrickle._check_setting_bounds();
