-- The job runtime's tables (SPEC §4 Jobs, §7).
--
-- Two tables per job on purpose. `livepush_jobs` is the narrow state row that every claim,
-- completion and rescue rewrites; `livepush_job_payloads` holds what those statements never
-- touch (arguments) or touch rarely (error, progress). Rewriting a row copies all of it,
-- so keeping arguments out of the hot row keeps claims cheap and the heap small.

CREATE SEQUENCE livepush_job_lease_seq;

CREATE TABLE livepush_jobs (
    id               bigserial PRIMARY KEY,
    queue            text        NOT NULL,
    -- The job function's registered name. It lives here, not in the payload, because the
    -- claim filters on it (a runtime skips names it does not know during a rolling deploy).
    name             text        NOT NULL,
    priority         integer     NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    state            text        NOT NULL
        CHECK (state IN ('scheduled', 'available', 'running', 'succeeded', 'failed', 'cancelled')),
    -- Attempts started so far; a claim adds one, a release by a draining runtime takes it back.
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    -- The fencing token: a fresh value per claim. Every outcome names it, so a worker whose
    -- job was rescued and claimed again can never overwrite the new attempt.
    lease            bigint,
    runtime_id       bigint,
    -- Task groups (issue 6): members point at their group; NULL for a lone job.
    group_id         bigint,
    cancel_requested boolean     NOT NULL DEFAULT false,
    finished_at      timestamptz
) WITH (
    -- A queue table is mostly dead tuples: every job is inserted, rewritten two or three
    -- times and finished within seconds. The defaults (vacuum at 20 % dead rows, with cost
    -- throttling) let dead rows and index entries pile up under load until every claim
    -- wades through them (River #59, PgQueuer #389). Vacuum early and unthrottled, and
    -- leave free room in each page so a claim's rewrite can stay on the same page (HOT
    -- for updates that do not touch an indexed column).
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);

-- The claim's index: only rows ready to run, in claim order. Claimed rows leave it (their
-- state changes), so a claim never scans past jobs others hold; a claim ordered by id
-- alone over the whole table fell to ~300 jobs/s scanning past claimed rows.
CREATE INDEX livepush_jobs_claim_idx ON livepush_jobs (queue, priority, run_at, id)
    WHERE state = 'available';

-- Promotion of due scheduled jobs (delayed enqueues and retries after backoff).
CREATE INDEX livepush_jobs_scheduled_idx ON livepush_jobs (run_at)
    WHERE state = 'scheduled';

-- Rescue and drain look up running jobs by their runtime; the running set is small.
CREATE INDEX livepush_jobs_running_idx ON livepush_jobs (runtime_id)
    WHERE state = 'running';

CREATE INDEX livepush_jobs_group_idx ON livepush_jobs (group_id)
    WHERE group_id IS NOT NULL;

CREATE TABLE livepush_job_payloads (
    id          bigint PRIMARY KEY REFERENCES livepush_jobs (id) ON DELETE CASCADE,
    args        jsonb       NOT NULL,
    error       text,
    -- {"done": n, "total": n|null, "message": text|null}, written at most ~10 times a second per job.
    progress    jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
) WITH (
    -- Progress updates rewrite this row; room on the page keeps them HOT (no index
    -- touches progress or error).
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- One row per live runtime process. A runtime beats every `heartbeat` seconds; one silent
-- for three of its own beats is dead, and any other runtime deletes its row and releases
-- its jobs (attempt counted).
CREATE TABLE livepush_job_runtimes (
    id            bigserial PRIMARY KEY,
    host          text        NOT NULL,
    pid           integer     NOT NULL,
    queues        text[]      NOT NULL,
    concurrency   integer     NOT NULL,
    heartbeat     double precision NOT NULL CHECK (heartbeat > 0),
    state         text        NOT NULL DEFAULT 'running',
    in_hand       integer     NOT NULL DEFAULT 0,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50, autovacuum_vacuum_cost_delay = 0);
