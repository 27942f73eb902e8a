-- Workflows (livepush/jobs/workflows/ owns these tables: its statements are in
-- livepush/jobs/workflows/queries.py; the model is in docs/workflows.md).
--
-- A run is a row; each of its steps is a row that a job runs (livepush_jobs.workflow_id = the
-- run). Every decision about a run (a step ended, an operator verb, a start) is taken under the
-- run row's lock, so steps start exactly once whatever the interleaving.
--
-- The run row is the state topic `workflow:<id>`: `version` grows with every change a page could
-- see, `event` names the last one.

CREATE TABLE livepush_workflows (
    id           bigserial PRIMARY KEY,
    name         text        NOT NULL,
    queue        text        NOT NULL,
    state        text        NOT NULL DEFAULT 'running'
        -- (`waiting` is shown, not stored: a running run whose active steps all wait.)
        CHECK (state IN ('running', 'paused', 'succeeded', 'failed', 'cancelled')),
    -- The graph as the code defined it when the run started (steps, what each comes after, its
    -- job and options): the run follows it whatever later deploys change.
    graph        jsonb       NOT NULL,
    input        jsonb       NOT NULL,
    output       jsonb,
    error        text,
    version      bigint      NOT NULL DEFAULT 1,
    event        text        NOT NULL DEFAULT 'started'
        CHECK (event IN ('started', 'step', 'paused', 'resumed', 'finished', 'cancelled')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    -- flow.start(key=): the idempotency key of the start that made the run (COLLATE "C", as a
    -- job's key: compared byte by byte, whatever the database's collation).
    key          text COLLATE "C"
) WITH (fillfactor = 70, autovacuum_vacuum_cost_delay = 0);

-- jobs.workflows.list(name=, state=): newest first, by keyset.
CREATE INDEX livepush_workflows_list_idx ON livepush_workflows (name, state, id);
-- The key's invariant, held by Postgres whatever the caller does: one unfinished run of a workflow
-- per key (workflows/queries.py: INSERT_RUN, KEYED_RUN). It is also what makes concurrent starts
-- of a key safe: of two inserts of one key the second waits on this index for the first's
-- transaction, and inserts nothing once that committed; it then finds the winner in a fresh
-- snapshot. Partial: a finished run frees its key, and runs without a key cost nothing here.
CREATE UNIQUE INDEX livepush_workflows_key_idx ON livepush_workflows (name, key)
    WHERE key IS NOT NULL AND state IN ('running', 'paused');
-- jobs.workflows.list(key=): the runs started with a key, finished ones too, newest first
-- (workflows/queries.py: LIST_KEYED_RUNS). Runs without a key cost nothing here.
CREATE INDEX livepush_workflows_keys_idx ON livepush_workflows (key, id) WHERE key IS NOT NULL;
-- `livepush status` lists the newest unfinished runs and counts them all (workflows/queries.py:
-- RUNS_IN_PROGRESS): without it the report read every finished run retention keeps.
CREATE INDEX livepush_workflows_unfinished_idx ON livepush_workflows (id) WHERE state IN ('running', 'paused');
-- Retention finds finished runs by age.
CREATE INDEX livepush_workflows_finished_idx ON livepush_workflows (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE livepush_workflow_steps (
    workflow_id  bigint  NOT NULL REFERENCES livepush_workflows (id) ON DELETE CASCADE,
    name         text    NOT NULL,
    state        text    NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'running', 'waiting', 'succeeded', 'skipped', 'failed', 'cancelled')),
    -- The job running it now (its latest, after a rerun), and a fan-out step's batch.
    job_id       bigint,
    group_id     bigint,
    output       jsonb,
    error        text,
    -- What `workflow:<id>` shows of the step that lives on other rows (its job's, its batch's), as
    -- of the run's latest version: written only by the statements that give the run a new
    -- version, in the same transaction, so one version of the topic is one state, also after the
    -- run finished (when a stopped batch goes on changing). `attempt`: its job's latest claim's
    -- (livepush_workflow_steps_claimed()); `batch`: its batch's counts (livepush_workflow_batch()).
    attempt      integer NOT NULL DEFAULT 0,
    batch        jsonb,
    PRIMARY KEY (workflow_id, name)
) WITH (fillfactor = 70, autovacuum_vacuum_cost_delay = 0);

CREATE INDEX livepush_workflow_steps_job_idx ON livepush_workflow_steps (job_id) WHERE job_id IS NOT NULL;
-- Retention keeps a step's batch while its run has not finished (groups/queries.py: PRUNE_GROUPS).
CREATE INDEX livepush_workflow_steps_group_idx ON livepush_workflow_steps (group_id) WHERE group_id IS NOT NULL;

-- The claim of steps' jobs (workflows/queries.py: CLAIM_STEPS), which the plain claim's index
-- leaves out (sql/0003_jobs.sql): a step's claim gives its run a new version, and the plain claim
-- pays nothing for that. Only rows ready to run, in claim order, as the plain claim's.
CREATE INDEX livepush_jobs_step_claim_idx ON livepush_jobs (queue, priority, run_at, id)
    WHERE state = 'available' AND workflow_id IS NOT NULL;

-- Who did what to a run, and why: operator verbs (pause, resume, cancel, skip, signal) and the
-- verbs steps used (ctx.flow.*), for jobs.workflows.get().
CREATE TABLE livepush_workflow_audit (
    workflow_id  bigint      NOT NULL REFERENCES livepush_workflows (id) ON DELETE CASCADE,
    seq          bigserial,
    verb         text        NOT NULL,
    step         text,
    actor        text,
    reason       text,
    at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, seq)
);

-- Signals sent to a run for a step that has not started yet, each kept for the step it was sent
-- to (`step`, as its audit line says): that step's next job takes it over (as its own signal,
-- sql/0005_durable.sql) in the transaction that creates it; a step that finishes without
-- starting (skipped, or its run ended) drops it, so it never reaches another step.
CREATE TABLE livepush_workflow_signals (
    id           bigserial   PRIMARY KEY,
    workflow_id  bigint      NOT NULL REFERENCES livepush_workflows (id) ON DELETE CASCADE,
    step         text        NOT NULL,
    name         text        NOT NULL,
    data         jsonb       NOT NULL,
    sent_at      timestamptz NOT NULL DEFAULT now()
);

-- A step takes one signal. Signals to one run take turns on its row (jobs.workflows.signal locks
-- it FOR NO KEY UPDATE), so each sees where the one before it went; this index holds the rule
-- whatever writes the table.
CREATE UNIQUE INDEX livepush_workflow_signals_idx ON livepush_workflow_signals (workflow_id, step);

-- The keys of signals sent with jobs.workflows.signal(key=): a key names one signal to its run, so
-- a send retried after its reply was lost (the first one committed) sends nothing again, rather
-- than reach the next step waiting for the name, or be refused when none is left. No foreign key
-- to the run: its check would lock the run's row before the step's job's, against the lock order
-- of signals and decisions (job rows first). Retention deletes them with the run (PRUNE_RUNS).
CREATE TABLE livepush_workflow_signal_keys (
    workflow_id  bigint NOT NULL,
    key          text   NOT NULL,
    -- The signal's name: a send of the key under another name is the caller's mistake, refused.
    name         text   NOT NULL,
    PRIMARY KEY (workflow_id, key)
);

-- The counts of a fan-out step's batch, as `workflow:<id>` shows them (NULL once the group was
-- pruned). Read in the caller's snapshot.
CREATE FUNCTION livepush_workflow_batch(p_group bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('total', g.total, 'pending', sum(sh.pending), 'succeeded', sum(sh.succeeded),
                              'failed', sum(sh.failed), 'cancelled', sum(sh.cancelled))
    FROM livepush_groups g JOIN livepush_group_shards sh ON sh.group_id = g.id
    WHERE g.id = p_group
    GROUP BY g.id, g.total
$$;

-- A step's job changed in a way its run's state topic shows (it parked, or woke: the step is
-- `waiting`, or `running` again), or its batch's counts did: a new version of `workflow:<id>`,
-- with the counts of the run's batches as of now, rung in the caller's transaction. Called by the
-- statements that park and wake jobs, which hold the job's row (the lock order job rows ->
-- workflow rows holds), and by the ring of a fan-out step's task group
-- (livepush/jobs/groups/queries.py: RING_GROUPS), which holds no job row. The run's row is
-- updated before its step rows, as in every decision. Returns -1 when the run has finished (read
-- after waiting for whoever holds its row): a step must not park in a run that ended, and a
-- finished run keeps the counts its last version showed.
CREATE FUNCTION livepush_workflow_touched(p_id bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v bigint;
BEGIN
    UPDATE livepush_workflows SET version = version + 1, event = 'step'
    WHERE id = p_id AND finished_at IS NULL
    RETURNING version INTO v;
    IF v IS NULL THEN
        RETURN -1;
    END IF;
    UPDATE livepush_workflow_steps SET batch = coalesce(livepush_workflow_batch(group_id), batch)
    WHERE workflow_id = p_id AND group_id IS NOT NULL;
    RETURN livepush_state_changed(ARRAY['workflow:' || p_id], ARRAY[v]);
END
$$;

-- Whether `p_job`, the job of a workflow step, no longer runs its step: the step ended without it
-- (a sibling ended the run, an operator skipped it). The decision that ended the step stopped the
-- job in its own transaction, unless the job's row was busy then (a progress write, a checkpoint,
-- a claim: the lock order lets a decision only skip it); the runtimes read this with the cancel
-- requests of their running jobs (livepush/jobs/queries.py: CANCEL_REQUESTS_FOR), so such a job is
-- stopped after all, not left to run to its end. Read in the caller's snapshot.
CREATE FUNCTION livepush_workflow_job_stopped(p_job bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (SELECT 1 FROM livepush_workflow_steps
                       WHERE job_id = p_job AND state IN ('running', 'waiting'))
$$;

-- Jobs of steps were claimed (workflows/queries.py: CLAIM_STEPS, whose statement holds their
-- rows): each unfinished run among them gets a new version of `workflow:<id>` showing its step's
-- new attempt, rung in the caller's transaction. Runs in id order, so two claims never wait for
-- each other in a circle; each run's row before its step rows, as in every decision. A finished
-- run is left as its last version showed it. Arrays: the jobs, their runs, their new attempts.
CREATE FUNCTION livepush_workflow_steps_claimed(p_jobs bigint[], p_runs bigint[], p_attempts integer[])
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r bigint;
    v bigint;
    n integer := 0;
BEGIN
    FOR r IN SELECT DISTINCT u.run FROM unnest(p_runs) AS u(run) WHERE u.run IS NOT NULL ORDER BY 1 LOOP
        UPDATE livepush_workflows SET version = version + 1, event = 'step'
        WHERE id = r AND finished_at IS NULL
        RETURNING version INTO v;
        CONTINUE WHEN v IS NULL;
        UPDATE livepush_workflow_steps s SET attempt = u.attempt
        FROM unnest(p_jobs, p_runs, p_attempts) AS u(job, run, attempt)
        WHERE u.run = r AND s.workflow_id = r AND s.job_id = u.job;
        n := n + livepush_state_changed(ARRAY['workflow:' || r], ARRAY[v]);
    END LOOP;
    RETURN n;
END
$$;
