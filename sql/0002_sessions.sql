-- Session revocations (livepush/sessions/revocations.py owns these tables and the
-- `livepush_revocations` channel).
--
-- Session tokens are stateless (signed, with an expiry inside), so only revocations are stored.
-- A server asks these tables at the handshake and, in batches, every reverify_interval. Each
-- revocation also rings `livepush_revocations` in its own transaction: a doorbell without a
-- payload, on which every server re-checks its open sessions against these tables at once. A
-- forged ring costs one such check and closes nothing.

-- One row per revoked session. expires_at is the session's own expiry: after it the token is
-- refused as expired anyway, so the row is pruned.
CREATE TABLE livepush_revoked_sessions (
    session_id text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX livepush_revoked_sessions_expires_at ON livepush_revoked_sessions (expires_at);

-- "Sign out everywhere": every session of subject issued at or before revoked_at is revoked;
-- sessions issued later are not. Concurrent revocations keep the latest cut-off (greatest()
-- in the upsert). expires_at = revoked_at + the longest session lifetime + the clock allowance
-- (revocations.SUBJECT_KEPT): no session the row covers can outlive it on any server whose clock
-- is within the allowance, so it is pruned then.
CREATE TABLE livepush_revoked_subjects (
    subject    text PRIMARY KEY,
    revoked_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX livepush_revoked_subjects_expires_at ON livepush_revoked_subjects (expires_at);

-- The doorbell, delivered when the revoking transaction commits.
CREATE FUNCTION livepush_revocations_changed() RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT pg_notify('livepush_revocations', '')
$$;

-- A server's readiness canary on this channel, payload "canary TOKEN" (PostgresRevocations.ring_canary):
-- rung where nothing else shows that the store's listener hears (the jobs in another database, so
-- that neither the fan-out's canary nor the state rings go through it). Every server hears it; only the one whose token it names counts it, and
-- no server re-checks its sessions for it. Writes nothing; delivered at commit, like every ring.
CREATE FUNCTION livepush_revocations_canary(p_token text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT pg_notify('livepush_revocations', 'canary ' || p_token)
$$;
