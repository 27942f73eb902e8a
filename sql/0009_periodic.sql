-- Periodic jobs (`@jobs.periodic`, livepush/jobs/periodic/; statements in
-- livepush/jobs/periodic/queries.py).
--
-- One row per periodic job name: the newest cron tick for which a job was enqueued. Every
-- runtime that has the job registered computes the newest due tick from the database's clock
-- and tries to move `last_tick` forward to it; the one whose UPDATE moves it enqueues the job
-- in the same transaction, so each tick is enqueued exactly once however many runtimes try.
-- A row is created (ON CONFLICT DO NOTHING) at the first tick a runtime sees for a new job,
-- which is recorded as done: a new periodic job starts from its next tick.
CREATE TABLE livepush_periodic (
    name        text        PRIMARY KEY,
    last_tick   timestamptz NOT NULL,
    -- When `last_tick` last moved (for operators: a row that stops moving has no runtime).
    updated_at  timestamptz NOT NULL DEFAULT now()
);
