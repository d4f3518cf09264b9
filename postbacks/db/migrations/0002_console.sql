-- postbacks schema v2: the replay console (sign-in tokens, replay jobs) and the indexes its
-- pages page through (keyset paging on (created_at, delivery_id) under every filter).

CREATE TABLE console_tokens (
    token_id     text PRIMARY KEY,
    token_hash   bytea NOT NULL UNIQUE,          -- sha256 of the token; the token is shown once
    name         text NOT NULL,                  -- who signs in with it (the audit actor)
    role         text NOT NULL CHECK (role IN ('support', 'reviewer', 'admin', 'publisher')),
    app_ids      text[] NOT NULL DEFAULT '{}',   -- a publisher's apps (empty for staff)
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL,
    revoked_at   timestamptz,
    CHECK (role <> 'publisher' OR cardinality(app_ids) > 0)
);

-- A replay request (one delivery, an edit-and-replay, or a bulk replay by filter) and the
-- deliveries it re-drives. A drainer publishes the items to the first retry tier at the
-- per-endpoint cap, marks them published, and counts them on the job.
CREATE TABLE replay_jobs (
    job_id       text PRIMARY KEY,
    topic_prefix text NOT NULL DEFAULT '',      -- the deployment whose drainer publishes it
    actor        text NOT NULL,
    role         text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('replay', 'edit_replay', 'bulk_replay')),
    selection    jsonb NOT NULL,                 -- ids or the filter, as given
    override     jsonb,                          -- edit-and-replay: core/override.py
    note         text,
    total        integer NOT NULL,
    published    integer NOT NULL DEFAULT 0,
    state        text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'done')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
CREATE INDEX replay_jobs_open_idx ON replay_jobs (topic_prefix, created_at)
    WHERE state = 'queued';

CREATE TABLE replay_items (
    job_id        text NOT NULL REFERENCES replay_jobs (job_id),
    seq           integer NOT NULL,
    delivery_id   text NOT NULL,
    endpoint_id   text NOT NULL,
    app_id        text NOT NULL,
    queued_at     timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz,
    error         text,                          -- why it could not be published (skipped)
    PRIMARY KEY (job_id, seq)
);
CREATE INDEX replay_items_pending_idx ON replay_items (job_id, seq) WHERE published_at IS NULL;
CREATE INDEX replay_items_app_idx ON replay_items (app_id, queued_at);

-- Keyset paging (created_at DESC, delivery_id DESC) with and without each filter.
DROP INDEX IF EXISTS deliveries_endpoint_created_idx;
DROP INDEX IF EXISTS deliveries_app_created_idx;
DROP INDEX IF EXISTS deliveries_status_idx;
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
CREATE INDEX audit_log_target_idx ON audit_log (target_type, target_id, at);
CREATE INDEX audit_log_at_idx ON audit_log (at DESC);
CREATE INDEX dead_letters_delivery_idx ON dead_letters (delivery_id) WHERE delivery_id IS NOT NULL;
