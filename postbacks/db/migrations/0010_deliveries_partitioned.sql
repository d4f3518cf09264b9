-- postbacks schema v10: deliveries partitioned by day of creation (created_at), like the
-- attempt log, so that retention drops whole days. A partitioned table can hold no unique
-- index without its partition key, and a delivery's created_at is not stable (fan-out
-- stamps it when it plans the delivery, so a record planned again after a crash carries a
-- later one), so one row per delivery id is held by an unpartitioned key table,
-- delivery_keys. The id is derived from the delivery's identity (endpoint, conversion,
-- event type, goal; postbacks.core.identity), so one row per id is one row per identity.
--
-- The writers of the product (the sink, the backfill import) insert the keys first, in the
-- same transaction, and only the rows whose key was new; they say so with the
-- transaction-local setting postbacks.delivery_keys = 'written'. Any other insert (SQL by
-- hand) goes through a guard: an AFTER INSERT trigger writes the row's key, and refuses
-- (unique_violation) a row whose delivery is stored already under another creation time.
-- An AFTER trigger, with its WHEN evaluated per row, keeps the sink's COPY batched (a
-- BEFORE INSERT row trigger makes COPY insert row by row).

CREATE TABLE delivery_keys (
    delivery_id text PRIMARY KEY,
    created_at  timestamptz NOT NULL
);

ALTER TABLE deliveries RENAME TO deliveries_unpartitioned;
ALTER TABLE deliveries_unpartitioned RENAME CONSTRAINT deliveries_pkey
    TO deliveries_unpartitioned_pkey;
ALTER TABLE deliveries_unpartitioned RENAME CONSTRAINT deliveries_identity
    TO deliveries_unpartitioned_identity;

CREATE TABLE deliveries (LIKE deliveries_unpartitioned INCLUDING DEFAULTS,
    PRIMARY KEY (delivery_id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE deliveries_default PARTITION OF deliveries DEFAULT;

CREATE FUNCTION postbacks_delivery_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO delivery_keys (delivery_id, created_at)
    VALUES (NEW.delivery_id, NEW.created_at) ON CONFLICT DO NOTHING;
    IF NOT FOUND AND NOT EXISTS (SELECT 1 FROM delivery_keys k
                                  WHERE k.delivery_id = NEW.delivery_id
                                    AND k.created_at = NEW.created_at) THEN
        RAISE EXCEPTION 'delivery % is stored already, with another created_at',
                        NEW.delivery_id
              USING ERRCODE = 'unique_violation', CONSTRAINT = 'delivery_keys_pkey',
                    HINT = 'write the key first: see docs/operators.md, Deliveries by day';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER deliveries_key AFTER INSERT ON deliveries FOR EACH ROW
    WHEN (current_setting('postbacks.delivery_keys', true) IS DISTINCT FROM 'written')
    EXECUTE FUNCTION postbacks_delivery_key();

-- An UPDATE of a row's created_at (by hand: no writer of the product does it) carries
-- its key along; a deleted row's key goes with it (retention deletes the keys of the
-- partitions it drops itself: dropping a table fires no trigger).
CREATE FUNCTION postbacks_delivery_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE delivery_keys SET created_at = NEW.created_at
     WHERE delivery_id = OLD.delivery_id AND created_at = OLD.created_at;
    RETURN NULL;
END $$;
CREATE TRIGGER deliveries_moved AFTER UPDATE OF created_at ON deliveries
    FOR EACH ROW WHEN (OLD.created_at IS DISTINCT FROM NEW.created_at)
    EXECUTE FUNCTION postbacks_delivery_moved();

CREATE FUNCTION postbacks_delivery_key_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM delivery_keys WHERE delivery_id = OLD.delivery_id
       AND created_at = OLD.created_at;
    RETURN NULL;
END $$;
CREATE TRIGGER deliveries_key_gone AFTER DELETE ON deliveries
    FOR EACH ROW EXECUTE FUNCTION postbacks_delivery_key_gone();

-- Creates daily partitions of delivery_attempts and of deliveries from `from_day` for
-- `days` days (idempotent). A day that already has rows in a table's default partition
-- (stamped by a clock far ahead) is left to the default partition: PostgreSQL refuses a
-- partition whose range the default already holds rows of.
CREATE OR REPLACE FUNCTION postbacks_ensure_attempt_partitions(from_day date, days integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    d date;
    made integer := 0;
    name text;
    busy boolean;
    spec record;
BEGIN
    FOR i IN 0 .. days - 1 LOOP
        d := from_day + i;
        FOR spec IN SELECT * FROM (VALUES ('delivery_attempts', 'attempted_at'),
                                          ('deliveries', 'created_at')) AS s(parent, col)
        LOOP
            name := format('%s_%s', spec.parent, to_char(d, 'YYYYMMDD'));
            IF to_regclass(name) IS NULL THEN
                EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE %I >= %L AND %I < %L)',
                               spec.parent || '_default', spec.col, d::timestamptz,
                               spec.col, (d + 1)::timestamptz) INTO busy;
                IF NOT busy THEN
                    EXECUTE format(
                        'CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                        name, spec.parent, d::timestamptz, (d + 1)::timestamptz);
                    made := made + 1;
                END IF;
            END IF;
        END LOOP;
    END LOOP;
    RETURN made;
END $$;

-- A partition for every day the stored rows were created on, and the coming week's, then
-- the keys and the rows (the keys written here: the guard is told so). The indexes are
-- made after the copy (cheaper than maintaining them row by row).
DO $$
DECLARE
    d date;
BEGIN
    FOR d IN SELECT DISTINCT (created_at AT TIME ZONE current_setting('TimeZone'))::date
               FROM deliveries_unpartitioned LOOP
        PERFORM postbacks_ensure_attempt_partitions(d, 1);
    END LOOP;
    PERFORM postbacks_ensure_attempt_partitions(current_date - 1, 9);
END $$;

SELECT set_config('postbacks.delivery_keys', 'written', true);
INSERT INTO delivery_keys (delivery_id, created_at)
    SELECT delivery_id, created_at FROM deliveries_unpartitioned;
INSERT INTO deliveries SELECT * FROM deliveries_unpartitioned;
SELECT set_config('postbacks.delivery_keys', '', true);
DROP TABLE deliveries_unpartitioned;

-- The indexes of the unpartitioned table, but the unique ones (delivery_keys holds them).
CREATE INDEX deliveries_created_idx ON deliveries (created_at DESC, delivery_id DESC);
CREATE INDEX deliveries_endpoint_created_idx
    ON deliveries (endpoint_id, created_at DESC, delivery_id DESC);
CREATE INDEX deliveries_app_created_idx ON deliveries (app_id, created_at DESC, delivery_id DESC);
CREATE INDEX deliveries_status_idx ON deliveries (status, created_at DESC, delivery_id DESC);
CREATE INDEX deliveries_app_status_idx
    ON deliveries (app_id, status, created_at DESC, delivery_id DESC);
CREATE INDEX deliveries_error_idx ON deliveries (last_error, created_at DESC, delivery_id DESC)
    WHERE last_error IS NOT NULL;
CREATE INDEX deliveries_held_idx ON deliveries (held_at) WHERE status = 'held';
CREATE INDEX deliveries_conversion_idx ON deliveries (conversion_id);
CREATE INDEX deliveries_idempotency_idx ON deliveries (idempotency_key);
