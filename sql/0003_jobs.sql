-- The job runtime's tables and channels (livepush/jobs/ owns them: its statements are in
-- livepush/jobs/queries.py).
--
-- Two tables per job on purpose. `livepush_jobs` is the narrow state row that every claim,
-- completion and rescue rewrites; `livepush_job_payloads` holds what those statements never
-- touch (arguments) or touch rarely (error, progress). Rewriting a row copies all of it, so
-- keeping arguments out of the hot row keeps claims cheap and the heap small.
--
-- A job's row is its state topic `job:<id>`: `version` grows with every change a page could
-- see, `event` names the last one, and each change rings `livepush_states` with the topic and
-- the new version (in the same transaction, except a claim's `started`, which the runtime rings
-- with its next write). Nothing is written anywhere else for it.

CREATE TABLE livepush_jobs (
    id               bigserial PRIMARY KEY,
    queue            text        NOT NULL,
    -- The job function's registered name. It lives here, not in the payload, because the
    -- claim filters on it (a runtime skips names it does not know during a rolling deploy).
    name             text        NOT NULL,
    priority         integer     NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    state            text        NOT NULL
        -- waiting: a durable job parked (ctx.run_children, wait_for_signal, sleep: sql/0005_durable.sql)
        -- until what it waits for happens; it holds no runtime slot meanwhile.
        CHECK (state IN ('scheduled', 'available', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')),
    -- Attempts started so far; a claim adds one, a release by a draining runtime or a park takes
    -- it back.
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    -- The fencing token: a fresh value per claim (livepush_job_lease()). Every outcome names
    -- it, so a worker whose job was rescued and claimed again can never overwrite the new attempt.
    lease            bigint,
    runtime_id       bigint,
    -- The task group this job is a member of (counted in it), or NULL.
    group_id         bigint,
    -- The task group this job is a callback of (on_finish, on_success, on_failure: never
    -- counted as a member), or NULL.
    callback_of      bigint,
    -- The workflow run this job is a step of (sql/0006_workflows.sql), or NULL: its end
    -- advances the run, in the transaction that records it.
    workflow_id      bigint,
    cancel_requested boolean     NOT NULL DEFAULT false,
    finished_at      timestamptz,
    -- The state topic: the version of what a page sees, and the event that made it.
    version          bigint      NOT NULL DEFAULT 1,
    event            text        NOT NULL DEFAULT 'enqueued'
        CHECK (event IN ('enqueued', 'started', 'progress', 'retrying', 'succeeded', 'failed', 'cancelled',
                     'waiting', 'checkpoint')),
    -- Whether the job stored a durable step (sql/0005_durable.sql): a run of a job without one
    -- has nothing to replay, and never reads the steps table.
    has_steps        boolean     NOT NULL DEFAULT false,
    -- Enqueue options (sql/0007_enqueue_options.sql). `key`: at most one job with a key is
    -- unfinished at a time, except that a debounced enqueue may queue one job behind a started
    -- one. NULL for the jobs of a plain enqueue.
    key              text COLLATE "C",
    -- Which place of its key a job holds: 0 for the first job with a key, 1 (or the lowest free
    -- place) for a job a debounced enqueue queued behind one that had already started. Chosen
    -- at insert and never changed by the runtime, so no state change of the runtime (claim, retry,
    -- release, rescue, promote) can make two unfinished rows collide on the key's unique index:
    -- its predicate is over the unfinished states as a whole, which those changes never leave
    -- except by finishing. jobs.retry_failed() of a finished job puts it back in place 0, as a new
    -- enqueue would (jobs/queries.py: RETRY_FAILED).
    key_slot         smallint    NOT NULL DEFAULT 0,
    -- Labels to list and cancel jobs by (jobs.list_tagged, jobs.cancel_tagged); NULL when none.
    tags             text[],
    -- Claim limits (sql/0008_claim_limits.sql). Whether the job takes the limited claim: set at
    -- enqueue when its function has a limit. The two claims read two partial indexes, so neither
    -- wades through the other's jobs (limited jobs waiting for a slot or a token can be a long
    -- backlog at the head of a queue). Cleared only when a definition drops its limits
    -- (queries.py: UNFLAG_LIMITED).
    limited          boolean     NOT NULL DEFAULT false,
    -- The concurrency key of a job whose function has `concurrency=(param, n)`: the value of
    -- that argument at enqueue, as JSON text. NULL for every other job. Never updated after the
    -- insert, except by a debounced enqueue that replaces the pending job's arguments.
    concurrency_key  text,
    CHECK (group_id IS NULL OR callback_of IS NULL)
) WITH (
    -- A queue table is mostly dead tuples: every job is inserted, rewritten two or three times
    -- and finished within seconds. The defaults (vacuum at 20 % dead rows, with cost
    -- throttling) let dead rows and index entries pile up under load until every claim wades
    -- through them. Vacuum early and unthrottled, and leave free room in each page so a
    -- rewrite can stay on the same page (HOT, for updates that touch no indexed column).
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);

-- The plain claim's index: only rows ready to run, in claim order. Claimed rows leave it (their
-- state changes), so a claim never scans past jobs others hold (a claim ordered by id over the
-- whole table slows down as it scans past claimed rows). Jobs with limits have their own
-- (sql/0008_claim_limits.sql), and so do workflow steps' (sql/0006_workflows.sql: their claim
-- gives their run a new version, which a plain job's claim does not pay for).
CREATE INDEX livepush_jobs_claim_idx ON livepush_jobs (queue, priority, run_at, id)
    WHERE state = 'available' AND NOT limited AND workflow_id IS NULL;

-- Promotion of due scheduled jobs (delayed enqueues and retries after backoff) and of waiting
-- jobs whose time came (durable sleeps, signal timeouts; a wait without a time has run_at
-- 'infinity').
CREATE INDEX livepush_jobs_scheduled_idx ON livepush_jobs (run_at)
    WHERE state IN ('scheduled', 'waiting');

-- Rescue and drain look up running jobs by their runtime; the running set is small.
CREATE INDEX livepush_jobs_running_idx ON livepush_jobs (runtime_id)
    WHERE state = 'running';

-- Failed jobs, newest first (jobs.list_failed, and the FAILED count of `livepush status`).
-- Without it both read every finished job retention keeps to find the failed ones among them.
-- An entry only for a job that fails for good: that update rewrites the row outside HOT anyway
-- (its state changes), so this adds one insert there and nothing to enqueues, claims or
-- successes.
CREATE INDEX livepush_jobs_failed_idx ON livepush_jobs (id) WHERE state = 'failed';

-- Retention of lone finished jobs, oldest first (groups/queries.py: PRUNE_JOBS). Without it a
-- prune read every finished job still within its retention, the whole table when nothing was
-- due, every minute in every runtime. The finishing update is a non-HOT rewrite already (its
-- state changes); this is one more entry on it, at the index's right end (finished_at grows).
CREATE INDEX livepush_jobs_finished_idx ON livepush_jobs (finished_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled') AND group_id IS NULL AND callback_of IS NULL;

CREATE INDEX livepush_jobs_group_idx ON livepush_jobs (group_id) WHERE group_id IS NOT NULL;
CREATE INDEX livepush_jobs_callback_idx ON livepush_jobs (callback_of) WHERE callback_of IS NOT NULL;

-- No foreign key to livepush_jobs: its check would look each job up again for rows the same
-- statement has just inserted side by side. Every statement that inserts a job inserts its
-- payload in the same statement, and every statement that deletes jobs deletes their payloads
-- in the same statement (livepush/jobs/queries.py: DELETE_PAYLOADS_OF_GONE).
CREATE TABLE livepush_job_payloads (
    id          bigint PRIMARY KEY,
    args        jsonb       NOT NULL,
    error       text,
    -- {"done": n, "total": n|null, "message": text|null}, written at most ~10 times a second per job.
    progress    jsonb,
    -- The job function's return value (JSON), once it succeeded.
    result      jsonb,
    -- What a waiting job waits for: {"for": "children"|"signal"|"sleep", "name": ...}, written
    -- when it parks (shown only while its state is `waiting`).
    waiting     jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
) WITH (
    -- Progress updates rewrite this row; room on the page keeps them HOT (no index touches
    -- progress or error).
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- A fresh lease per claim: 62 random bits. Claims commit asynchronously (a claim lost in a crash
-- only makes its job run again, which at-least-once allows), and a crash can rewind a sequence
-- past values handed out in unflushed transactions, so a lease from a sequence could match a
-- later claim of the same job. A random one matches it with probability 2^-62.
CREATE FUNCTION livepush_job_lease() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT (floor(random() * 2147483648)::bigint << 31) | floor(random() * 2147483648)::bigint
$$;

-- A new runtime's id: 53 random bits, the most a JSON number holds exactly. Ids go out as JSON
-- numbers (runtime:<id> and runtimes for operators' pages, `livepush status --json`), which
-- JavaScript reads as doubles: a 62-bit id came out as another number there, and a page
-- subscribed to a runtime:<id> nobody publishes on. Random for the reason below; two of them
-- match with probability 2^-53.
CREATE FUNCTION livepush_runtime_id() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT (floor(random() * 4194304)::bigint << 31) | floor(random() * 2147483648)::bigint
$$;

-- One row per live runtime process. A runtime beats every `heartbeat` seconds; one silent for
-- three of its own beats is dead, and any other runtime deletes its row and releases its jobs
-- (attempt counted). A runtime starting on the same node also finds one whose process is gone.
CREATE TABLE livepush_job_runtimes (
    -- Random (livepush_runtime_id()), as a lease, not a sequence: a failover to a copy that lacks the last
    -- registrations (a restored backup, a standby that was behind) rewinds a sequence, and a
    -- runtime starting there took the id of one still running, which then beat, claimed under
    -- and at its stop gave back the other's jobs as its own (or, re-registered first, made the
    -- new one's registration fail).
    id            bigint      PRIMARY KEY DEFAULT livepush_runtime_id(),
    host          text        NOT NULL,
    pid           integer     NOT NULL,
    -- The machine and process namespace the pid belongs to (boot id and pid namespace), when
    -- known: a runtime that starts there finds runtimes that died on it (their pid is gone) at
    -- once, instead of after three missed beats.
    node          text,
    queues        text[]      NOT NULL,
    concurrency   integer     NOT NULL,
    heartbeat     double precision NOT NULL CHECK (heartbeat > 0 AND heartbeat <= 86400),
    state         text        NOT NULL DEFAULT 'running',
    in_hand       integer     NOT NULL DEFAULT 0,
    -- The periodic jobs it schedules (sql/0009_periodic.sql), written as it registers:
    -- jobs.forget_periodic(name) refuses a name a live runtime lists here.
    periodic      text[]      NOT NULL DEFAULT '{}',
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50, autovacuum_vacuum_cost_delay = 0);

-- The batch of an enqueue (livepush/jobs/api/enqueue.py: Batch), read here only: every batch
-- enqueue statement and function (ENQUEUE, livepush_enqueue_keyed, livepush_enqueue_debounced)
-- takes its jobs through this; a lone job goes by scalar parameters (ENQUEUE_ONE,
-- livepush_enqueue_one_keyed), and task-group callbacks and workflow steps are inserted by
-- their own statements. One JSON document, written by one call of
-- the encoder: {"specs": [[name, queue, priority, max_attempts, limited], ...], "rows": [[spec,
-- args, key, group_id, concurrency_key, run_at, tags, later], ...]}. `run_at` is an instant
-- (at=), or a number: seconds from the enqueue statement on this database's clock (wait=, which
-- the enqueuing machine's clock, perhaps off from it, must not move). A batch's jobs share a few
-- functions, so what a function fixes is written once per function (`spec`: its place in
-- `specs`), and a row leaves out its trailing nulls: a plain job is `[0, []]`, a keyed one
-- `[0, [], "k"]`. `later` is 1 for an item whose key an earlier item of the batch has (only the
-- first may create the job). Rows come out in item order (`ord`, from 1). SQL, not PL/pgSQL,
-- and STABLE (the time cast reads the session's time zone): Postgres inlines it into the calling
-- statement, so the document is expanded once, as part of that statement's plan.
CREATE FUNCTION livepush_job_items(p_batch jsonb)
RETURNS TABLE (ord bigint, name text, queue text, priority integer, at timestamptz, max_attempts integer,
               group_id bigint, args jsonb, tags text[], key text, first boolean, concurrency_key text,
               limited boolean)
LANGUAGE sql STABLE AS $$
    SELECT u.ord, f.spec ->> 0, f.spec ->> 1, (f.spec ->> 2)::integer,
           CASE WHEN jsonb_typeof(u.j -> 5) = 'number'
                THEN statement_timestamp() + make_interval(secs => (u.j ->> 5)::float8)
                ELSE (u.j ->> 5)::timestamptz END,
           (f.spec ->> 3)::integer, (u.j ->> 3)::bigint, u.j -> 1,
           -- NULL for none, so untagged jobs stay out of the tags index.
           CASE WHEN jsonb_typeof(u.j -> 6) = 'array' THEN ARRAY(SELECT jsonb_array_elements_text(u.j -> 6)) END,
           u.j ->> 2, (u.j ->> 7) IS NULL, u.j ->> 4, coalesce((f.spec -> 4)::boolean, false)
    FROM jsonb_array_elements(p_batch -> 'rows') WITH ORDINALITY AS u(j, ord)
    -- A lookup per row, not a join: no plan can read the rows more than once.
    CROSS JOIN LATERAL (SELECT p_batch -> 'specs' -> (u.j ->> 0)::integer AS spec) f
$$;

-- The ring functions below are PL/pgSQL, not SQL: Postgres 15 plans the body of a SQL function
-- that it cannot inline again at every execution of the statement calling it, where PL/pgSQL
-- keeps the plan for the session. Every enqueue and outcome calls one.
--
-- The runtimes' doorbell `livepush_jobs`: something may be ready to claim. No payload, so
-- Postgres folds the rings of one transaction into one, delivered at commit: a rolled-back
-- enqueue wakes nobody. A forged ring costs one claim query.
CREATE FUNCTION livepush_jobs_ready() RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_notify('livepush_jobs', '');
    RETURN 1;
END
$$;

-- Rings `p_channel` with `p_ids`, comma-separated, at most 300 a notification (under Postgres'
-- 8000-byte limit). Returns the notifications sent.
CREATE FUNCTION livepush_notify_ids(p_channel text, p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT count(pg_notify(p_channel, c.ids))::integer
            FROM (SELECT string_agg(u.id::text, ',' ORDER BY u.ord) AS ids
                  FROM unnest(p_ids) WITH ORDINALITY AS u(id, ord)
                  GROUP BY (u.ord - 1) / 300) c);
END
$$;

-- `livepush_jobs_cancel`: the ids of running jobs whose cancel was requested. A runtime confirms
-- each against the row (cancel_requested) before it stops anything.
CREATE FUNCTION livepush_jobs_cancel_requested(p_ids bigint[]) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    SELECT livepush_notify_ids('livepush_jobs_cancel', p_ids)
$$;

-- `livepush_states`: state topics that changed, one "TOPIC VERSION" (or "TOPIC" when the version
-- is not at hand) a line, at most 150 lines a notification (under the 8000-byte limit). Rung in
-- the transaction that made the change, so a page hears of it if and only if it committed. A
-- server reads the state from the rows, never from the notification.
CREATE FUNCTION livepush_state_changed(p_topics text[], p_versions bigint[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT count(pg_notify('livepush_states', c.lines))::integer
            FROM (SELECT string_agg(u.topic || coalesce(' ' || u.version::text, ''), E'\n' ORDER BY u.ord) AS lines
                  FROM unnest(p_topics, p_versions) WITH ORDINALITY AS u(topic, version, ord)
                  GROUP BY (u.ord - 1) / 150) c);
END
$$;

-- `livepush_states`, for an enqueue of any size: one line "KIND:FIRST-LAST" saying that rows
-- with ids FIRST to LAST may have been created (at version 1). A server reads only the topics
-- in that range it watches and has no state for yet (pages waiting for a job to exist); the
-- range may hold other statements' ids too, which is harmless: the rows decide. Rings nothing
-- for an empty range (NULL bounds).
CREATE FUNCTION livepush_states_created(p_kind text, p_first bigint, p_last bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_first IS NULL OR p_last IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM pg_notify('livepush_states', p_kind || ':' || p_first || '-' || p_last);
    RETURN 1;
END
$$;

-- `livepush_states`, one line "canary TOKEN": a server's readiness check rings its own state
-- topics' channel and waits to hear it back (livepush/jobs/events/source.py: ring_canary), since
-- on the Redis fan-out nothing else shows that this channel is heard. Every server hears it;
-- only the one whose token it names counts it, and no hub reads anything for it. Writes nothing.
CREATE FUNCTION livepush_states_canary(p_token text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_notify('livepush_states', 'canary ' || p_token);
    RETURN 1;
END
$$;
