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
    finished_at  timestamptz
) WITH (fillfactor = 70, autovacuum_vacuum_cost_delay = 0);

-- jobs.workflows.list(name=, state=): newest first, by keyset.
CREATE INDEX livepush_workflows_list_idx ON livepush_workflows (name, state, id);
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
    PRIMARY KEY (workflow_id, name)
) WITH (fillfactor = 70, autovacuum_vacuum_cost_delay = 0);

CREATE INDEX livepush_workflow_steps_job_idx ON livepush_workflow_steps (job_id) WHERE job_id IS NOT NULL;

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

-- Signals sent to a run for a step that has not started yet; the step's job takes them over
-- (as its own signals, sql/0005_durable.sql) in the transaction that creates it.
CREATE TABLE livepush_workflow_signals (
    id           bigserial   PRIMARY KEY,
    workflow_id  bigint      NOT NULL REFERENCES livepush_workflows (id) ON DELETE CASCADE,
    name         text        NOT NULL,
    data         jsonb       NOT NULL,
    sent_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX livepush_workflow_signals_idx ON livepush_workflow_signals (workflow_id, name, id);

-- A step's job changed in a way its run's state topic shows (it parked, or woke: the step is
-- `waiting`, or `running` again): a new version of `workflow:<id>`, rung in the caller's
-- transaction. Called by the statements that park and wake jobs, which hold the job's row (the
-- lock order job rows -> workflow rows holds), and by the ring of a fan-out step's task group
-- (livepush/jobs/groups/queries.py: RING_GROUPS), which holds no job row. Returns -1 when the run has finished (read after
-- waiting for whoever holds its row): a step must not park in a run that ended.
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
    RETURN livepush_state_changed(ARRAY['workflow:' || p_id], ARRAY[v]);
END
$$;
