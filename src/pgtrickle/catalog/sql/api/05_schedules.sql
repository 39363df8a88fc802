-- pgtrickle SQL API, schedules.
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

-- Schedules: the SQL half of pgtrickle's one schedule grammar (docs/SQL_API.md, "Schedules").
-- The daemon's half is pgtrickle.scheduler.schedule / pgtrickle.scheduler.cron; both accept
-- exactly the same strings (tests/integration/test_schedule_grammar.py checks it with random
-- input), and the API stores the canonical form, which the daemon parses back to the same schedule.
DROP FUNCTION IF EXISTS pgtrickle._cron_field_ok(text, int, int, text[]);

-- The values of one cron field (lower-case): a comma list of *, n, a-b (a <= b), each with an
-- optional /step (1..p_max; n/step means n-p_max/step); names are p_names (the first is p_min).
-- NULL when the field is not valid.
CREATE OR REPLACE FUNCTION pgtrickle._cron_field(p_field text, p_min int, p_max int, p_names text[])
RETURNS int[] LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    item text;
    m text[];
    ends int[];
    tok text;
    v int;
    step int;
    lo int;
    hi int;
    result int[] := '{}';
BEGIN
    FOREACH item IN ARRAY string_to_array(p_field, ',') LOOP
        m := regexp_match(item, '^(\*|[0-9a-z]+(?:-[0-9a-z]+)?)(?:/([0-9]+))?$');
        IF m IS NULL THEN
            RETURN NULL;
        END IF;
        step := 1;
        IF m[2] IS NOT NULL THEN
            IF m[2]::numeric < 1 OR m[2]::numeric > p_max THEN
                RETURN NULL;
            END IF;
            step := m[2]::int;
        END IF;
        IF m[1] = '*' THEN
            lo := p_min;
            hi := p_max;
        ELSE
            ends := '{}';
            FOREACH tok IN ARRAY string_to_array(m[1], '-') LOOP
                IF tok ~ '^[0-9]+$' THEN
                    IF tok::numeric < p_min OR tok::numeric > p_max THEN
                        RETURN NULL;
                    END IF;
                    v := tok::int;
                ELSIF p_names IS NOT NULL AND array_position(p_names, tok) IS NOT NULL THEN
                    v := array_position(p_names, tok) - 1 + p_min;
                ELSE
                    RETURN NULL;
                END IF;
                ends := ends || v;
            END LOOP;
            lo := ends[1];
            hi := CASE WHEN array_length(ends, 1) = 2 THEN ends[2]
                       WHEN m[2] IS NOT NULL THEN p_max ELSE lo END;
            IF hi < lo THEN
                RETURN NULL;
            END IF;
        END IF;
        result := result || ARRAY(SELECT generate_series(lo, hi, step));
    END LOOP;
    RETURN result;
END
$$;

-- Validate a schedule; returns its canonical form (what the catalog stores): 'calculated', an
-- @alias, a duration with units largest first ('90 m' -> '1h30m'), or a cron expression in
-- lower case with single spaces.
CREATE OR REPLACE FUNCTION pgtrickle._validate_schedule(p_schedule text)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ws constant text := ' ' || chr(9) || chr(10) || chr(11) || chr(12) || chr(13);
    s text := btrim(p_schedule, ws);
    l text := lower(s);
    f text[];
    total numeric := 0;
    part text[];
    units constant text[] := ARRAY['w', 'd', 'h', 'm', 's', 'ms'];
    unit_ms constant numeric[] := ARRAY[604800000, 86400000, 3600000, 60000, 1000, 1];
    last_rank int := 0;
    rank int;
    canonical text := '';
    n numeric;
    doms int[];
    months int[];
    shown text := quote_literal(left(p_schedule, 80));
    accepted constant text :=
        'Use a duration such as ''30s'', ''5m'', ''1h30m'' (units ms, s, m, h, d, w; 1s to 366d), '
        'a 5-field cron expression such as ''*/5 * * * *'' or @hourly/@daily/@weekly/@monthly/@yearly, '
        'or ''calculated''.';
BEGIN
    IF s IS NULL OR s = '' THEN
        RAISE EXCEPTION 'schedule must not be NULL or empty' USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF length(s) > 200 THEN
        RAISE EXCEPTION 'invalid schedule %: longer than 200 characters', shown
            USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF s ~ '[^\x01-\x7f]' THEN
        RAISE EXCEPTION 'invalid schedule %', shown USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF l = 'calculated' THEN
        RETURN 'calculated';
    END IF;
    IF left(s, 1) = '@' THEN
        IF l IN ('@hourly', '@daily', '@weekly', '@monthly', '@yearly') THEN
            RETURN l;
        END IF;
        RAISE EXCEPTION 'invalid schedule %: not a supported cron alias', shown
            USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF l ~ ('^([0-9]+[' || ws || ']*(ms|s|m|h|d|w)[' || ws || ']*)+$') THEN
        FOR part IN SELECT regexp_matches(l, '([0-9]+)[' || ws || ']*(ms|s|m|h|d|w)', 'g') LOOP
            rank := array_position(units, part[2]);
            IF rank <= last_rank THEN
                RAISE EXCEPTION 'invalid schedule %: duration units must appear once each, largest first', shown
                    USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
            END IF;
            last_rank := rank;
            total := total + part[1]::numeric * unit_ms[rank];
        END LOOP;
        IF total < 1000 OR total > 31622400000 THEN  -- 1s to 366d, in ms
            RAISE EXCEPTION 'invalid schedule %: duration out of range (1s to 366d)', shown
                USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
        FOR rank IN 1 .. 6 LOOP
            n := div(total, unit_ms[rank]);
            total := total - n * unit_ms[rank];
            IF n > 0 THEN
                canonical := canonical || n::text || units[rank];
            END IF;
        END LOOP;
        RETURN canonical;
    END IF;
    f := regexp_split_to_array(l, '[' || ws || ']+');
    IF array_length(f, 1) > 1 THEN
        IF array_length(f, 1) <> 5 THEN
            RAISE EXCEPTION 'invalid schedule %: a cron expression has exactly 5 fields (minute hour day-of-month month day-of-week)',
                shown USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
        doms := pgtrickle._cron_field(f[3], 1, 31, NULL);
        months := pgtrickle._cron_field(f[4], 1, 12,
            ARRAY['jan','feb','mar','apr','may','jun','jul','aug','sep','oct','nov','dec']);
        IF pgtrickle._cron_field(f[1], 0, 59, NULL) IS NULL OR pgtrickle._cron_field(f[2], 0, 23, NULL) IS NULL
           OR doms IS NULL OR months IS NULL
           OR pgtrickle._cron_field(f[5], 0, 7, ARRAY['sun','mon','tue','wed','thu','fri','sat']) IS NULL THEN
            RAISE EXCEPTION 'invalid schedule %: not a valid cron expression', shown
                USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
        -- The day matches when both day fields do, unless neither is '*' (then either is enough):
        -- so only a day of month that none of the months has can make it never fire.
        IF (f[3] = '*' OR f[5] = '*')
           AND NOT EXISTS (SELECT 1 FROM unnest(doms) d, unnest(months) mo
                            WHERE d <= (ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[mo]) THEN
            RAISE EXCEPTION 'invalid schedule %: the cron expression never fires (no chosen month has that day)', shown
                USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
        RETURN array_to_string(f, ' ');
    END IF;
    RAISE EXCEPTION 'invalid schedule %', shown
        USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
END
$$;
