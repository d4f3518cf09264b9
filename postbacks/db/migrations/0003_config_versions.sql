-- postbacks schema v3: config change counters. A stage asks "did any endpoint, secret or
-- anomaly setting change?" by reading one row, instead of hashing every row of those
-- tables at every refresh (38 ms of PostgreSQL per stage and refresh at 1,700 endpoints
-- and 7,000 secrets, growing with them).
--
-- A BEFORE STATEMENT trigger bumps the counter in the writer's transaction: the new value
-- becomes visible with the change itself, never before it (a sequence would be seen before
-- the commit, and a reader could record it and miss the rows). Its row lock is taken
-- before the statement touches any row, so writers of these tables queue on it, one
-- transaction at a time, instead of deadlocking on each other's rows by plain writes. (A
-- transaction that locks a row with SELECT ... FOR UPDATE before its first write can
-- still meet one holding the counter the other way round: PostgreSQL aborts one of the
-- two; the gate's trip writer retries.) Readers never wait on it. A statement changing no
-- row bumps it too: one needless reload, never a missed one.

CREATE TABLE config_versions (
    name        text PRIMARY KEY CHECK (name IN ('endpoints', 'payout_anomaly_settings')),
    version     bigint NOT NULL DEFAULT 0,
    changed_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO config_versions (name) VALUES ('endpoints'), ('payout_anomaly_settings');

CREATE FUNCTION postbacks_bump_config_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE config_versions SET version = version + 1, changed_at = now()
     WHERE name = TG_ARGV[0];
    RETURN NULL;
END $$;

CREATE TRIGGER endpoints_config_version
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON endpoints
    FOR EACH STATEMENT EXECUTE FUNCTION postbacks_bump_config_version('endpoints');
CREATE TRIGGER endpoint_secrets_config_version
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON endpoint_secrets
    FOR EACH STATEMENT EXECUTE FUNCTION postbacks_bump_config_version('endpoints');
CREATE TRIGGER payout_anomaly_settings_config_version
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON payout_anomaly_settings
    FOR EACH STATEMENT EXECUTE FUNCTION postbacks_bump_config_version('payout_anomaly_settings');
