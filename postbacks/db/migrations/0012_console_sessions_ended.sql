-- postbacks schema v12: signing out of the console ends the session on the server. The
-- session cookie is stateless (token id, expiry, signature); a signed-out cookie's
-- signature is kept here until the cookie would have expired, and a request carrying it
-- is not signed in, even with a copy of the cookie taken before the sign-out.

CREATE TABLE console_sessions_ended (
    session     text PRIMARY KEY,            -- the cookie's signature
    token_id    text NOT NULL,
    expires_at  timestamptz NOT NULL,        -- the cookie's own expiry: kept until then
    ended_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX console_sessions_ended_expires_idx ON console_sessions_ended (expires_at);
