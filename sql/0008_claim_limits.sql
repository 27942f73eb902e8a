-- Claim limits and paused queues (livepush/jobs/ owns them: its statements are in
-- livepush/jobs/queries.py; docs/jobs.md "Limits and paused queues").
--
-- Only jobs whose function has a limit take the limited claim (CLAIM_LIMITED); every other job
-- keeps the plain claim, which gains one lookup in the (almost always empty) paused table.

-- The concurrency key of a job whose function has `concurrency=(param, n)`: the value of that
-- argument at enqueue, as JSON text. NULL for every other job (and for jobs enqueued before the
-- limit existed, which the limit does not count). Never updated after the insert.
ALTER TABLE livepush_jobs ADD COLUMN concurrency_key text;

-- The running jobs of each key, counted by the limited claim. Partial: jobs without a key never
-- enter it, so the plain path pays nothing for it.
CREATE INDEX livepush_jobs_key_running_idx ON livepush_jobs (name, concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

-- One row per job name that has a limit, written by each runtime that defines the function as it
-- starts (the newest definition wins; a definition without limits deletes its row). The row is
-- also what serializes the limited claims of its name: each one locks it first, in its own
-- statement, so the claim that follows counts running rows in a snapshot taken after every
-- earlier claim of the name committed (queries.py: CLAIM_LIMITED).
CREATE TABLE livepush_job_limits (
    name         text PRIMARY KEY,
    -- At most this many jobs of the name running at once per concurrency key (NULL: no limit).
    max_running  integer CHECK (max_running >= 1),
    -- The token bucket: `rate` tokens a second (NULL: no limit), at most `burst` kept; a claim
    -- takes one per job started. `tokens` is as of `refilled_at`.
    rate         double precision CHECK (rate > 0),
    burst        double precision CHECK (burst >= 1),
    tokens       double precision NOT NULL DEFAULT 0,
    refilled_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (max_running IS NOT NULL OR rate IS NOT NULL)
) WITH (fillfactor = 50, autovacuum_vacuum_cost_delay = 0);

-- Queues no runtime claims from (jobs.pause_queue()); enqueues are still accepted. Read by every
-- claim, so a pause holds for every runtime from the claim after it commits.
CREATE TABLE livepush_paused_queues (
    queue      text PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT now()
);
