-- pgtrickle catalog: one schedule grammar (docs/SQL_API.md, "Schedules: one grammar").
--
-- Each stream table keeps its schedule parsed beside the text: schedule_parsed is what
-- pgtrickle._parse_schedule (api/05_schedules.sql, the only parser) returns for it, and the daemon
-- reads it instead of parsing the text. A trigger keeps the two together on every write of the
-- text, through the API or by hand: a text the grammar refuses is refused (22023) and nothing
-- changes, and an accepted one is stored in its canonical form. Rows already there get their
-- parsed form when the SQL API is installed (the DO block at the end of api/05_schedules.sql).
ALTER TABLE pgtrickle.pgt_stream_tables ADD COLUMN schedule_parsed jsonb;

CREATE FUNCTION pgtrickle._store_parsed_schedule() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pgtrickle, pg_temp AS $$
BEGIN
    NEW.schedule_parsed := pgtrickle._parse_schedule(NEW.schedule);
    NEW.schedule := NEW.schedule_parsed ->> 'schedule';
    RETURN NEW;
END
$$;

CREATE TRIGGER parse_schedule BEFORE INSERT OR UPDATE OF schedule ON pgtrickle.pgt_stream_tables
    FOR EACH ROW EXECUTE FUNCTION pgtrickle._store_parsed_schedule();
