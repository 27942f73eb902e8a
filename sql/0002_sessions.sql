-- Session revocations (SPEC §4, §5; livepush/sessions.py). Independent of the other
-- migrations: no foreign keys, no shared functions.
--
-- Session tokens are stateless (signed, with an expiry inside), so only revocations are
-- stored. A server asks these tables at the handshake and, in batches, every
-- reverify_interval; revoke() also announces each revocation on the fan-out so open
-- connections close within a second.

-- One row per revoked session. expires_at is the session's own expiry: after it the
-- token is refused as expired anyway, so the row is pruned (see _PG_PRUNE).
CREATE TABLE livepush_revoked_sessions (
    session_id text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX livepush_revoked_sessions_expires_at ON livepush_revoked_sessions (expires_at);

-- "Sign out everywhere": every session of subject issued at or before revoked_at is
-- revoked; sessions issued later are not. Concurrent revocations keep the latest cut-off
-- (greatest() in the upsert). expires_at = revoked_at + the longest session lifetime
-- (366 days): no session the row covers can outlive it, so it is pruned then.
CREATE TABLE livepush_revoked_subjects (
    subject    text PRIMARY KEY,
    revoked_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX livepush_revoked_subjects_expires_at ON livepush_revoked_subjects (expires_at);
