-- postbacks schema v13: the held deliveries awaiting review, without those parked because
-- their endpoint is disabled (hold reason endpoint_disabled: they wait for the endpoint to
-- be re-enabled, not for a reviewer). The gate's held-depth gauges count these only, by an
-- index-only scan of this partial index. (On the partitioned table the build takes each
-- partition's write lock in turn: the sink waits for it, nothing is lost.)
CREATE INDEX deliveries_review_idx ON deliveries (held_at)
    WHERE status = 'held' AND hold_reason IS DISTINCT FROM 'endpoint_disabled';
