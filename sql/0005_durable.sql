-- Durable jobs (livepush/jobs/durable/ owns these tables: its statements are in
-- livepush/jobs/durable/queries.py; the model is in docs/durable.md).
--
-- A durable job survives deploys and crashes by replay: each run starts at the top, and every
-- step it already finished returns what this table stored instead of running again. A step is
-- stored in one statement that is fenced by the run's lease, so a run that lost its job (rescued,
-- cancelled, given back) stores nothing.

CREATE TABLE livepush_job_steps (
    job_id       bigint      NOT NULL,
    -- checkpoint: ctx.checkpoint(name, ...), result {"value": RESULT}
    -- children:   the n-th ctx.run_child/run_children call of a run (name "n"),
    --             result {"group": GROUP_ID, "count": N}: the task group of its children
    -- signal:     the n-th wait for a signal NAME (name "n:NAME"), result {"deadline": ISO|null}
    --             while it waits, then {"data": DATA} or {"timeout": true}
    -- sleep:      ctx.sleep(name, seconds), result {"until": ISO}
    kind         text        NOT NULL CHECK (kind IN ('checkpoint', 'children', 'signal', 'sleep')),
    name         text        NOT NULL,
    result       jsonb       NOT NULL,
    -- SHA-256 of the RFC 8785 canonical JSON of the checkpoint's `input=`, when one was given.
    fingerprint  text,
    -- Orders a job's checkpoints (the latest one names the `checkpoint` event).
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, kind, name)
);

-- Signals sent to a job (jobs.signal) and not yet taken by a wait: a wait takes the oldest of its
-- name (deleting it, in the transaction that stores what the wait returns), so each is delivered
-- once and those sent before the wait are taken in order.
CREATE TABLE livepush_job_signals (
    id       bigserial   PRIMARY KEY,
    job_id   bigint      NOT NULL,
    name     text        NOT NULL,
    data     jsonb       NOT NULL,
    sent_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX livepush_job_signals_job_idx ON livepush_job_signals (job_id, name, id);

-- The keys of signals sent with jobs.signal(key=): a key names one signal to its job, so a send
-- retried after its reply was lost (the first one committed) sends nothing again and answers the
-- first one's id. Kept after the signal was taken (the retry may come later), and deleted with
-- the job by retention.
CREATE TABLE livepush_job_signal_keys (
    job_id     bigint NOT NULL,
    key        text   NOT NULL,
    signal_id  bigint NOT NULL,
    -- The signal's name: a send of the key under another name is the caller's mistake, refused.
    name       text   NOT NULL,
    PRIMARY KEY (job_id, key)
);
