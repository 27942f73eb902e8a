"""Every SQL statement of the job runtime, named, with why it is safe under concurrency.

This module spells the runtime's and the API's SQL for jobs; task groups, durable jobs,
workflows and periodic jobs have their own queries.py beside their code. Tables, channels and
functions are in sql/0003_jobs.sql and the migrations after it (0005 durable, 0007 enqueue
options, 0008 claim limits). A statement that takes a batch gets it in one parameter, so a batch
of any size is one round trip. The hot ones (the enqueue: enqueue.Batch; outcomes: COMPLETE)
take one JSON document written by one call of the C encoder: psycopg dumps a list parameter an
element at a time in Python, which cost more than the statement's work in Postgres. The rest
take arrays and `unnest` them.

Fencing rule: every statement that changes a running job names its lease (`WHERE id = ... AND
lease = ... AND state = 'running'`). A claim gives each job a fresh lease, so an outcome from a
worker that lost its job (rescued, cancelled, timed out, released) matches no row and changes
nothing.

State topics: a statement that changes what `job:<id>` shows bumps the row's `version`, names
the change in `event`, and rings `livepush_state_changed()` with the topics and versions, in
the same statement: the ring is delivered only if the change commits, and it carries no state
(a server reads the row). The exceptions are the claims (CLAIM, CLAIM_LIMITED), whose
`started` the completer rings with its next statement (see CLAIM).
"""

from __future__ import annotations

# The channels of sql/0003_jobs.sql and sql/0004_groups.sql this package listens on.
READY_CHANNEL = "livepush_jobs"
CANCEL_CHANNEL = "livepush_jobs_cancel"
GROUP_PROGRESS_CHANNEL = "livepush_groups_progress"
STATE_CHANNEL = "livepush_states"

# name: ring_states_canary
# A server's readiness check (events/source.py: JobStates.ring_canary): "canary TOKEN" on the
# state topics' channel (livepush_states_canary(), sql/0003_jobs.sql), which every server hears
# and only the one that rang it counts. Writes nothing; delivered at commit, like every ring.
RING_STATES_CANARY = "SELECT livepush_states_canary(%(token)s)"

# "Still running" for the statements that look jobs up by the ids of a batch (outcomes,
# progress). Spelled so that it cannot match the partial index on running jobs: the planner
# sizes that index (and an unnested array parameter) at a few rows, and picked a nested loop
# that re-ran the unnest for every running row, quadratic in the batch. Written this way, the
# jobs are read by primary key, one lookup per array element: linear. States are lower case
# (CHECK), so this is exactly `j.state = 'running'`.
_STILL_RUNNING = "lower(j.state) = 'running'"


# A CTE body for a statement that parks or wakes jobs in `{rel}` (columns workflow_id, ...), or
# that changes a step's task group (groups/queries.py: RING_GROUPS): a workflow step among them
# shows as `waiting` or `running` again, or its batch's progress, on its run's topic, so the run
# gets a new version (livepush_workflow_touched(), sql/0006_workflows.sql). Always one row; `n` is
# negative when a run among them has finished. Runs are touched in id order, so two statements
# waking jobs of the same runs never wait for each other in a circle.
TOUCH_RUNS = """SELECT coalesce(sum(livepush_workflow_touched(t.workflow_id)), 0) AS n
    FROM (SELECT DISTINCT r.workflow_id FROM {rel} r WHERE r.workflow_id IS NOT NULL ORDER BY 1) t"""


def ring(rel: str) -> str:
    """A CTE body that rings the state topics of the jobs in `rel` (columns id, version)."""
    return (f"SELECT livepush_state_changed(array_agg('job:' || r.id ORDER BY r.id), "
            f"array_agg(r.version ORDER BY r.id)) AS n FROM {rel} r")


# The columns of a job's state topic (events/views.py: job_view), from `j` and its payload `p`. A
# `checkpoint` event names the job's latest stored checkpoint (durable/queries.py: its steps). A
# job waiting for an event has no time to run at ('infinity', which Python cannot represent).
VIEW_COLUMNS = """j.id, j.name, j.queue, j.state, j.attempt, j.max_attempts, j.version, j.event,
    nullif(j.run_at, 'infinity') AS run_at,
    p.progress, p.error, p.result, p.waiting,
    CASE WHEN j.event = 'checkpoint' THEN (
        SELECT s.name FROM livepush_job_steps s WHERE s.job_id = j.id AND s.kind = 'checkpoint'
        ORDER BY s.at DESC LIMIT 1) END AS checkpoint"""

# name: enqueue
# One statement for any number of jobs (their batch decoded by livepush_job_items(), in
# sql/0003_jobs.sql). Ids come from the sequence inside the `input` CTE, which Postgres
# materializes once (it calls a volatile function), so both inserts see the same ids, given in
# item order. New rows are invisible to claims until commit: nothing to race with. The rings (the
# new jobs' id range, created at version 1, and the runtimes' doorbell) are delivered at commit.
ENQUEUE = """
WITH input AS (
    SELECT nextval('livepush_jobs_id_seq') AS id, b.name, b.queue, b.priority,
           coalesce(b.at, now()) AS run_at, CASE WHEN b.at > now() THEN 'scheduled' ELSE 'available' END AS state,
           b.max_attempts, b.group_id, b.args, b.ord, b.tags, b.concurrency_key, b.limited
    FROM livepush_job_items(%(batch)s::jsonb) b
), jobs AS (
    INSERT INTO livepush_jobs (id, queue, name, priority, run_at, state, max_attempts, group_id, tags,
                               concurrency_key, limited)
    SELECT id, queue, name, priority, run_at, state, max_attempts, group_id, tags, concurrency_key, limited
    FROM input
), payloads AS (
    INSERT INTO livepush_job_payloads (id, args) SELECT id, args FROM input
), rung AS (
    SELECT livepush_states_created('job', min(id), max(id)) + livepush_jobs_ready() AS n FROM input
)
SELECT i.id, i.name FROM input i CROSS JOIN rung ORDER BY i.ord
"""

# A lone job's run time from its scalar parameters: `run_at` (at=), or `wait` seconds from this
# statement on the database's clock (wait=; the enqueuing machine's may be off), or NULL for now.
# livepush_job_items() (sql/0003_jobs.sql) reads a batch's the same way.
_ONE_AT = ("coalesce(%(run_at)s::timestamptz, statement_timestamp() + make_interval(secs => %(wait)s::float8))")

# name: enqueue_one
# ENQUEUE for a single job, with scalar parameters: the same rows and rings, but no JSON
# document to expand and materialize (a quarter of a lone enqueue's time on an idle server).
ENQUEUE_ONE = f"""
WITH jobs AS (
    INSERT INTO livepush_jobs AS j (queue, name, priority, run_at, state, max_attempts, group_id, tags,
                                    concurrency_key, limited)
    VALUES (%(queue)s, %(name)s, %(priority)s, coalesce({_ONE_AT}, now()),
            CASE WHEN {_ONE_AT} > now() THEN 'scheduled' ELSE 'available' END,
            %(max_attempts)s, %(group_id)s::bigint, %(tags)s::text[], %(concurrency_key)s::text, %(limited)s::boolean)
    RETURNING j.id, j.name, j.version
), payloads AS (
    INSERT INTO livepush_job_payloads (id, args) SELECT id, %(args)s::jsonb FROM jobs
)
SELECT jobs.id, jobs.name,
       livepush_state_changed(ARRAY['job:' || jobs.id], ARRAY[jobs.version]) + livepush_jobs_ready() AS _rung
FROM jobs
"""

# name: enqueue_keyed
# ENQUEUE for a batch with idempotency keys (the same document).
# Safe under concurrency: livepush_enqueue_keyed() (sql/0007_enqueue_options.sql) looks up each
# key's unfinished job and inserts the rest, in key order, on the unique index of (key, key_slot)
# over unfinished jobs, so a concurrent enqueue of a key waits for this one's transaction; if
# that committed, the waiter's insert fails, is undone, and its items are settled one at a time
# in fresh snapshots, each getting the winner's job. Rows: (id, name, created), one per item, in
# item order.
ENQUEUE_KEYED = """
SELECT k.id, k.name, k.created FROM livepush_enqueue_keyed(%(batch)s::jsonb) k ORDER BY k.ord
"""

# name: enqueue_one_keyed
# ENQUEUE_KEYED for a single job, with scalar parameters (livepush_enqueue_one_keyed(): a lookup
# and an insert on the same unique index, so the same safety under concurrency).
ENQUEUE_ONE_KEYED = f"""
SELECT k.id, k.name, k.created FROM livepush_enqueue_one_keyed(
    %(name)s, %(queue)s, %(priority)s, {_ONE_AT}, %(max_attempts)s, %(group_id)s::bigint,
    %(args)s::jsonb, %(tags)s::text[], %(key)s, %(concurrency_key)s, %(limited)s) k
"""

# name: enqueue_debounced
# One keyed job that runs `delay` seconds from now, replacing a pending job with the key (its
# arguments and run time) or queued behind a started one: livepush_enqueue_debounced()
# (sql/0007_enqueue_options.sql); concurrent enqueues of the key meet on the same unique index.
ENQUEUE_DEBOUNCED = "SELECT k.id, k.name, k.created FROM livepush_enqueue_debounced(%(batch)s::jsonb, %(delay)s) k"

# name: claim
# Safe under concurrency: FOR NO KEY UPDATE SKIP LOCKED hands each available row to exactly one
# claimer; the others skip it instead of waiting. NO KEY UPDATE, the lock the claim's UPDATE takes
# anyway: FOR UPDATE would also pass over a job whose row someone holds KEY SHARE, as
# jobs.signal(conn=) does until its caller commits (only a park waits for that: FENCE). The partial index covers only available rows
# in claim order, so the scan never wades through jobs others hold. The LIMIT is the claimer's
# free slots, never more. `excluded` holds names this runtime does not know. Jobs with limits
# (`limited`) are CLAIM_LIMITED's, and workflow steps' jobs (`workflow_id`) are
# workflows/queries.py's CLAIM_STEPS: neither is in this claim's index. Paused queues are the runtime's
# to skip (PAUSED_QUEUES): a lookup here in every claim cost the plain path about 4 % of its rate.
# The claim commits asynchronously (set_config(..., true): this transaction only; the
# uncorrelated subquery runs once, before the scan): losing it in a crash only makes the job
# run again, and its random lease (livepush_job_lease()) keeps the forgotten claim's worker
# from matching any later claim. It rings nothing: a NOTIFY here would put Postgres' notify
# queue lock on the path between a slot freeing and the next job starting. The completer rings
# the new `started` versions with its next statement (COMPLETE's `started`, or RING_STARTED).
# The claim's update of the rows CTE `picked` chose, and the columns a claimed job is run with:
# shared with the workflow steps' claim (workflows/queries.py: CLAIM_STEPS). `picked` returns
# each row as locked, which is its newest version, but the arguments (payloads) are read in the
# statement's snapshot: a job changed after that snapshot and before the lock (a debounce that
# replaced its arguments and committed meanwhile) is left available, untouched, to the next
# claim, which reads it as it is now. The version comparison is that check: the update's own scan
# reads the row as the snapshot saw it, older than the locked version exactly when it changed.
CLAIMED = """claimed AS (
    UPDATE livepush_jobs j
    SET state = 'running', attempt = j.attempt + 1, runtime_id = %(runtime_id)s,
        lease = livepush_job_lease(), version = j.version + 1, event = 'started'
    FROM picked WHERE j.id = picked.id AND j.version = picked.version
    RETURNING j.*
)"""
CLAIMED_COLUMNS = """j.id, j.name, j.queue, j.priority, j.attempt, j.max_attempts, j.lease, j.cancel_requested,
       j.run_at, j.group_id, j.callback_of, j.workflow_id, j.version, j.has_steps, p.args"""

CLAIM = f"""
WITH picked AS (
    SELECT id, version FROM livepush_jobs
    WHERE state = 'available' AND NOT limited AND workflow_id IS NULL AND queue = %(queue)s
      AND name <> ALL(%(excluded)s::text[])
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), {CLAIMED}
SELECT {CLAIMED_COLUMNS}
FROM claimed j JOIN livepush_job_payloads p ON p.id = j.id
ORDER BY j.priority, j.run_at, j.id
"""

# name: claim_limited
# CLAIM for one job name with limits (livepush_job_limits), up to `limit` jobs of `queue`: one
# statement, one round trip, committed asynchronously like CLAIM. The function
# (sql/0008_claim_limits.sql) first takes the name's claim lock, then claims in a statement of
# its own: a volatile PL/pgSQL function's statements each take a fresh snapshot, so the claim
# counts the running jobs of each key after every earlier claim of the name has committed (see
# the function for why that makes the count race-free). Always one row: `wait_token` (seconds
# until the bucket's next token, set only when it held jobs back) and, when jobs were claimed,
# one row per job with CLAIM's columns. `scan` bounds the candidates read.
CLAIM_LIMITED = """
SELECT * FROM livepush_claim_limited(%(name)s, %(queue)s, %(limit)s, %(scan)s, %(runtime_id)s)
"""

# name: lock_limits
# Taken first by a starting runtime's transaction that writes its limits (SET_LIMITS, then
# DROP_LIMITS and UNFLAG_LIMITED): each statement locks its rows in name order, but the two
# together do not (a start that adds a limit to one name and drops another's locks the first,
# then the second; one with the opposite definitions, during a rolling deploy, the other way
# round), and two such starts deadlocked, one of them failing. So starts take turns on a table
# lock: SHARE UPDATE EXCLUSIVE conflicts with itself and not with the claims' row writes, and
# needs UPDATE on the table, which only livepush's roles have (any login may take an advisory
# lock, and would have held up every runtime's start). Autovacuum, the other holder of this
# mode, cancels itself when it blocks a lock request.
LOCK_LIMITS = "LOCK TABLE livepush_job_limits IN SHARE UPDATE EXCLUSIVE MODE"

# name: set_limits
# A starting runtime's definitions of the limits of its job functions (the newest start wins).
# A new row starts with a full bucket; a changed one keeps its tokens (at most the new burst).
# Rows locked in name order, like every multi-row writer of this table; and starts take turns
# (LOCK_LIMITS), so two never wait for each other in a circle.
SET_LIMITS = """
INSERT INTO livepush_job_limits AS l (name, max_running, rate, burst, tokens, key_param)
SELECT u.name, u.max_running, u.rate, u.burst, coalesce(u.burst, 0), u.key_param
FROM unnest(%(names)s::text[], %(max_running)s::int[], %(rates)s::float8[], %(bursts)s::float8[],
            %(key_params)s::text[])
     AS u(name, max_running, rate, burst, key_param)
ORDER BY u.name
ON CONFLICT (name) DO UPDATE SET
    max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst,
    tokens = least(l.tokens, coalesce(excluded.burst, 0)), key_param = excluded.key_param
"""

# name: drop_limits
# A starting runtime's job functions that have no limits: a row with limits left by an older
# definition keeps the name with none (sql/0008_claim_limits.sql says why it is not deleted); the
# names that had limits are returned, for UNFLAG_LIMITED. Rows locked in name order, as SET_LIMITS
# locks them.
DROP_LIMITS = """
UPDATE livepush_job_limits l SET max_running = NULL, rate = NULL, burst = NULL, tokens = 0, key_param = NULL
FROM (SELECT name FROM livepush_job_limits
      WHERE name = ANY(%(names)s::text[]) AND (max_running IS NOT NULL OR rate IS NOT NULL)
      ORDER BY name FOR UPDATE) d
WHERE l.name = d.name
RETURNING l.name
"""

# name: unflag_limited
# The unfinished jobs of names whose limits were just dropped go to the plain claim, the cheaper
# one. Rare (a deploy that removes a limit), so a scan is acceptable. Jobs it misses (running
# now, back later; a claim of one meanwhile makes the re-check skip it; jobs enqueued later by
# code that still has the limit) keep the mark and the limited claim of the name, which now
# applies no limit.
UNFLAG_LIMITED = """
UPDATE livepush_jobs SET limited = false
WHERE limited AND name = ANY(%(names)s::text[]) AND state IN ('available', 'scheduled', 'waiting')
"""

# name: limited_before
# Under LOCK_LIMITS, before SET_LIMITS: which of the starting runtime's limited names already had
# limits (a row without limits has none), and the parameter their concurrency key was read from
# (NULL: no concurrency limit). A name gains limits with this start when it had none, and is keyed
# anew when its concurrency key now comes from another parameter, or where it had none (a rate
# alone marks jobs limited with no key, which no slot counts; a name whose limits were removed
# still has marked jobs, keyed by the definition before): the unfinished jobs enqueued before
# are then marked with their keys (UNMARKED_JOBS, MARK_LIMITED). Starts take turns on the lock, so
# two never both see a name as new.
LIMITED_BEFORE = """
SELECT name, key_param FROM livepush_job_limits
WHERE name = ANY(%(names)s::text[]) AND (max_running IS NOT NULL OR rate IS NOT NULL)
"""

# name: unmarked_jobs
# The unfinished jobs of names that just gained limits and were enqueued without the mark, or, of
# names keyed anew (`keyed`), every one (marked with no key, or with a key of the old parameter),
# in id order from `after`, a page at a time (of `ids` only, when given: those a first pass left):
# their concurrency keys come from their arguments, which only the function's definition (Python)
# can read. Rare (a deploy that adds a limit or changes its key), so a scan is acceptable, as for
# UNFLAG_LIMITED. Workflow steps are never limited. `limited`: the job was marked already (with a
# key of the old definition), so one whose arguments give no new key must lose that key. A plain
# read; MARK_LIMITED re-checks what it read.
UNMARKED_JOBS = """
SELECT j.id, j.name, j.version, p.args, j.limited
FROM livepush_jobs j JOIN livepush_job_payloads p USING (id)
WHERE j.name = ANY(%(names)s::text[]) AND j.workflow_id IS NULL
  AND (NOT j.limited OR j.name = ANY(%(keyed)s::text[]))
  AND j.state IN ('available', 'scheduled', 'waiting', 'running') AND j.id > %(after)s
  AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
ORDER BY j.id
LIMIT %(page)s
"""

# name: mark_limited
# Marks them, with their keys: the limited claim takes them from now on, and a running one counts
# in its key's slots until it ends (a retry comes back marked). Returns the jobs it marked; the
# caller reads the others again. SKIP LOCKED: a row another transaction holds is left, never
# waited for. Completers lock a batch's rows in the order the jobs ended, and releases in no
# order: a start that waited for one of them while holding rows it had marked, which that batch
# then waited for, deadlocked, and its runtime failed to start. Each locked row is re-checked on
# its newest version: the version check leaves a job that changed after it was read (a debounce
# that replaced its arguments, a claim, an outcome) to be read again, and the state check a job
# that ended (a job enqueued since was never read). The version is not raised: nothing `job:<id>`
# shows changes; a limited claim that read the job before re-checks its key instead
# (sql/0008_claim_limits.sql).
MARK_LIMITED = """
WITH target AS (
    SELECT j.id, u.key
    FROM livepush_jobs j
    JOIN unnest(%(ids)s::bigint[], %(versions)s::bigint[], %(keys)s::text[]) AS u(id, version, key) ON j.id = u.id
    WHERE j.version = u.version
      AND j.state IN ('available', 'scheduled', 'waiting', 'running')
    ORDER BY j.id
    FOR NO KEY UPDATE OF j SKIP LOCKED
)
UPDATE livepush_jobs j SET limited = true, concurrency_key = t.key
FROM target t WHERE j.id = t.id
RETURNING j.id
"""

# name: limited_names
# The names that take the limited claim, rows without limits too (`dropped`), as a plain read;
# each runtime re-reads it every beat.
LIMITED_NAMES = "SELECT name, max_running IS NULL AND rate IS NULL AS dropped FROM livepush_job_limits"

# name: pause_queue
# Idempotent; the first pause's time is kept. Rings the runtimes (delivered at commit) so each
# reads the paused set again before its next claim; a runtime that misses the ring reads it
# within half a second anyway (runtime.PAUSED_REFRESH_SECONDS).
PAUSE_QUEUE = """
WITH added AS (
    INSERT INTO livepush_paused_queues (queue) VALUES (%(queue)s) ON CONFLICT (queue) DO NOTHING
    RETURNING queue
)
SELECT queue, livepush_queues_changed() AS _rang FROM added
"""

# name: resume_queue
# Rings the runtimes (delivered at commit) when the queue was paused: each reads the paused set
# again and idle ones claim from the queue at once rather than at their next poll.
RESUME_QUEUE = """
WITH gone AS (DELETE FROM livepush_paused_queues WHERE queue = %(queue)s RETURNING queue)
SELECT queue, livepush_queues_changed() AS _rang FROM gone
"""

# name: paused_queues
# The paused set, as a runtime keeps it (a plain read of a table that is almost always empty).
PAUSED_QUEUES = "SELECT queue FROM livepush_paused_queues"

# The payload of a doorbell ring that says the paused set changed (livepush_queues_changed()).
QUEUES_RING = "queues"

# The `started` versions of the jobs a runtime claimed, rung (livepush_state_changed()) from
# %(started)s: one JSON text, [[job id, version], ...], as the completer writes it. The two
# aggregates read the same rows in the same order, so topics and versions stay paired.
_STARTED_RING = """(SELECT livepush_state_changed(array_agg('job:' || (s.j ->> 0)), array_agg((s.j ->> 1)::bigint))
 FROM jsonb_array_elements(%(started)s::jsonb) AS s(j))"""

# name: ring_started
# The `started` versions of jobs this runtime claimed, rung when no outcome statement goes out
# to carry them (long jobs). Rings only; a version a later change superseded is harmless (a
# server reads the row and sends nothing older than it sent).
RING_STARTED = f"""
SELECT {_STARTED_RING}
"""

# name: complete
# One statement for a batch of outcomes. Fenced: a row changes only if it is still running
# under the lease the outcome names; the rest (rescued, cancelled, released elsewhere) are left
# alone and missing from the result, which the completer logs. The UPDATE locks each row, so a
# concurrent rescue or cancel of the same job either runs first (and this misses it) or waits
# for this one (and then finds it finished).
# kind: succeeded | retry (failed, may retry) | fail (failed for good) | cancelled | released
# A released job (draining runtime, unknown name, a workflow step that asked to be run again
# later: its delay) gives its attempt back: it is `enqueued` again (`retrying` if it had run before).
# The outcomes come as one JSON text, [[id, lease, kind, error, delay, progress, result], ...]
# (progress an object or null, result its JSON text or null), written by one call of the C
# encoder: psycopg dumps array parameters an element at a time in Python, which was a good
# part of the runtime's CPU per job.
_COMPLETE_CTES = f"""
WITH outcome AS (
    SELECT (u.j ->> 0)::bigint AS id, (u.j ->> 1)::bigint AS lease, u.j ->> 2 AS kind, u.j ->> 3 AS error,
           (u.j ->> 4)::float8 AS delay, nullif(u.j -> 5, 'null') AS progress, (u.j ->> 6)::jsonb AS result
    FROM jsonb_array_elements(%(outcomes)s::jsonb) AS u(j)
), moved AS (
    UPDATE livepush_jobs j SET
        state = CASE
            WHEN o.kind = 'succeeded' THEN 'succeeded'
            WHEN j.cancel_requested OR o.kind = 'cancelled' THEN 'cancelled'
            WHEN o.kind = 'released' THEN CASE WHEN o.delay > 0 THEN 'scheduled' ELSE 'available' END
            WHEN o.kind = 'retry' AND j.attempt < j.max_attempts THEN 'scheduled'
            ELSE 'failed' END,
        event = CASE
            WHEN o.kind = 'succeeded' THEN 'succeeded'
            WHEN j.cancel_requested OR o.kind = 'cancelled' THEN 'cancelled'
            WHEN o.kind = 'released' THEN CASE WHEN j.attempt > 1 THEN 'retrying' ELSE 'enqueued' END
            WHEN o.kind = 'retry' AND j.attempt < j.max_attempts THEN 'retrying'
            ELSE 'failed' END,
        run_at = CASE
            WHEN o.kind = 'retry' AND NOT j.cancel_requested AND j.attempt < j.max_attempts
                THEN now() + make_interval(secs => o.delay)
            WHEN o.kind = 'released' THEN now() + make_interval(secs => o.delay)
            ELSE j.run_at END,
        attempt = CASE WHEN o.kind = 'released' THEN j.attempt - 1 ELSE j.attempt END,
        finished_at = CASE
            WHEN o.kind IN ('succeeded', 'cancelled', 'fail') OR j.cancel_requested
                 OR (o.kind = 'retry' AND j.attempt >= j.max_attempts) THEN now() END,
        lease = NULL, runtime_id = NULL, version = j.version + 1
    FROM outcome o JOIN livepush_job_payloads p ON p.id = o.id
    WHERE j.id = o.id AND j.lease = o.lease AND {_STILL_RUNNING}
    -- Each job's payload as `written` leaves it, computed here from the row read, so no later
    -- step joins `moved` back to anything: the planner cannot size a CTE, and a nested loop
    -- over two copies of it is quadratic in the batch. The state row's lock, taken here,
    -- orders this against every other payload writer (they lock it first too). (In RETURNING,
    -- j is the new version of the row.)
    RETURNING j.id, j.state, j.group_id, j.workflow_id, j.version, o.kind AS kind,
              -- A job given back starts over at the attempt it gave back: the progress of the
              -- run it gave back, stored with that attempt, would show as the next run's.
              CASE WHEN o.kind = 'released' THEN NULL ELSE coalesce(o.progress, p.progress) END AS progress,
              CASE WHEN j.state = 'succeeded' THEN NULL ELSE coalesce(o.error, p.error) END AS error,
              CASE WHEN j.state = 'succeeded' THEN o.result END AS result,
              -- Write the payload only when it changes (a final progress, an error to keep or to
              -- clear, a result): most jobs succeed with none, and rewriting their row (arguments
              -- and all) would cost a row version and its WAL for nothing.
              (o.progress IS NOT NULL AND o.progress IS DISTINCT FROM p.progress
               OR o.kind = 'released' AND p.progress IS NOT NULL
               OR CASE WHEN j.state = 'succeeded' THEN p.error IS NOT NULL OR o.result IS NOT NULL
                       ELSE o.error IS NOT NULL AND o.error IS DISTINCT FROM p.error END) AS _write
), written AS (
    UPDATE livepush_job_payloads p SET error = m.error, progress = m.progress, result = m.result
    FROM moved m
    WHERE p.id = m.id AND m._write
), rung AS (
    -- The outcomes' versions, and the `started` versions of jobs claimed since the last batch that
    -- are not among them (a job's final ring makes its `started` one pointless). And the runtimes'
    -- doorbell when a job is available again (given back, at once): as an enqueue rings it, or
    -- idle runtimes would find it only at their next poll.
    SELECT livepush_state_changed(array_agg('job:' || r.id ORDER BY r.id), array_agg(r.version ORDER BY r.id))
           + {_STARTED_RING}
           + CASE WHEN bool_or(r.state = 'available') THEN livepush_jobs_ready() ELSE 0 END AS n
    FROM moved r
)
"""
COMPLETE = _COMPLETE_CTES + """
SELECT m.id, m.state, m.group_id, m.kind FROM moved m CROSS JOIN rung ORDER BY m.id
"""

# name: write_progress
# Fenced like COMPLETE. The UPDATE of the state rows (a new version) makes a concurrent rescue
# or completion of the same job wait for this write (or this one wait for it), so a stale
# worker's progress never lands after another attempt took the job.
WRITE_PROGRESS = f"""
WITH u AS (
    SELECT * FROM unnest(%(ids)b::bigint[], %(leases)b::bigint[], %(progress)b::jsonb[]) AS u(id, lease, progress)
), live AS (
    UPDATE livepush_jobs j SET version = j.version + 1, event = 'progress'
    FROM u WHERE j.id = u.id AND j.lease = u.lease AND {_STILL_RUNNING}
    RETURNING j.id, j.version, u.progress
), written AS (
    UPDATE livepush_job_payloads p SET progress = live.progress FROM live WHERE p.id = live.id
), rung AS ({ring("live")})
SELECT live.id FROM live CROSS JOIN rung
"""

# name: promote_scheduled
# Makes due scheduled jobs available, and waiting jobs whose time came (a durable sleep that ended,
# a signal wait that timed out: they run again and find out which). SKIP LOCKED: two runtimes
# promoting at once split the rows instead of queueing on each other's locks; a row being parked
# right now is skipped and seen by the next round (NO KEY UPDATE, as CLAIM: a signal's open
# transaction does not hold it up). The UPDATE re-checks the state,
# so a row another statement moved meanwhile is left alone. Rings the runtimes' doorbell
# (delivered at commit) when anything moved.
PROMOTE_SCHEDULED = f"""
WITH due AS (
    SELECT id FROM livepush_jobs
    WHERE state IN ('scheduled', 'waiting') AND run_at <= now()
    ORDER BY run_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), moved AS (
    UPDATE livepush_jobs j SET state = 'available', version = j.version + 1,
        event = CASE WHEN j.state = 'waiting' THEN 'enqueued' ELSE j.event END
    FROM due WHERE j.id = due.id AND j.state IN ('scheduled', 'waiting')
    RETURNING j.id, j.version, j.workflow_id
), rung AS ({ring("moved")}
), run AS ({TOUCH_RUNS.format(rel="moved")})
SELECT count(*) AS n, CASE WHEN count(*) > 0 THEN livepush_jobs_ready() END AS _rang
FROM moved CROSS JOIN rung CROSS JOIN run
"""

# name: next_scheduled
NEXT_SCHEDULED = """
SELECT extract(epoch FROM min(run_at) - now()) FROM livepush_jobs
WHERE state IN ('scheduled', 'waiting') AND run_at < 'infinity'
"""

# name: register_runtime
REGISTER_RUNTIME = """
INSERT INTO livepush_job_runtimes (host, pid, node, queues, concurrency, heartbeat, periodic)
VALUES (%(host)s, %(pid)s, %(node)s, %(queues)s, %(concurrency)s, %(heartbeat)s, %(periodic)s)
RETURNING id
"""

# name: live_runtimes_scheduling
# jobs.forget_periodic(): the live runtimes (beaten within three of their beats) that schedule the
# periodic job %(name)s (their `periodic` column), with where they run, for its refusal.
# A plain read.
LIVE_RUNTIMES_SCHEDULING = """
SELECT id, host, pid FROM livepush_job_runtimes
WHERE %(name)s = ANY (periodic) AND heartbeat_at > now() - make_interval(secs => 3 * heartbeat)
ORDER BY id
"""

# name: live_runtimes_serving
# The first enqueue in a process of a job defined in a script run directly (`__main__.fn`, which
# no runtime started with `livepush jobs MODULE` defines) on a queue: how many live runtimes of
# other processes serve that queue (beaten within three of their beats). A plain read.
LIVE_RUNTIMES_SERVING = """
SELECT count(*) FROM livepush_job_runtimes
WHERE %(queue)s = ANY (queues) AND heartbeat_at > now() - make_interval(secs => 3 * heartbeat)
  AND NOT (host = %(host)s AND pid = %(pid)s)
"""

# name: runtimes_on_node
# The other runtimes registered on this node (same boot and pid namespace): the starting runtime
# checks whether their processes still exist. A plain read.
RUNTIMES_ON_NODE = "SELECT id, pid FROM livepush_job_runtimes WHERE node = %(node)s AND id <> %(id)s"

# name: prune_runtime
# A runtime whose process is gone from this node. Deleted only if the row still names that
# process (a re-registration under the same id by a live process is left alone); its jobs are
# then released by RESCUE_ORPHANS, like those of a runtime that stopped beating.
PRUNE_RUNTIME = "DELETE FROM livepush_job_runtimes WHERE id = %(id)s AND node = %(node)s AND pid = %(pid)s"

# name: reregister_runtime
# A runtime that stalled past three beats was pruned; it comes back under its old id (ON
# CONFLICT: a beat racing another re-register is harmless). Its old jobs were released and their
# leases are gone, so whatever it still finishes is fenced off.
REREGISTER_RUNTIME = """
INSERT INTO livepush_job_runtimes (id, host, pid, node, queues, concurrency, heartbeat, state, in_hand, periodic)
VALUES (%(id)s, %(host)s, %(pid)s, %(node)s, %(queues)s, %(concurrency)s, %(heartbeat)s, %(state)s, %(in_hand)s,
        %(periodic)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
RETURNING heartbeat_at
"""

# name: beat
# Returns the beat's time on the database's clock, which the runtime's rescue compares with.
BEAT = """
UPDATE livepush_job_runtimes SET heartbeat_at = now(), state = %(state)s, in_hand = %(in_hand)s
WHERE id = %(id)s
RETURNING heartbeat_at
"""

# name: deregister_runtime
DEREGISTER_RUNTIME = "DELETE FROM livepush_job_runtimes WHERE id = %(id)s"

# name: set_runtime_queues
# drain() without queues= drains whichever queues have due jobs, read anew each round: its row
# names them, as a runtime's names the queues it serves.
SET_RUNTIME_QUEUES = "UPDATE livepush_job_runtimes SET queues = %(queues)s WHERE id = %(id)s"

# name: prune_dead_runtimes
# A runtime is dead when silent for three of its own beats while it could have beaten: silence
# before this server started (a restart, a crash, a failover to another server) or before the
# pruning runtime's own contact came back (%(since)s: the beat that ended its last spell of
# failed beats; NULL when it had none) was an outage every runtime shared, and a live runtime's
# jobs taken then would run twice at once, their attempt spent. greatest() skips the NULL.
# Nor does a pruning runtime (%(runtime_id)s) whose own last beat is more than two of its beats
# old prune anyone: its loop was held up (a job's CPU-heavy step) since the beat that started this
# rescue, and its own silence, or that of runtimes held up with it, would be taken for death; its
# next beat sees the gap and sets `since`. Nor one whose last beat is newer than the beat that
# started this rescue (%(beat_at)s, NULL: not checked): that rescue waited (for a connection
# through an outage, or held up with the loop), and the newer beat may have ended a spell without
# contact, which the `since` of the older one does not say. It reads only its own row, which only
# it updates (a prune that deleted it meanwhile leaves it pruning nobody until its next beat
# registers it again). DELETE locks each row, so two runtimes pruning at once delete each dead
# row once; the loser finds nothing.
PRUNE_DEAD_RUNTIMES = """
DELETE FROM livepush_job_runtimes
WHERE greatest(heartbeat_at, pg_postmaster_start_time(), %(since)s::timestamptz)
      < now() - make_interval(secs => heartbeat * 3)
  AND EXISTS (SELECT 1 FROM livepush_job_runtimes me
              WHERE me.id = %(runtime_id)s AND me.heartbeat_at >= now() - make_interval(secs => me.heartbeat * 2)
                AND me.heartbeat_at <= coalesce(%(beat_at)s::timestamptz, me.heartbeat_at))
RETURNING id
"""

# name: orphans
# The running jobs RESCUE_ORPHANS would release now, with what their retry's backoff depends on:
# whether their last attempt ended in a rescue too (its error is still the rescue's, %(error)s).
# A plain read: RESCUE_ORPHANS checks each again under its row lock.
ORPHANS = """
SELECT j.id, j.name, j.attempt, p.error IS NOT DISTINCT FROM %(error)s AS rescued_before
FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
WHERE j.state = 'running' AND j.runtime_id IS DISTINCT FROM %(runtime_id)s
  AND NOT EXISTS (SELECT 1 FROM livepush_job_runtimes r WHERE r.id = j.runtime_id)
ORDER BY j.id
"""

# name: rescue_orphans
# Releases running jobs whose runtime has no row (pruned above, or claimed by a runtime that was
# pruned mid-claim), counting the attempt: back to available, or failed when that was the last
# attempt. Runs after PRUNE_DEAD_RUNTIMES committed, so a runtime's row is there (alive,
# registered before it claimed) or was pruned; a pruned runtime that was only held up registers
# again under its id at its next beat, and what it reports for a job released here is fenced off
# by the job's lease. Row locks order this against a late completion of the same job: whichever
# comes second finds the state or lease changed and does nothing. Never the rescuing runtime's
# own jobs (%(runtime_id)s): one that was pruned while held up claims again before its next beat
# registers it again, and its own rescue released those claims while it ran them, which then ran
# twice; another runtime's rescue in that moment still releases them (docs/jobs.md).
# Only the jobs ORPHANS read (%(ids)s), each still at the attempt it read (%(attempts)s), due
# again after %(delays)s seconds (0 for a first rescue; maintenance.rescue says why); a job
# orphaned since is the next beat's to release.
RESCUE_ORPHANS = f"""
WITH read AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(delays)s::float8[]) AS r(id, attempt, delay)
), orphans AS (
    SELECT j.id, read.delay FROM livepush_jobs j JOIN read ON read.id = j.id AND read.attempt = j.attempt
    WHERE j.state = 'running' AND j.runtime_id IS DISTINCT FROM %(runtime_id)s
      AND NOT EXISTS (SELECT 1 FROM livepush_job_runtimes r WHERE r.id = j.runtime_id)
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
), moved AS (
    UPDATE livepush_jobs j SET
        state = CASE WHEN j.cancel_requested THEN 'cancelled'
                     WHEN j.attempt >= j.max_attempts THEN 'failed'
                     WHEN orphans.delay > 0 THEN 'scheduled'
                     ELSE 'available' END,
        event = CASE WHEN j.cancel_requested THEN 'cancelled'
                     WHEN j.attempt >= j.max_attempts THEN 'failed'
                     ELSE 'retrying' END,
        finished_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN now() END,
        run_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN now()
                      ELSE now() + make_interval(secs => orphans.delay) END,
        lease = NULL, runtime_id = NULL, version = j.version + 1
    FROM orphans WHERE j.id = orphans.id
    RETURNING j.id, j.state, j.queue, j.group_id, j.workflow_id, j.version
), payload AS (
    UPDATE livepush_job_payloads p SET error = %(error)s FROM moved j WHERE p.id = j.id
), rung AS ({ring("moved")})
SELECT m.id, m.state, m.queue, m.group_id, m.workflow_id, %(error)s AS error,
       CASE WHEN count(*) OVER () > 0 THEN livepush_jobs_ready() END AS _rang
FROM moved m CROSS JOIN rung
ORDER BY m.id
"""

# name: cancel_requests_for
# Running jobs of this runtime whose cancel was requested, or whose workflow step ended without
# them (livepush_workflow_job_stopped(), sql/0006_workflows.sql: STOP_JOBS skipped their busy
# row), among `ids` (the ones a notification named) or all of them (the heartbeat's fallback for
# a missed notification). Read from the rows: a notification alone never cancels anything.
CANCEL_REQUESTS_FOR = """
SELECT id FROM livepush_jobs
WHERE state = 'running' AND runtime_id = %(runtime_id)s
  AND (cancel_requested OR (workflow_id IS NOT NULL AND livepush_workflow_job_stopped(id)))
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
"""

# name: release_all_of_runtime
# At deregistration: anything still running under this runtime's id goes back with its attempt
# given back (a drain did not spend it). Fenced by runtime_id and state. After a claim failed, the
# same but for the jobs the runtime knows (`keep`): only its own producer claims for it, and it
# runs this between claims, so a job running under its id is in `keep` or was claimed by a
# statement whose reply never came; a job of `keep` that ends meanwhile is no longer `running`.
# The producer runs it after a failed claim and every minute or so (runtime.py: RECONCILE_SECONDS):
# an index scan of livepush_jobs_running_idx (runtime_id, on running rows only, sql/0003_jobs.sql),
# so that each run reads this runtime's running jobs, not the table.
RELEASE_ALL_OF_RUNTIME = f"""
WITH moved AS (
    UPDATE livepush_jobs j SET
        state = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'available' END,
        event = CASE WHEN j.cancel_requested THEN 'cancelled' WHEN j.attempt > 1 THEN 'retrying'
                     ELSE 'enqueued' END,
        finished_at = CASE WHEN j.cancel_requested THEN now() END,
        attempt = j.attempt - 1, run_at = now(), lease = NULL, runtime_id = NULL, version = j.version + 1
    WHERE j.state = 'running' AND j.runtime_id = %(runtime_id)s AND j.id <> ALL(%(keep)s::bigint[])
    RETURNING j.id, j.state, j.group_id, j.workflow_id, j.version
), cleared AS (
    -- A job given back runs its attempt again: the given-back run's progress, stored with that
    -- attempt (events/views.py), would show as the next run's. The job's row, locked above,
    -- orders this against every other payload writer.
    -- A cancelled one keeps how far it got, as a final state.
    UPDATE livepush_job_payloads p SET progress = NULL
    FROM moved m WHERE p.id = m.id AND m.state = 'available' AND p.progress IS NOT NULL
), rung AS ({ring("moved")}
), ready AS (
    -- The runtimes' doorbell, for the jobs available again (as COMPLETE rings it).
    SELECT CASE WHEN bool_or(m.state = 'available') THEN livepush_jobs_ready() END AS _rang FROM moved m
)
SELECT m.id, m.state, m.group_id, m.workflow_id FROM moved m CROSS JOIN rung CROSS JOIN ready ORDER BY m.id
"""

# name: cancel
# A queued or waiting job is cancelled on the spot; a running one is flagged and its runtime told
# (livepush_jobs_cancel_requested(), delivered at commit). The row lock orders this against a
# claim (SKIP LOCKED claimers skip a row being cancelled), against completion, and against a park
# or a wake (both lock the row); NO KEY UPDATE, as CLAIM, so a signal's open transaction (KEY
# SHARE) does not hold it up. The children a waiting job waits for are cancelled after
# commit (api/control.py).
CANCEL = f"""
WITH target AS (
    SELECT id, state FROM livepush_jobs WHERE id = %(id)s FOR NO KEY UPDATE
), moved AS (
    UPDATE livepush_jobs j SET
        state = CASE WHEN t.state <> 'running' THEN 'cancelled' ELSE j.state END,
        event = CASE WHEN t.state <> 'running' THEN 'cancelled' ELSE j.event END,
        version = CASE WHEN t.state <> 'running' THEN j.version + 1 ELSE j.version END,
        finished_at = CASE WHEN t.state <> 'running' THEN now() ELSE j.finished_at END,
        cancel_requested = (t.state = 'running')
    FROM target t
    WHERE j.id = t.id AND t.state IN ('available', 'scheduled', 'waiting', 'running')
    RETURNING j.id, j.state, j.group_id, j.workflow_id, j.version
), rung AS ({ring("(SELECT * FROM moved WHERE state = 'cancelled')")}
), told AS (
    SELECT livepush_jobs_cancel_requested(array_agg(id)) AS n FROM moved WHERE state = 'running'
)
SELECT m.id, m.state, m.group_id, m.workflow_id FROM moved m CROSS JOIN rung CROSS JOIN told
"""

# name: cancel_lone_queued
# jobs.cancel_tagged()'s first pass: of these ids, the queued jobs (available or scheduled) that
# CANCEL would end with nothing more to do (no group to count them in, no workflow run to record
# them on, no stored durable steps, hence no children, to cancel after it), cancelled in one
# statement, as CANCEL cancels each. Every other job, and any row this skips, is left to CANCEL,
# one at a time. SKIP LOCKED: a row busy now (being claimed, or cancelled by another call) is
# skipped rather than waited for, so this never waits on a lock and cannot deadlock with a claim,
# a completer or another cancel whatever order they lock rows in. The lock re-checks the state on
# the row's latest version (READ COMMITTED): a job claimed and committed meanwhile is running
# and no longer matches.
CANCEL_LONE_QUEUED = f"""
WITH target AS (
    SELECT id FROM livepush_jobs
    WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('available', 'scheduled')
      AND group_id IS NULL AND callback_of IS NULL AND workflow_id IS NULL AND NOT has_steps
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
), moved AS (
    UPDATE livepush_jobs j SET state = 'cancelled', event = 'cancelled', version = j.version + 1,
                               finished_at = now(), cancel_requested = false
    FROM target t WHERE j.id = t.id
    RETURNING j.id, j.version
), rung AS ({ring("moved")})
SELECT m.id FROM moved m CROSS JOIN rung
"""

# name: stop_jobs
# The jobs of workflow steps still active when their run ended (workflows/engine.py), in the
# transaction that ended it, which holds the run's row: a queued or parked one is cancelled, a
# running one flagged and told (as CANCEL does). SKIP LOCKED, because the lock order is job rows
# before workflow rows: a job whose row is busy right now (its outcome or progress being written,
# a checkpoint, a park, a claim) is left alone here. Its runtimes are told too: they read it after
# this commits (CANCEL_REQUESTS_FOR), see that its step no longer runs it, and stop it if it runs;
# its end, recorded on the run afterwards, changes nothing there. NO KEY UPDATE, as CANCEL: a
# signal's key-share lock (jobs.signal, held until its caller commits with conn=) is no busy row,
# and FOR UPDATE passed over a parked job it held, which no runtime runs to be told, so the job
# stayed parked for ever in a run that had ended.
STOP_JOBS = f"""
WITH target AS (
    SELECT id, state FROM livepush_jobs
    WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('available', 'scheduled', 'waiting', 'running')
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
), moved AS (
    UPDATE livepush_jobs j SET
        state = CASE WHEN t.state = 'running' THEN 'running' ELSE 'cancelled' END,
        event = CASE WHEN t.state = 'running' THEN j.event ELSE 'cancelled' END,
        version = CASE WHEN t.state = 'running' THEN j.version ELSE j.version + 1 END,
        finished_at = CASE WHEN t.state = 'running' THEN j.finished_at ELSE now() END,
        cancel_requested = true
    FROM target t WHERE j.id = t.id
    RETURNING j.id, j.state, j.version
), rung AS ({ring("(SELECT * FROM moved WHERE state = 'cancelled')")}
), told AS (
    SELECT livepush_jobs_cancel_requested(array_agg(u.id ORDER BY u.id)) AS n
    FROM unnest(%(ids)s::bigint[]) AS u(id)
    WHERE NOT EXISTS (SELECT 1 FROM moved m WHERE m.id = u.id AND m.state = 'cancelled')
)
-- Not joined with `moved`: when every row was busy it is empty, and a join would never read `told`.
SELECT rung.n AS rung, told.n AS told FROM rung CROSS JOIN told
"""

# name: job_group (retry_failed refuses a failed group member: its failure is counted in its
# group; and a failed workflow step's job: its failure ended its run). A plain read. Neither
# group_id nor workflow_id of a job ever changes; its state may, after this read: a job read as
# not failed answers False (it was not failed then) and is never written, so a member that fails
# meanwhile is not retried; one read as failed stays failed (nothing retries a member or a
# step's job). Its name and queue too: retry_failed marks the job for the claim its function's
# definition asks for now (neither changes once a job has failed: a debounce replaces only
# pending jobs).
JOB_GROUP = "SELECT group_id, workflow_id, state, name, queue FROM livepush_jobs WHERE id = %(id)s"

# name: job_args
# A job's arguments, which retry_failed reads a concurrency key from. A plain read: a failed job's
# arguments never change (a debounce replaces only pending jobs' arguments).
JOB_ARGS = "SELECT args FROM livepush_job_payloads WHERE id = %(id)s"

# name: retry_failed
# A failed job gets a fresh set of attempts and runs again now. Only from 'failed'; the row lock
# makes two concurrent retries re-queue it once. A job with an idempotency key stays failed when
# another unfinished job holds its key, in any place (sql/0007_enqueue_options.sql: a debounce
# may have queued one behind it): that job is the key's run now. The retried job takes the key's
# first place, as a new enqueue's job would: an enqueue of the key into that place that this
# statement's snapshot does not show (uncommitted, or committed since) then meets it on the key's
# unique index, where this update waits for that transaction and fails with a unique violation if
# it committed; the caller answers False for it (control.retry_failed). Left in a later place (a
# job a debounce had queued behind another), the retried job met no one there, and the key got two
# unfinished jobs. One is not met: a debounce that queues a job behind a started one (a later
# place) and commits after that one ended and after this statement; the key then gets two pending
# jobs, the race docs/jobs.md "Enqueue options" accepts for plain enqueues too.
# Queued again, the job is marked for the claim as an enqueue marks it, by the caller's definition
# of its function (`limited`, `concurrency_key`; NULL `limited`: the caller does not define it,
# and the mark stays): a start marks only the unfinished jobs, so the mark a job failed with
# predates any deploy since, which may have added a limit, keyed it by another parameter, or
# removed it.
RETRY_FAILED = f"""
WITH moved AS (
    UPDATE livepush_jobs j SET state = 'available', attempt = 0, run_at = now(), finished_at = NULL,
                               cancel_requested = false, version = j.version + 1, event = 'enqueued',
                               key_slot = 0, limited = coalesce(%(limited)s::boolean, j.limited),
                               concurrency_key = CASE WHEN %(limited)s::boolean IS NULL THEN j.concurrency_key
                                                      ELSE %(concurrency_key)s::text END
    WHERE j.id = %(id)s AND j.state = 'failed'
      AND (j.key IS NULL OR NOT EXISTS (
          SELECT 1 FROM livepush_jobs o
          WHERE o.key = j.key
            AND o.state IN ('available', 'scheduled', 'running', 'waiting')))
    RETURNING j.id, j.version
), cleared AS (
    -- The failed run's progress is not the new run's: its attempts count from 1 again, so the
    -- attempt stored with that progress (events/views.py) would match the new run's and show it
    -- as current. The job's row, locked above, orders this against every other payload writer.
    UPDATE livepush_job_payloads p SET progress = NULL FROM moved m WHERE p.id = m.id AND p.progress IS NOT NULL
), rung AS ({ring("moved")})
SELECT m.id, livepush_jobs_ready() AS _rang FROM moved m CROSS JOIN rung
"""

# Every statement that deletes jobs ends with this: the jobs it deleted (a CTE `gone (id)`) take
# their payloads, durable steps, unread signals and signal keys with them, in the same statement (no foreign
# key cascades it: sql/0003_jobs.sql). Returns the deleted ids.
DELETE_PAYLOADS_OF_GONE = """
, payloads AS (
    DELETE FROM livepush_job_payloads p USING gone g WHERE p.id = g.id
), steps AS (
    DELETE FROM livepush_job_steps s USING gone g WHERE s.job_id = g.id
), signals AS (
    DELETE FROM livepush_job_signals s USING gone g WHERE s.job_id = g.id
), signal_keys AS (
    DELETE FROM livepush_job_signal_keys k USING gone g WHERE k.job_id = g.id
)
SELECT id FROM gone
"""

# name: discard_failed
# Deletes a failed job and its payload. Only from 'failed': the row lock makes a concurrent
# retry_failed either win (nothing deleted) or wait and find the job gone.
DISCARD_FAILED = """
WITH gone AS (
    DELETE FROM livepush_jobs WHERE id = %(id)s AND state = 'failed' RETURNING id
)""" + DELETE_PAYLOADS_OF_GONE

# name: job_states
# The state topics of jobs (a plain read; each row is one consistent version).
JOB_STATES = f"""
SELECT {VIEW_COLUMNS} FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
WHERE j.id = ANY(%(ids)s::bigint[])
"""

# name: job_infos
# JOB_STATES plus what only jobs.get_job() shows: the job's tags, priority and arguments, which state topics
# never show (a server reading states for pages does not read them). A plain read.
JOB_INFOS = f"""
SELECT {VIEW_COLUMNS}, j.tags, j.priority, p.args FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
WHERE j.id = ANY(%(ids)s::bigint[])
"""

# name: tagged_ids
# The ids of jobs with a tag, newest first (unfinished ones only when `unfinished`), through the
# tags index; those older than the page cursor `before` (jobs.list_tagged(before=); the largest
# bigint when the call gave none). A plain read: a job enqueued or finished meanwhile may or may
# not be listed.
TAGGED_IDS = """
SELECT id FROM livepush_jobs
WHERE tags IS NOT NULL AND tags @> ARRAY[%(tag)s::text] AND id < %(before)s::bigint
  AND (NOT %(unfinished)s OR state IN ('available', 'scheduled', 'running', 'waiting'))
ORDER BY id DESC
LIMIT %(limit)s
"""

# name: tagged_jobs
# jobs.list_tagged(): TAGGED_IDS's jobs with JOB_INFOS's columns, in one statement, so the tag's
# filter and the rows shown come from one snapshot (two reads listed a job that finished between
# them under `unfinished`, in its finished state). A plain read.
TAGGED_JOBS = f"""
SELECT {VIEW_COLUMNS}, j.tags, j.priority, p.args
FROM ({TAGGED_IDS}) t JOIN livepush_jobs j ON j.id = t.id JOIN livepush_job_payloads p ON p.id = j.id
ORDER BY j.id DESC
"""

# name: failed_jobs
# jobs.list_failed(): failed jobs with JOB_INFOS's columns, newest first, of one queue or function
# when given, older than the page cursor `before` (jobs.list_failed(before=); the largest bigint
# when the call gave none). A plain read, through livepush_jobs_failed_idx (sql/0003_jobs.sql) down
# from the newest failed job (or the cursor): it reads failed jobs only, however many finished
# ones retention keeps around them.
FAILED_JOBS = f"""
SELECT {VIEW_COLUMNS}, j.tags, j.priority, p.args
FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
WHERE j.state = 'failed' AND j.id < %(before)s::bigint AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(name)s::text IS NULL OR j.name = %(name)s::text)
ORDER BY j.id DESC
LIMIT %(limit)s
"""

# name: queues_with_due_jobs (tests: drain)
QUEUES_WITH_DUE_JOBS = "SELECT DISTINCT queue FROM livepush_jobs WHERE state = 'available'"

# name: clear (tests only): DELETE rather than TRUNCATE, which a runtime role may not do.
CLEAR = ("DELETE FROM livepush_job_steps; DELETE FROM livepush_job_signals; DELETE FROM livepush_job_signal_keys; DELETE FROM livepush_job_payloads; "
         "DELETE FROM livepush_jobs; DELETE FROM livepush_job_runtimes; "
         "DELETE FROM livepush_paused_queues")

# -- `livepush status` (api/status.py) --------------------------------------------------------------
# Plain reads: no lock, no write, no ring. They run in one REPEATABLE READ, READ ONLY transaction
# (STATUS_SNAPSHOT first), so every figure of one report comes from the same snapshot and now()
# is the same instant for each age.

# name: status_snapshot
# Must be the transaction's first statement. Read only: the report can never change anything,
# whatever role runs it.
STATUS_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

# name: status_lock_timeout
# Right after status_snapshot (`true`: this transaction only). The reads take only ACCESS SHARE
# locks, which wait for nothing but a schema change: a `livepush migrate` altering a table holds
# ACCESS EXCLUSIVE until it commits, and the report waited for as long, with no word. Given up
# after %(ms)s, the read says so (api/status.py) and the operator tries again.
STATUS_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %(ms)s, true)"

# Whether the available job `j` is a step of a paused workflow run: no runtime claims it until the
# run is resumed (workflows/queries.py: CLAIM_STEPS passes it over on the same condition), so it is
# no backlog of its queue. Counted as one, a run paused on purpose for an hour set off the backlog
# alert (docs/operations.md) and told the operator to add runtimes.
_HELD_BY_PAUSE = """(j.workflow_id IS NOT NULL
    AND EXISTS (SELECT FROM livepush_workflows w WHERE w.id = j.workflow_id AND w.state = 'paused'))"""

# The available jobs that their function's limits hold back now (`concurrency=`, `rate=`), with
# their queue: a runtime would not start them, however many there were, so they are no backlog of
# the queue (counted as one, a tenant's jobs waiting for its one slot set off the backlog alert and
# told the operator to add runtimes). The rules are livepush_claim_limited()'s
# (sql/0008_claim_limits.sql): a job whose key already runs max_running jobs, counting the key's
# jobs before it in claim order, is held for a slot; of the others, those past the whole tokens in
# the name's bucket now are held for tokens. A limited job whose name has no limits row is not held:
# no claim takes it, and that is a backlog to see. A plain read, without the name's claim lock: it
# counts from one snapshot (the statement's, or the report's), so a claim or an outcome committing
# meanwhile is either wholly in it or wholly out, and the figure is at most that one change behind,
# as every gauge is; it decides nothing. Reads the limited claim's index and the running keys' (a
# scrape costs what the limited backlog is); a body for WITH held AS.
_HELD_BY_LIMITS = """
SELECT c.id, c.queue FROM (
    SELECT c.*, row_number() OVER (PARTITION BY c.name, c.over_slots ORDER BY c.priority, c.run_at, c.id) AS nth
    FROM (
        SELECT j.id, j.queue, j.name, j.priority, j.run_at, l.rate,
               least(l.burst, l.tokens + l.rate * greatest(extract(epoch FROM now() - l.refilled_at), 0)) AS tokens,
               coalesce(l.max_running IS NOT NULL AND j.concurrency_key IS NOT NULL
                        AND coalesce(r.n, 0) + row_number() OVER (PARTITION BY j.name, j.concurrency_key
                                                                  ORDER BY j.priority, j.run_at, j.id) > l.max_running,
                        false) AS over_slots
        FROM livepush_jobs j
        JOIN livepush_job_limits l ON l.name = j.name
        LEFT JOIN (SELECT name, concurrency_key, count(*) AS n FROM livepush_jobs
                   WHERE state = 'running' AND concurrency_key IS NOT NULL
                   GROUP BY name, concurrency_key) r ON r.name = j.name AND r.concurrency_key = j.concurrency_key
        WHERE j.state = 'available' AND j.limited
    ) c
) c
WHERE c.over_slots OR (c.rate IS NOT NULL AND c.nth > floor(c.tokens))
"""

# The jobs `livepush status` counts, each state read through the partial index that holds it
# (sql/0003_jobs.sql, 0006_workflows.sql, 0008_claim_limits.sql): the unfinished ones, and the
# failed ones when `failed`. One `state IN (...)` over them all matched none of those indexes,
# and read the whole table, every finished job that retention keeps included. Available jobs
# split as the three claim indexes split them. With `paused`, each row also says whether it is a
# step of a paused run (`paused_step`, _HELD_BY_PAUSE), asked only where a step can be: costed for
# every row, that lookup put the report's plan past jit_above_cost, and Postgres spent longer
# compiling the plan than running it. A body for a FROM (...) j.
def _counted_jobs(columns: str, *, failed: bool, paused: bool) -> str:
    states = [("state = 'available' AND NOT limited AND workflow_id IS NULL", False),
              ("state = 'available' AND limited", True),
              ("state = 'available' AND workflow_id IS NOT NULL AND NOT limited", True),
              ("state IN ('scheduled', 'waiting')", False),
              ("state = 'running'", False)]
    if failed:
        states.append(("state = 'failed'", False))
    return "\n    UNION ALL ".join(
        f"SELECT {columns}{(', ' + (_HELD_BY_PAUSE if step else 'false') + ' AS paused_step') if paused else ''} "
        f"FROM livepush_jobs j WHERE {where}" for where, step in states)


# name: queue_status
# A plain read. Per queue: jobs available now (depth: but a paused run's steps, _HELD_BY_PAUSE, and
# the jobs their limits hold back, counted apart as `held`, _HELD_BY_LIMITS) and
# how long the oldest of them has been due, scheduled (delayed enqueues and retries in backoff), running, waiting (durable jobs
# parked: they hold no slot) and failed (kept until retention deletes them). Finished jobs that
# succeeded or were cancelled are left out. Queues that a registered runtime serves are listed
# even with nothing in them, so an idle queue shows as 0 rather than not at all, and so are paused
# queues (`paused`: no runtime claims from it, jobs.pause_queue()). Reads the unfinished and
# failed rows only (_counted_jobs), never the succeeded and cancelled ones retention keeps.
QUEUE_STATUS = f"""
WITH held AS ({_HELD_BY_LIMITS}), counts AS (
    SELECT queue,
           count(*) FILTER (WHERE claimable) AS depth,
           extract(epoch FROM now() - min(run_at) FILTER (WHERE claimable))::float8 AS oldest_age,
           count(*) FILTER (WHERE held) AS held,
           count(*) FILTER (WHERE state = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'waiting') AS waiting,
           count(*) FILTER (WHERE state = 'failed') AS failed
    FROM (SELECT j.queue, j.state, j.run_at, h.id IS NOT NULL AS held,
                 j.state = 'available' AND NOT j.paused_step AND h.id IS NULL AS claimable
          FROM ({_counted_jobs("j.id, j.queue, j.state, j.run_at", failed=True, paused=True)}) j
          LEFT JOIN held h ON h.id = j.id) j
    GROUP BY queue
), served AS (
    SELECT DISTINCT unnest(queues) AS queue FROM livepush_job_runtimes
)
SELECT q.queue, EXISTS (SELECT 1 FROM livepush_paused_queues pq WHERE pq.queue = q.queue) AS paused,
       coalesce(c.depth, 0)::int AS depth,
       -- NULL with nothing available (greatest() alone would make that 0: it skips NULLs).
       CASE WHEN c.depth > 0 THEN greatest(c.oldest_age, 0) END AS oldest_age,
       coalesce(c.held, 0)::int AS held, coalesce(c.scheduled, 0)::int AS scheduled, coalesce(c.running, 0)::int AS running,
       coalesce(c.waiting, 0)::int AS waiting, coalesce(c.failed, 0)::int AS failed
FROM (SELECT queue FROM counts UNION SELECT queue FROM served UNION SELECT queue FROM livepush_paused_queues) q
LEFT JOIN counts c ON c.queue = q.queue
ORDER BY q.queue
"""

# name: runtime_status
# A plain read. Every registered runtime, with the jobs it holds now (its running rows: exact,
# where the row's in_hand is as of its last beat), the seconds since its last beat, and whether
# it is overdue: silent for more than three of its own beats while it could have beaten (not
# before this server started: PRUNE_DEAD_RUNTIMES's rule), the point at which any other runtime
# deletes it and releases its jobs, so an overdue runtime is dead or stalled and about to be
# treated as dead.
RUNTIME_STATUS = """
SELECT r.id, r.host, r.pid, r.queues, r.concurrency, r.heartbeat, r.state, r.started_at,
       (SELECT count(*) FROM livepush_jobs j WHERE j.state = 'running' AND j.runtime_id = r.id)::int AS in_hand,
       greatest(extract(epoch FROM now() - r.heartbeat_at), 0)::float8 AS since_heartbeat,
       greatest(r.heartbeat_at, pg_postmaster_start_time()) < now() - make_interval(secs => r.heartbeat * 3)
           AS overdue
FROM livepush_job_runtimes r
ORDER BY r.id
"""

# name: tag_status
# A plain read for `livepush status`: the tags of unfinished jobs, with how many carry each, most
# carried first, and on each row how many distinct tags there are in all (`carried`: the window
# counts the grouped rows before LIMIT cuts them). Reads the unfinished jobs only (_counted_jobs,
# as queue_status): the tags index cannot tell which jobs are unfinished.
TAG_STATUS = f"""
SELECT tag, count(*)::int AS unfinished, (count(*) OVER ())::int AS carried
FROM ({_counted_jobs("j.tags", failed=False, paused=False)}) j, unnest(j.tags) AS tag
GROUP BY tag
ORDER BY count(*) DESC, tag
LIMIT %(limit)s
"""

# name: queue_gauges
# A plain read for /metrics: per queue, jobs available now, the oldest one's age, the jobs their
# limits hold back (_HELD_BY_LIMITS: no part of the backlog, counted apart), and whether the
# queue is paused (its backlog then grows on purpose). Reads only the three claim indexes' rows
# (state 'available': plain, limited, and workflow steps', but those of paused runs:
# _HELD_BY_PAUSE) and the running keys', so a scrape costs what the backlog is, never the table;
# queues a registered runtime serves, and paused ones, show as 0 when empty.
QUEUE_GAUGES = f"""
WITH held AS ({_HELD_BY_LIMITS})
SELECT queue, coalesce(c.depth, 0)::int AS depth, c.oldest_age, coalesce(h.held, 0)::int AS held,
       p.queue IS NOT NULL AS paused
FROM (SELECT DISTINCT unnest(queues) AS queue FROM livepush_job_runtimes) q
FULL JOIN (
    SELECT queue, count(*) AS depth, greatest(extract(epoch FROM now() - min(run_at)), 0)::float8 AS oldest_age
    FROM (SELECT queue, run_at FROM livepush_jobs WHERE state = 'available' AND NOT limited AND workflow_id IS NULL
          UNION ALL
          SELECT queue, run_at FROM livepush_jobs j
          WHERE state = 'available' AND limited AND NOT EXISTS (SELECT FROM held WHERE held.id = j.id)
          UNION ALL
          SELECT queue, run_at FROM livepush_jobs j
          WHERE state = 'available' AND workflow_id IS NOT NULL AND NOT limited AND NOT {_HELD_BY_PAUSE}) a
    GROUP BY queue
) c USING (queue)
FULL JOIN (SELECT queue, count(*) AS held FROM held GROUP BY queue) h USING (queue)
FULL JOIN livepush_paused_queues p USING (queue)
"""

# name: runtimes_alive
# A plain read for /metrics: registered runtimes that beat within three of their heartbeats, or
# whose three beats since this server started have not passed yet (no beat lands while it is down).
RUNTIMES_ALIVE = """
SELECT count(*)::int AS alive FROM livepush_job_runtimes
WHERE greatest(heartbeat_at, pg_postmaster_start_time()) >= now() - make_interval(secs => heartbeat * 3)
"""

# name: status_now
# A plain read: the instant the report describes (the snapshot's now()).
STATUS_NOW = "SELECT now() AS at"
