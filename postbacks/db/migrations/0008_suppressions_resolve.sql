-- postbacks schema v8: resolving a suppression. A suppression stays on record when support
-- resolves it (the endpoint's config was fixed, the upstream mapping now exists): who
-- resolved it and when. A resolved suppression no longer keeps its delivery out of a
-- replay; a delivery suppressed again (it failed to render once more) is unresolved again.

ALTER TABLE postback_suppressions
    ADD COLUMN resolved_at timestamptz,
    ADD COLUMN resolved_by text;

CREATE INDEX postback_suppressions_endpoint_idx ON postback_suppressions (endpoint_id)
    WHERE resolved_at IS NULL;

-- A re-render (fix once, re-render many) is a replay job of its own kind.
ALTER TABLE replay_jobs DROP CONSTRAINT replay_jobs_kind_check;
ALTER TABLE replay_jobs ADD CONSTRAINT replay_jobs_kind_check
    CHECK (kind IN ('replay', 'edit_replay', 'bulk_replay', 'rerender'));
