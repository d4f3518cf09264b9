-- postbacks schema v5: notification slots. The notifier tells an endpoint's owner at most
-- once per endpoint, kind and UTC hour: it claims the (endpoint_id, kind, hour) row with
-- INSERT ... ON CONFLICT DO NOTHING and notifies only a claim it won. event_id is the
-- operational event (ops_...) that claimed the slot: derived from the fact it came from,
-- so the same fact read again (a Kafka batch aborted after the claim) finds its own row.
-- Global events use endpoint_id '*'.

CREATE TABLE notifications (
    endpoint_id  text NOT NULL,
    kind         text NOT NULL,
    hour         timestamptz NOT NULL,
    event_id     text NOT NULL,
    sent_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (endpoint_id, kind, hour)
);
CREATE INDEX notifications_hour ON notifications (hour);
