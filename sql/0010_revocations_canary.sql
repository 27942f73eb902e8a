-- The revocation store's canary (livepush/sessions/revocations.py owns it: PostgresRevocations.ring_canary).
--
-- `livepush_revocations`, payload "canary TOKEN": a server's readiness check rings the
-- revocation store's channel and waits to hear it back, where nothing else shows that the
-- store's listener hears (the Redis fan-out with the jobs in another database). Every server
-- hears it; only the one whose token it names counts it, and no server re-checks its sessions
-- for it. Writes nothing; delivered at commit, like every ring.
CREATE FUNCTION livepush_revocations_canary(p_token text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT pg_notify('livepush_revocations', 'canary ' || p_token)
$$;
