-- Claim limits and paused queues (livepush/jobs/ owns them: its statements are in
-- livepush/jobs/queries.py; docs/jobs.md "Limits and paused queues").
--
-- Only jobs whose function has a limit take the limited claim (CLAIM_LIMITED); every other job
-- keeps the plain claim.

-- The columns (limited, concurrency_key) and the plain claim's index, which leaves limited jobs
-- out, are in sql/0003_jobs.sql.

-- The limited claim's: one function's jobs of one queue, in claim order.
CREATE INDEX livepush_jobs_limited_claim_idx ON livepush_jobs (queue, name, priority, run_at, id)
    WHERE state = 'available' AND limited;

-- The running jobs of each key, counted by the limited claim. Partial: jobs without a key never
-- enter it, so the plain path pays nothing for it.
CREATE INDEX livepush_jobs_key_running_idx ON livepush_jobs (name, concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

-- One row per job name that has had a limit, written by each runtime that defines the function
-- as it starts (the newest definition wins). A definition without limits keeps the row with both
-- limits NULL rather than deleting it: jobs marked `limited` by the older definition can still
-- turn up (enqueued by a process not yet redeployed, or running when the limit went and back for
-- a retry), and only the limited claim takes them; a runtime keeps claiming the names of every
-- row its code defines, and a row without limits claims with none. The limited claims of a name
-- are serialized by the name's claim lock, not by this row (see livepush_claim_limited below).
CREATE TABLE livepush_job_limits (
    name         text PRIMARY KEY,
    -- At most this many jobs of the name running at once per concurrency key (NULL: no limit).
    max_running  integer CHECK (max_running >= 1),
    -- The parameter the concurrency key is read from (NULL: none): a start whose definition keys
    -- by another one (or gains a key) keys the name's unfinished jobs anew.
    key_param    text,
    -- The token bucket: `rate` tokens a second (NULL: no limit), at most `burst` kept; a claim
    -- takes one per job started. `tokens` is as of `refilled_at`.
    rate         double precision CHECK (rate > 0),
    burst        double precision CHECK (burst >= 1),
    tokens       double precision NOT NULL DEFAULT 0,
    refilled_at  timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50, autovacuum_vacuum_cost_delay = 0);

-- Queues no runtime claims from (jobs.pause_queue()); enqueues are still accepted. Each runtime
-- keeps the set in memory, read again when a pause or resume rings (livepush_queues_changed())
-- and at least twice a second, so a pause holds everywhere within a second without a lookup in
-- every plain claim. The limited claim also checks it itself.
CREATE TABLE livepush_paused_queues (
    queue      text PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT now()
);

-- The runtimes' doorbell with the payload `queues`: the paused set changed, read it again (and,
-- after a resume, claim). Delivered at commit, like every ring of livepush_jobs.
CREATE FUNCTION livepush_queues_changed() RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_notify('livepush_jobs', 'queues');
    RETURN 1;
END
$$;

-- The limited claim (livepush/jobs/queries.py: CLAIM_LIMITED calls it): up to p_limit available
-- jobs of p_name on p_queue, within the name's limits. Two statements, on purpose:
-- 1. Take the name's claim lock: its limits row, FOR NO KEY UPDATE. Every limited claim of the
--    name, from every runtime, does this first, so they run one at a time; the lock goes at
--    commit, once the claim's rows are visible to the next one's snapshot. A claim that finds it
--    held claims nothing and says when to try again (below). A row lock, not an advisory lock of
--    the name's hash (which wrote nothing): any login may take any advisory lock, and one holding
--    that key stopped the name's jobs in every runtime for as long as it liked, while locking a
--    row of this table takes UPDATE on it, which only livepush's roles have. The price is one
--    small WAL record per claim (the row's lock), next to the claimed rows' own.
-- 2. Claim. A volatile PL/pgSQL function's statements each take a fresh snapshot (READ
--    COMMITTED), so this one starts after the lock is held, and so after every earlier claim of
--    the name committed: its count of running jobs per key (`busy`) misses no claimed job. (A
--    lock taken inside the claim statement itself would come after that statement's snapshot,
--    and a claim committing in between would go uncounted.) Jobs leave `running` without the
--    lock (outcomes, rescue, release): a claim that still sees one running only under-fills.
-- In the claim: `room` is the jobs it may start: the slots asked for and the whole tokens of the
-- name's bucket (refilled by the time since its last claim, capped at `burst`). `candidates` are
-- available jobs of the name whose key has a free slot, from their own index (state 'available'
-- AND limited), read without row locks (claims of the name are serialized by the claim lock);
-- `eligible` keeps each key's first (free slots) of them in claim order, so a full key is
-- skipped, not waited behind. A chosen row another transaction holds is skipped too (`locked`),
-- as the plain claim skips it: a caller's transaction left open after a debounce or a cancel
-- with conn= (a web request's, under ATOMIC_REQUESTS) stopped the runtime's whole claim loop
-- until it committed. The UPDATE re-checks that each row is still available and
-- unchanged since this statement read it (its version): a cancel meanwhile leaves it out, and so
-- does a debounce that gave it new arguments, maybe a new concurrency key (this statement's
-- count and the arguments it returns are of the old ones); the next claim takes it. It re-checks
-- the concurrency key too: a start that keys the name's jobs anew (queries.py: MARK_LIMITED)
-- changes the key and not the version, which is the offset of the job's state topic and moves
-- only with what a page sees; a job it re-keyed after this statement's snapshot, counted here in
-- its old key's slots, started past its new key's limit. Safe under concurrency: the UPDATE
-- evaluates these checks on the row's newest committed version, which `locked` holds, so a key
-- changed by a transaction that committed after the snapshot leaves the job out, and one not yet
-- committed holds the row, which `locked` skips. The bucket is debited in the same statement. With no token left one
-- candidate is read, enough to tell whether the bucket holds anything back.
-- Returns one row with wait_token (seconds until the next token, when the bucket held eligible
-- jobs back, or until the next try, when the claim lock was held: the runtime sleeps that long
-- rather than spin) and the claimed jobs' columns
-- (NULL when none), then one row per further job: a row of NULLs while the queue is paused or
-- when the name has no limits row. Commits asynchronously, as the plain claim (sql/0003_jobs.sql:
-- livepush_job_lease()).
CREATE FUNCTION livepush_claim_limited(p_name text, p_queue text, p_limit integer, p_scan integer,
                                       p_runtime_id bigint)
RETURNS TABLE (wait_token double precision, id bigint, name text, queue text, priority integer, attempt integer,
               max_attempts integer, lease bigint, cancel_requested boolean, run_at timestamptz, group_id bigint,
               callback_of bigint, workflow_id bigint, version bigint, has_steps boolean, args jsonb)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Tried, not waited for: another runtime's claim of the name holds it for a millisecond or
    -- two, and a runtime starting (set_limits) for a moment, and a claim that waited would stop
    -- the runtime's whole claim loop behind it. Busy, the name is skipped this round: one row
    -- whose wait_token brings the runtime back to it shortly (the floor of its token waits),
    -- while its other names and queues are claimed meanwhile. A name without a limits row has
    -- nothing to lock: the claim below then returns its row of NULLs.
    PERFORM 1 FROM livepush_job_limits WHERE name = p_name FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM livepush_job_limits WHERE name = p_name) THEN
        wait_token := 0.01;
        RETURN NEXT;
        RETURN;
    END IF;
    RETURN QUERY
    WITH lim AS (
        SELECT l.name, l.max_running, l.rate, c.at,
               least(l.burst, l.tokens + l.rate * greatest(extract(epoch FROM c.at - l.refilled_at), 0)) AS tokens
        FROM livepush_job_limits l CROSS JOIN (SELECT clock_timestamp() AS at) c
        WHERE l.name = p_name AND NOT EXISTS (SELECT 1 FROM livepush_paused_queues WHERE queue = p_queue)
    ), room AS (
        SELECT CASE WHEN lim.rate IS NULL THEN p_limit ELSE least(p_limit, floor(lim.tokens)::int) END AS n FROM lim
    ), busy AS MATERIALIZED (
        -- One object {key: running jobs}, made once and looked up per candidate: a join with
        -- the counts was planned from the table's statistics (no job running when it was last
        -- analyzed) as a nested loop, whose pass over the hundred-odd running keys (outcomes
        -- not yet written) for each candidate cost more than the rest of the claim.
        SELECT coalesce(jsonb_object_agg(k.key, k.n), '{}') AS running FROM (
            SELECT j.concurrency_key AS key, count(*)::int AS n FROM livepush_jobs j
            WHERE j.state = 'running' AND j.name = p_name AND j.concurrency_key IS NOT NULL
              AND (SELECT max_running FROM lim) IS NOT NULL
            GROUP BY j.concurrency_key) k
    ), candidates AS (
        SELECT j.id, j.priority, j.run_at, j.concurrency_key, j.busy, j.version
        FROM (SELECT j.id, j.priority, j.run_at, j.concurrency_key, j.version,
                     coalesce(((SELECT running FROM busy) ->> j.concurrency_key)::int, 0) AS busy
              FROM livepush_jobs j
              WHERE j.state = 'available' AND j.limited AND j.queue = p_queue AND j.name = p_name) j
        WHERE EXISTS (SELECT 1 FROM lim)
          AND (j.concurrency_key IS NULL OR j.busy < coalesce((SELECT max_running FROM lim), 2147483647))
        ORDER BY j.priority, j.run_at, j.id
        -- With no token, one candidate is enough to tell whether the bucket holds anything back.
        LIMIT CASE WHEN (SELECT n FROM room) > 0 THEN p_scan ELSE 1 END
    ), eligible AS (
        SELECT c.id, c.priority, c.run_at, c.version, c.concurrency_key FROM (
            SELECT c.*, row_number() OVER (PARTITION BY c.concurrency_key ORDER BY c.priority, c.run_at, c.id) AS nth
            FROM candidates c) c
        WHERE c.concurrency_key IS NULL OR (SELECT max_running FROM lim) IS NULL
           OR c.busy + c.nth <= (SELECT max_running FROM lim)
    ), chosen AS (
        SELECT id, version, concurrency_key FROM eligible ORDER BY priority, run_at, id LIMIT coalesce((SELECT n FROM room), 0)
    ), locked AS (
        SELECT c.id, c.version, c.concurrency_key FROM chosen c JOIN livepush_jobs j ON j.id = c.id
        FOR NO KEY UPDATE OF j SKIP LOCKED
    ), claimed AS (
        UPDATE livepush_jobs j
        SET state = 'running', attempt = j.attempt + 1, runtime_id = p_runtime_id,
            lease = livepush_job_lease(), version = j.version + 1, event = 'started'
        FROM locked WHERE j.id = locked.id AND j.state = 'available' AND j.version = locked.version
          AND j.concurrency_key IS NOT DISTINCT FROM locked.concurrency_key
        RETURNING j.*
    ), took AS (
        UPDATE livepush_job_limits l SET tokens = lim.tokens - (SELECT count(*) FROM claimed), refilled_at = lim.at
        FROM lim WHERE l.name = lim.name AND l.rate IS NOT NULL
        RETURNING l.tokens, l.rate
    ), waiting AS (
        SELECT CASE WHEN t.tokens < 1 AND (SELECT count(*) FROM eligible) > (SELECT count(*) FROM chosen)
                    THEN (1 - t.tokens) / t.rate END AS wait_token
        FROM took t
    )
    SELECT w.wait_token, c.id, c.name, c.queue, c.priority, c.attempt, c.max_attempts, c.lease,
           c.cancel_requested, c.run_at, c.group_id, c.callback_of, c.workflow_id, c.version, c.has_steps, c.args
    FROM (SELECT (SELECT wait_token FROM waiting) AS wait_token) w
    LEFT JOIN (
        SELECT j.id, j.name, j.queue, j.priority, j.attempt, j.max_attempts, j.lease, j.cancel_requested,
               j.run_at, j.group_id, j.callback_of, j.workflow_id, j.version, j.has_steps, p.args
        FROM claimed j JOIN livepush_job_payloads p ON p.id = j.id
    ) c ON true
    ORDER BY c.priority, c.run_at, c.id;
END
$$;
