-- postbacks schema v1. Applied by `postbacks migrate` inside one transaction.

CREATE TABLE endpoints (
    endpoint_id   text PRIMARY KEY,
    app_id        text NOT NULL,
    publisher_id  text,
    name          text NOT NULL DEFAULT '',
    url           text NOT NULL,
    method        text NOT NULL DEFAULT 'POST',
    provider      text NOT NULL DEFAULT 'v3',
    event_types   text[] NOT NULL DEFAULT ARRAY['*'],
    enabled       boolean NOT NULL DEFAULT true,
    concurrency   integer NOT NULL DEFAULT 4 CHECK (concurrency BETWEEN 1 AND 64),
    config        jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX endpoints_app_idx ON endpoints (app_id) WHERE enabled;

-- Signing secrets, AES-256-GCM encrypted at rest (nonce || ciphertext, key from
-- POSTBACKS_SECRETS_KEY). Two rows overlap during a rotation.
CREATE TABLE endpoint_secrets (
    secret_id     text PRIMARY KEY,
    endpoint_id   text NOT NULL REFERENCES endpoints (endpoint_id) ON DELETE CASCADE,
    ciphertext    bytea NOT NULL,
    active_from   timestamptz NOT NULL DEFAULT now(),
    active_until  timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CHECK (active_until IS NULL OR active_until > active_from)
);
CREATE INDEX endpoint_secrets_endpoint_idx ON endpoint_secrets (endpoint_id);

-- One row per delivery: the write-once snapshot plus a mutable status projection that
-- the sink derives from outcomes (rebuildable from outcomes and attempts).
CREATE TABLE deliveries (
    delivery_id        text PRIMARY KEY,
    endpoint_id        text NOT NULL,
    app_id             text NOT NULL,
    conversion_id      text NOT NULL,
    event_type         text NOT NULL,
    goal_id            text,
    event_id           text NOT NULL,
    idempotency_key    text NOT NULL,
    payout_usd_micros  bigint,
    snapshot           jsonb NOT NULL,
    created_at         timestamptz NOT NULL,
    status             text NOT NULL DEFAULT 'pending',
    status_at          timestamptz,
    attempt_count      integer NOT NULL DEFAULT 0,
    last_error         text,
    held_at            timestamptz,
    hold_reason        text,
    CONSTRAINT deliveries_identity UNIQUE NULLS NOT DISTINCT
        (endpoint_id, conversion_id, event_type, goal_id)
);
CREATE INDEX deliveries_endpoint_created_idx ON deliveries (endpoint_id, created_at DESC);
CREATE INDEX deliveries_app_created_idx ON deliveries (app_id, created_at DESC);
CREATE INDEX deliveries_status_idx ON deliveries (status, created_at DESC);

-- Append-only attempt log, partitioned by day (retention drops whole partitions).
CREATE TABLE delivery_attempts (
    attempt_id        text NOT NULL,
    attempted_at      timestamptz NOT NULL,
    delivery_id       text NOT NULL,
    endpoint_id       text NOT NULL,
    idempotency_key   text NOT NULL,
    attempt_no        integer NOT NULL,
    trigger           text NOT NULL,
    result            text NOT NULL,
    status_code       integer,
    error_class       text,
    error_message     text,
    queue_ms          double precision NOT NULL,
    platform_ms       double precision NOT NULL,
    wire_ms           double precision NOT NULL,
    request_method    text NOT NULL,
    request_url       text NOT NULL,
    request_headers   jsonb NOT NULL,
    request_body      bytea,
    response_excerpt  bytea,
    PRIMARY KEY (attempt_id, attempted_at)
) PARTITION BY RANGE (attempted_at);
CREATE TABLE delivery_attempts_default PARTITION OF delivery_attempts DEFAULT;
CREATE INDEX delivery_attempts_delivery_idx ON delivery_attempts (delivery_id, attempted_at);

-- Creates daily partitions from `from_day` for `days` days (idempotent).
CREATE FUNCTION postbacks_ensure_attempt_partitions(from_day date, days integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    d date;
    made integer := 0;
    name text;
BEGIN
    FOR i IN 0 .. days - 1 LOOP
        d := from_day + i;
        name := format('delivery_attempts_%s', to_char(d, 'YYYYMMDD'));
        IF to_regclass(name) IS NULL THEN
            EXECUTE format(
                'CREATE TABLE %I PARTITION OF delivery_attempts FOR VALUES FROM (%L) TO (%L)',
                name, d::timestamptz, (d + 1)::timestamptz);
            made := made + 1;
        END IF;
    END LOOP;
    RETURN made;
END $$;

-- Every outcome event (append-only); the deliveries status projection is derived from it.
CREATE TABLE delivery_outcomes (
    outcome_id         text PRIMARY KEY,
    delivery_id        text NOT NULL,
    endpoint_id        text NOT NULL,
    app_id             text NOT NULL,
    kind               text NOT NULL,
    attempt_no         integer NOT NULL,
    payout_usd_micros  bigint,
    reason             text,
    actor              text,
    occurred_at        timestamptz NOT NULL
);
CREATE INDEX delivery_outcomes_delivery_idx ON delivery_outcomes (delivery_id, occurred_at);

CREATE TABLE dead_letters (
    dead_letter_id    text PRIMARY KEY,
    reason            text NOT NULL,
    error_class       text NOT NULL,
    error_message     text NOT NULL,
    stage             text NOT NULL,
    origin_topic      text NOT NULL,
    origin_partition  integer NOT NULL,
    origin_offset     bigint NOT NULL,
    original_key      bytea,
    original_value    bytea,
    delivery_id       text,
    endpoint_id       text,
    occurred_at       timestamptz NOT NULL,
    resolved_at       timestamptz,
    resolved_by       text
);
CREATE INDEX dead_letters_occurred_idx ON dead_letters (occurred_at DESC);

-- Permanent mapping failures that must not be retried, with the reason (filled by the
-- delivery engine).
CREATE TABLE postback_suppressions (
    delivery_id   text PRIMARY KEY,
    endpoint_id   text NOT NULL,
    reason        text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    created_by    text
);

-- Anomaly gate configuration and durable halt state (filled by the anomaly gate).
CREATE TABLE payout_anomaly_settings (
    scope        text NOT NULL CHECK (scope IN ('endpoint', 'global')),
    scope_key    text NOT NULL,
    detector     text NOT NULL,
    mode         text NOT NULL DEFAULT 'off' CHECK (mode IN ('off', 'detect', 'enforce')),
    params       jsonb NOT NULL DEFAULT '{}'::jsonb,
    state        text NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'tripped')),
    state_changed_at timestamptz,
    state_reason text,
    PRIMARY KEY (scope, scope_key, detector)
);

CREATE TABLE audit_log (
    audit_id     bigserial PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    actor        text NOT NULL,
    action       text NOT NULL,
    target_type  text NOT NULL,
    target_id    text NOT NULL,
    before       jsonb,
    after        jsonb,
    note         text
);
CREATE RULE audit_log_no_update AS ON UPDATE TO audit_log DO INSTEAD NOTHING;
CREATE RULE audit_log_no_delete AS ON DELETE TO audit_log DO INSTEAD NOTHING;

-- The sink's Kafka offsets, written in the same transaction as the rows they cover.
CREATE TABLE sink_offsets (
    consumer_group  text NOT NULL,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    next_offset     bigint NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, kafka_partition)
);
