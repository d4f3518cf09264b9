-- postbacks schema v4: auto-disable. The sink keeps each endpoint's delivery health (the
-- last success, the first failure since it, the last 410 Gone) in endpoint_health, one
-- upsert per endpoint and flush, apart from endpoints so that its writes do not bump the
-- endpoints' config counter (every stage would reload every endpoint). The monitor
-- disables an endpoint by setting disabled_at: its deliveries are then parked (held,
-- reason endpoint_disabled) until `postbacks endpoints enable` re-enables it. `enabled`
-- stays the owner's switch (a disabled-by-owner endpoint gets no deliveries at all).

ALTER TABLE endpoints
    ADD COLUMN disabled_at     timestamptz,
    ADD COLUMN disabled_reason text;

CREATE TABLE endpoint_health (
    endpoint_id     text PRIMARY KEY,
    last_success_at timestamptz,
    failing_since   timestamptz,
    last_gone_at    timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
