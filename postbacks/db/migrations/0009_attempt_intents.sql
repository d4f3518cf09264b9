-- postbacks schema v9: a complete attempt log. Before every request the agent records an
-- intent (the attempt's id and request); the sink keeps an intent here until the
-- attempt's own record arrives. An intent that never gets one (the agent died between
-- sending and recording) is written into delivery_attempts as result 'unknown', error
-- class 'agent_lost', and kept here a day with lost_at set, so that an attempt record
-- arriving after all replaces that row instead of being dropped.

CREATE TABLE attempt_intents (
    attempt_id        text PRIMARY KEY,
    attempted_at      timestamptz NOT NULL,
    delivery_id       text NOT NULL,
    endpoint_id       text NOT NULL,
    idempotency_key   text NOT NULL,
    attempt_no        integer NOT NULL,
    trigger           text NOT NULL,
    agent_instance    text,
    queue_ms          double precision NOT NULL,
    request_method    text NOT NULL,
    request_url       text NOT NULL,
    request_headers   jsonb NOT NULL,
    request_body      bytea,
    read_at           timestamptz NOT NULL DEFAULT now(),
    lost_at           timestamptz,
    lost_reason       text
);
CREATE INDEX attempt_intents_delivery_idx ON attempt_intents (delivery_id)
    WHERE lost_at IS NULL;
CREATE INDEX attempt_intents_pending_idx ON attempt_intents (attempted_at)
    WHERE lost_at IS NULL;
CREATE INDEX attempt_intents_lost_idx ON attempt_intents (lost_at)
    WHERE lost_at IS NOT NULL;
