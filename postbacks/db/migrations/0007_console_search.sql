-- postbacks schema v7: support's search and lists in the console. Finding a delivery by
-- any of its ids is an exact lookup on each: delivery_id (the primary key), conversion_id
-- and idempotency_key (the webhook-id a receiver sees). The dead-letters page filters by
-- endpoint and reason and counts per reason, newest first.

CREATE INDEX deliveries_conversion_idx ON deliveries (conversion_id);
CREATE INDEX deliveries_idempotency_idx ON deliveries (idempotency_key);
CREATE INDEX dead_letters_endpoint_idx ON dead_letters (endpoint_id, occurred_at DESC)
    WHERE endpoint_id IS NOT NULL;
CREATE INDEX dead_letters_reason_idx ON dead_letters (reason, occurred_at DESC);
