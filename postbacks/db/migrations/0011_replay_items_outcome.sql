-- postbacks schema v11: a replay is in flight until the sink has recorded it. The drainer
-- notes the id of the `replayed` outcome it publishes with each item; until that outcome
-- is in delivery_outcomes (the delivery's status still the one before the replay), the
-- console refuses a second replay of the delivery, found by its id.

ALTER TABLE replay_items ADD COLUMN outcome_id text;
CREATE INDEX replay_items_delivery_idx ON replay_items (delivery_id);
