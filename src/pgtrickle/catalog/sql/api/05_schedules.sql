-- pgtrickle SQL API, schedules.
-- Re-applied on every `pgtrickle install` (catalog/install.py installs the files of this
-- folder in its declared order), so every object here is CREATE OR REPLACE. Internal
-- helpers start with an underscore. Every identifier built into dynamic SQL goes through
-- format('%I').

-- Schedules: pgtrickle's one schedule grammar (docs/SQL_API.md, "Schedules: one grammar").
-- pgtrickle._parse_schedule is the only parser: it accepts or refuses a schedule and gives its
-- parsed form (jsonb: the canonical text, the kind, the interval or the cron fire times as sets).
-- The catalog stores that form beside the text (pgt_stream_tables.schedule_parsed, kept by the
-- trigger of migration 019 and derived again below on every install); the daemon reads it and
-- never parses schedule text (pgtrickle.scheduler.schedule.schedule_from_parsed only decodes it).
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

-- Parse a schedule. Returns its parsed form, a jsonb object:
--   {"kind": "calculated", "schedule": "calculated"}
--   {"kind": "interval", "schedule": "1h30m", "interval_ms": 5400000}
--   {"kind": "cron", "schedule": "*/5 * * * *", "minute": [0, 5, ...], "hour": [...],
--    "day_of_month": [...], "month": [...], "day_of_week": [0..6, 0 = Sunday], "day_or": false}
-- "schedule" is the canonical text (what the catalog stores): 'calculated', an @alias, a duration
-- with units largest first ('90 m' -> '1h30m'), or a cron expression in lower case with single
-- spaces. The cron sets are sorted and distinct; "day_or": neither day field is '*', so a day
-- matches when either one does. Anything else raises invalid_parameter_value (22023), naming the
-- problem, with a HINT listing the accepted forms.
CREATE OR REPLACE FUNCTION pgtrickle._parse_schedule(p_schedule text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ws constant text := ' ' || chr(9) || chr(10) || chr(11) || chr(12) || chr(13);
    s text := btrim(p_schedule, ws);
    l text := lower(s);
    canonical text := '';
    f text[];
    total numeric := 0;
    part text[];
    units constant text[] := ARRAY['w', 'd', 'h', 'm', 's', 'ms'];
    unit_ms constant numeric[] := ARRAY[604800000, 86400000, 3600000, 60000, 1000, 1];
    last_rank int := 0;
    rank int;
    n numeric;
    i int;
    one int[];
    field_names constant text[] := ARRAY['minute', 'hour', 'day of month', 'month', 'day of week'];
    field_keys constant text[] := ARRAY['minute', 'hour', 'day_of_month', 'month', 'day_of_week'];
    lows constant int[] := ARRAY[0, 0, 1, 1, 0];
    highs constant int[] := ARRAY[59, 23, 31, 12, 7];
    month_names constant text[] := ARRAY['jan','feb','mar','apr','may','jun','jul','aug','sep','oct','nov','dec'];
    day_names constant text[] := ARRAY['sun','mon','tue','wed','thu','fri','sat'];
    result jsonb := '{}';
    shown text := left(p_schedule, 80);  -- quoted below, as an SQL literal without E'' (messages only)
    malformed constant text := 'a duration is one or more <number><unit> parts with units ms, s, m, h, d, w, '
                               'each used at most once, largest first';
    accepted constant text :=
        'Use a duration such as ''30s'', ''5m'', ''1h30m'' (units ms, s, m, h, d, w; 1s to 366d), '
        'a 5-field cron expression such as ''*/5 * * * *'' or @hourly/@daily/@weekly/@monthly/@yearly, '
        'or ''calculated''.';
BEGIN
    IF s IS NULL OR s = '' THEN
        RAISE EXCEPTION 'schedule must not be NULL or empty' USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF length(p_schedule) > 80 THEN
        shown := left(p_schedule, 77) || '...';
    END IF;
    shown := '''' || replace(shown, '''', '''''') || '''';
    IF length(s) > 200 THEN
        RAISE EXCEPTION 'invalid schedule %: longer than 200 characters', shown
            USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF s ~ '[^\x01-\x7f]' THEN
        RAISE EXCEPTION 'invalid schedule %: only ASCII characters are allowed', shown
            USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF l = 'calculated' THEN
        RETURN jsonb_build_object('kind', 'calculated', 'schedule', 'calculated');
    END IF;
    IF left(s, 1) = '@' THEN
        canonical := l;
        l := CASE l WHEN '@hourly' THEN '0 * * * *' WHEN '@daily' THEN '0 0 * * *' WHEN '@weekly' THEN '0 0 * * 0'
                    WHEN '@monthly' THEN '0 0 1 * *' WHEN '@yearly' THEN '0 0 1 1 *' END;
        IF l IS NULL THEN
            RAISE EXCEPTION 'invalid schedule %: not a supported cron alias', shown
                USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
    ELSIF l ~ ('^([0-9]+[' || ws || ']*[a-z]+[' || ws || ']*)+$') THEN
        -- Numbers each followed by a word: a duration, or a malformed one.
        IF l !~ ('^([0-9]+[' || ws || ']*(ms|s|m|h|d|w)[' || ws || ']*)+$') THEN
            RAISE EXCEPTION 'invalid schedule %: %', shown, malformed
                USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
        FOR part IN SELECT regexp_matches(l, '([0-9]+)[' || ws || ']*(ms|s|m|h|d|w)', 'g') LOOP
            rank := array_position(units, part[2]);
            IF rank <= last_rank THEN
                RAISE EXCEPTION 'invalid schedule %: %', shown, malformed
                    USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
            END IF;
            last_rank := rank;
            total := total + part[1]::numeric * unit_ms[rank];
        END LOOP;
        IF total < 1000 OR total > 31622400000 THEN  -- 1s to 366d, in ms
            RAISE EXCEPTION 'invalid schedule %: the interval is out of range (1s to 366d)', shown
                USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
        result := jsonb_build_object('kind', 'interval', 'interval_ms', total::bigint);
        FOR rank IN 1 .. 6 LOOP
            n := div(total, unit_ms[rank]);
            total := total - n * unit_ms[rank];
            IF n > 0 THEN
                canonical := canonical || n::text || units[rank];
            END IF;
        END LOOP;
        RETURN result || jsonb_build_object('schedule', canonical);
    END IF;
    f := regexp_split_to_array(l, '[' || ws || ']+');
    IF array_length(f, 1) = 1 THEN
        RAISE EXCEPTION 'invalid schedule %: it is not a duration, a cron expression or ''calculated''', shown
            USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF array_length(f, 1) <> 5 THEN
        RAISE EXCEPTION 'invalid schedule %: a cron expression has exactly 5 fields (minute hour day-of-month month day-of-week)',
            shown USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    IF canonical = '' THEN
        canonical := array_to_string(f, ' ');
    END IF;
    FOR i IN 1 .. 5 LOOP
        one := pgtrickle._cron_field(f[i], lows[i], highs[i],
                                     CASE i WHEN 4 THEN month_names WHEN 5 THEN day_names END);
        IF one IS NULL THEN
            RAISE EXCEPTION 'invalid schedule %: the % field % is not valid (%; items *, n, a-b, each with an optional /step)',
                shown, field_names[i], quote_literal(left(f[i], 40)),
                lows[i] || '-' || highs[i] || CASE WHEN i >= 4 THEN ' or names' ELSE '' END
                USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
        END IF;
        IF i = 5 THEN
            one := ARRAY(SELECT v % 7 FROM unnest(one) v);  -- 7 is Sunday too
        END IF;
        result := result || jsonb_build_object(field_keys[i], to_jsonb(ARRAY(SELECT DISTINCT v FROM unnest(one) v ORDER BY v)));
    END LOOP;
    -- The day matches when both day fields do, unless neither is '*' (then either is enough):
    -- so only a day of month that none of the months has can make it never fire.
    IF (f[3] = '*' OR f[5] = '*')
       AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(result -> 'day_of_month') d,
                                     jsonb_array_elements_text(result -> 'month') mo
                        WHERE d::int <= (ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[mo::int]) THEN
        RAISE EXCEPTION 'invalid schedule %: the cron expression never fires (no chosen month has that day)', shown
            USING ERRCODE = 'invalid_parameter_value', HINT = accepted;
    END IF;
    RETURN result || jsonb_build_object('kind', 'cron', 'schedule', canonical, 'day_or', f[3] <> '*' AND f[5] <> '*');
END
$$;

-- A schedule's canonical text (what the API stores), or invalid_parameter_value: _parse_schedule.
CREATE OR REPLACE FUNCTION pgtrickle._validate_schedule(p_schedule text)
RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN pgtrickle._parse_schedule(p_schedule) ->> 'schedule';

-- _parse_schedule that does not raise: for a text it refuses, {"kind": "invalid", "schedule":
-- <the text>, "error": <the message>, "hint": <the hint>}. What the daemon reads for a stream table
-- whose stored schedule has no parsed form (written by hand, or by an older version, in a form this
-- grammar refuses), so that this one stream table goes to ERROR and nothing else stops.
CREATE OR REPLACE FUNCTION pgtrickle._parse_schedule_or_error(p_schedule text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_error text;
    v_hint text;
BEGIN
    RETURN pgtrickle._parse_schedule(p_schedule);
EXCEPTION WHEN invalid_parameter_value THEN
    GET STACKED DIAGNOSTICS v_error = MESSAGE_TEXT, v_hint = PG_EXCEPTION_HINT;
    RETURN jsonb_build_object('kind', 'invalid', 'schedule', p_schedule, 'error', v_error, 'hint', v_hint);
END
$$;

-- Every stream table's parsed schedule, derived again from its text by this version's parser (an
-- upgrade may be the first to store it, or may parse differently). A stored text this grammar
-- refuses keeps no parsed form: the daemon puts that stream table in ERROR (docs/SQL_API.md).
DO $$
BEGIN
    UPDATE pgtrickle.pgt_stream_tables s
       SET schedule_parsed = q.parsed
      FROM (SELECT pgt_id, CASE WHEN p ->> 'kind' = 'invalid' THEN NULL ELSE p END AS parsed
              FROM (SELECT pgt_id, pgtrickle._parse_schedule_or_error(schedule) AS p
                      FROM pgtrickle.pgt_stream_tables) AS r) AS q
     WHERE q.pgt_id = s.pgt_id AND s.schedule_parsed IS DISTINCT FROM q.parsed;
END
$$;
