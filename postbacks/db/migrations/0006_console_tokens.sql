-- postbacks schema v6: console tokens expire, record when they were last used, and a URL
-- change is confirmed with a separate single-use confirmation.

ALTER TABLE console_tokens
    ADD COLUMN expires_at   timestamptz,             -- NULL: never expires
    ADD COLUMN last_used_at timestamptz;             -- updated at most once a minute

-- Each URL-change confirmation (a signed, 5-minute code bound to the token, endpoint and
-- URL) is recorded here when it is spent, so it is accepted once. Spent rows older than a
-- day are pruned when the next one is spent.
CREATE TABLE console_step_ups (
    nonce     text PRIMARY KEY,
    token_id  text NOT NULL,
    used_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX console_step_ups_used_idx ON console_step_ups (used_at);
