"""Every SQL statement of workflows, named, with why it is safe under concurrency.

Tables: sql/0006_workflows.sql. A step is run by a job (sql/0003_jobs.sql) whose `workflow_id`
is the run; its payload's args are [run id].

Exactly once: every decision about a run (start its first steps, record a step's end and start
what follows, an operator verb) runs in a transaction that first locks the run's row (LOCK_RUNS),
then reads its steps in a later statement (a snapshot that sees every earlier holder's commit),
and changes steps only from the states it read. So two decisions on one run never interleave:
a step is started (its job created) by exactly one of them.

Lock order, extending the jobs' and groups' (job rows -> shards -> groups -> parent jobs):
job rows -> workflow rows. A step's end is recorded in the transaction that ended its job (the
job row is locked first); a step's claim (CLAIM_STEPS) locks its job's row, then the run's, both
SKIP LOCKED: it waits for neither.
Decisions and operator verbs lock the run first and never wait for a job row after it: the jobs
a decision stops (livepush/jobs/queries.py: STOP_JOBS) are locked with SKIP LOCKED, and what a
verb does to the rest is done in later transactions. The one exception is a signal
(operators.py: _signal_steps) to a step that had no job at its first look but has one once the
run is locked (LOCK_RUN_FOR_SIGNAL): it then locks that job's row. A step parking at that moment
(its job row, then its run) can deadlock with it; Postgres aborts one of the two, and both run
their transaction again on a deadlock (groups/transactions.py, durable/run.py).
"""

from __future__ import annotations

from .. import queries

# name: insert_run
# A new run and its steps, all pending; invisible to others until commit. With a key (flow.start
# (key=)), nothing when an unfinished run of the workflow holds it (sql/0006_workflows.sql:
# livepush_workflows_key_idx): an insert racing another start of the key waits there for that
# transaction, and inserts nothing once it committed (KEYED_RUN then finds its run), or inserts
# after a rollback. A run without a key never conflicts: the index leaves it out.
INSERT_RUN = """
WITH run AS (
    INSERT INTO livepush_workflows (name, queue, graph, input, key)
    VALUES (%(name)s, %(queue)s, %(graph)s::jsonb, %(input)s::jsonb, %(key)s)
    ON CONFLICT (name, key) WHERE key IS NOT NULL AND state IN ('running', 'paused') DO NOTHING
    RETURNING id
), steps AS (
    INSERT INTO livepush_workflow_steps (workflow_id, name)
    SELECT run.id, s.name FROM run, unnest(%(steps)s::text[]) AS s(name)
)
SELECT id FROM run
"""

# name: keyed_run
# After INSERT_RUN inserted nothing, in a later statement (a snapshot that sees the holder's
# commit): the unfinished run of the workflow holding the key, found through
# livepush_workflows_key_idx. None when the holder finished in between: the key is free again.
KEYED_RUN = """
SELECT id FROM livepush_workflows
WHERE name = %(name)s AND key = %(key)s AND state IN ('running', 'paused')
"""

# name: lock_runs
# The decision lock: run rows FOR UPDATE in id order (two decisions over several runs never
# deadlock). Returns what the decision needs of each run: not its input, which may be megabytes
# and which no decision reads (every step end, in its runtime's completer, would fetch it again).
LOCK_RUNS = """
SELECT id, name, queue, state, graph FROM livepush_workflows
WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR UPDATE
"""

# name: steps_of
# After LOCK_RUNS, in a later statement: the runs' steps as the last lock holder left them. Not
# their outputs: no decision reads an earlier output (DECIDE keeps a step's output unless it
# writes a new one), and fetched under the run's lock at every decision they cost seconds and
# their size in memory each time, for a run whose steps returned megabytes.
STEPS_OF = """
SELECT workflow_id, name, state, job_id, group_id, error FROM livepush_workflow_steps
WHERE workflow_id = ANY(%(ids)s::bigint[])
"""

# name: decide
# Under the run's lock (LOCK_RUNS, then STEPS_OF), everything one decision about the run writes, in
# one statement (one round trip; a step's end costs its transaction this and the two reads):
# - the jobs of the steps that became ready (`start`: pending when read after the lock), on the
#   run's queue, args [run id], and those steps `running` with their job;
# - the run's signals kept for the steps started, each taken over by its own step's new job (a
#   signal is kept for the step it was sent to: jobs.workflows.signal keeps at most one per step);
# - the other steps whose state the decision changed (never the started ones: two updates of one
#   row in a statement are not allowed), and the signals kept for those among them that finished
#   without starting (skipped, or stopped with their run): they go with their step;
# - the audit lines, in order;
# - the run's state, and a new version of its topic naming the change (unless `event` is null),
#   rung with the new jobs' id range and the runtimes' doorbell, all delivered at commit. A
#   resume (`wake`) rings the doorbell with no new job too: the steps' jobs queued, woken or due
#   again while the run was paused, which the claims passed over, can be claimed now, and an idle
#   runtime would otherwise find them only at its next poll.
DECIDE = """
WITH input AS MATERIALIZED (
    SELECT nextval('livepush_jobs_id_seq') AS id, u.step, u.job, u.priority, u.max_attempts, u.wait_for, u.ord
    FROM unnest(%(start)s::text[], %(jobs)s::text[], %(priorities)s::int[], %(max_attempts)s::int[],
                %(wait_for)s::text[]) WITH ORDINALITY AS u(step, job, priority, max_attempts, wait_for, ord)
), jobs AS (
    INSERT INTO livepush_jobs (id, queue, name, priority, state, max_attempts, workflow_id)
    SELECT id, %(queue)s, job, priority, 'available', max_attempts, %(id)s FROM input
), payloads AS (
    INSERT INTO livepush_job_payloads (id, args) SELECT id, jsonb_build_array(%(id)s::bigint) FROM input
), started AS (
    UPDATE livepush_workflow_steps s SET state = 'running', job_id = i.id, error = NULL, attempt = 0
    FROM input i WHERE s.workflow_id = %(id)s AND s.name = i.step
), handed AS (
    DELETE FROM livepush_workflow_signals w USING input i
    WHERE w.workflow_id = %(id)s AND w.step = i.step AND w.name = i.wait_for
    RETURNING w.id AS seq, i.id AS job_id, w.name, w.data
), dropped AS (
    DELETE FROM livepush_workflow_signals w
    USING unnest(%(names)s::text[], %(states)s::text[]) AS u(name, state)
    WHERE w.workflow_id = %(id)s AND w.step = u.name AND u.state IN ('succeeded', 'skipped', 'failed', 'cancelled')
), taken AS (
    INSERT INTO livepush_job_signals (job_id, name, data) SELECT job_id, name, data FROM handed ORDER BY seq
), changed AS (
    UPDATE livepush_workflow_steps s SET
        state = u.state, output = coalesce(u.output, s.output), error = u.error
    FROM unnest(%(names)s::text[], %(states)s::text[], %(outputs)s::jsonb[], %(errors)s::text[])
         AS u(name, state, output, error)
    WHERE s.workflow_id = %(id)s AND s.name = u.name
), audited AS (
    INSERT INTO livepush_workflow_audit (workflow_id, verb, step, actor, reason)
    SELECT %(id)s, a.verb, a.step, a.actor, a.reason
    FROM unnest(%(verbs)s::text[], %(verb_steps)s::text[], %(actors)s::text[], %(reasons)s::text[])
         WITH ORDINALITY AS a(verb, step, actor, reason, ord)
    ORDER BY a.ord
), run AS (
    UPDATE livepush_workflows w SET
        state = %(state)s, output = coalesce(%(output)s::jsonb, w.output), error = coalesce(%(error)s, w.error),
        version = w.version + 1, event = %(event)s,
        finished_at = CASE WHEN %(state)s IN ('succeeded', 'failed', 'cancelled') THEN now() END
    WHERE w.id = %(id)s AND %(event)s::text IS NOT NULL
    RETURNING w.id, w.version
)
SELECT (SELECT livepush_state_changed(array_agg('workflow:' || r.id), array_agg(r.version)) FROM run r)
     + (SELECT livepush_states_created('job', min(i.id), max(i.id))
               + CASE WHEN count(*) > 0 OR %(wake)s::boolean THEN livepush_jobs_ready() ELSE 0 END FROM input i) AS rung
"""

# name: record_batches
# Under the run's lock, in a decision that gives the run a new version (DECIDE, next): the counts
# of its fan-out steps' batches as that version shows them (a finished run's last version keeps
# them, while a stopped batch goes on changing). Read in this statement's snapshot.
RECORD_BATCHES = """
UPDATE livepush_workflow_steps SET batch = coalesce(livepush_workflow_batch(group_id), batch)
WHERE workflow_id = %(id)s AND group_id IS NOT NULL
"""

# name: claim_steps
# The claim of workflow steps' jobs, on `queue`, of the step names this runtime defines; the plain
# claim (queries.py: CLAIM) leaves them out. A runtime that defines no step never runs it. A
# paused run's steps are passed over (pause: nothing new starts): a job queued, woken or due
# again while its run is paused stays available, untouched (a durable step keeps its
# checkpoints), until resume. A claim whose snapshot predates the pause's commit may still start
# one, as a step already running when the pause came goes on.
# Safe under concurrency as CLAIM is: SKIP LOCKED hands each available row to exactly one claimer,
# and the partial index (sql/0006_workflows.sql) holds only available steps' jobs. In the same
# statement, each unfinished run among them gets a new version showing its step's new attempt
# (livepush_workflow_steps_claimed()), so no version of `workflow:<id>` shows two attempts. For
# that the claim takes the candidates' rows, then their runs' rows (the lock order job rows ->
# workflow rows), both SKIP LOCKED, and claims only the jobs whose run it holds (or whose run is
# gone): it never waits. A run's row is held until commit by whoever changes the run: a decision,
# a park or a wake of one of its steps' jobs, another claim of its steps, and a caller's open
# transaction that woke one with jobs.signal(conn=). Waiting for it would hold every claim of this
# runtime until that commit: instead those steps stay available, untouched, and `busy` says so
# (the runtime claims again shortly, runtime.py: _retry_if_busy; the waking signal rings the
# doorbell at its commit). Nor can a claim blocked on a lock commit after the runtime gave back
# what a failed claim took (runtime.py: _release_unheard). FOR NO KEY UPDATE on the jobs, not FOR UPDATE: a signal's open transaction
# key-share locks a job's row (durable/queries.py: SIGNAL_TARGET), which FOR UPDATE would pass over.
# The runs are looked up by their key (= ANY of an array: an index scan whatever the plan thinks
# of the candidates' count). Always one row: `busy`, and the claimed jobs' columns (all null when
# none was claimed).
# Committed synchronously, unlike CLAIM: a run's version rung and then lost in a crash would be
# given again to a different state.
CLAIM_STEPS = f"""
WITH candidates AS (
    SELECT id, version, workflow_id FROM livepush_jobs
    WHERE state = 'available' AND workflow_id IS NOT NULL AND queue = %(queue)s AND name = ANY(%(names)s::text[])
      AND NOT EXISTS (SELECT FROM livepush_workflows w WHERE w.id = livepush_jobs.workflow_id AND w.state = 'paused')
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), runs AS (
    SELECT id FROM livepush_workflows WHERE id = ANY(ARRAY(SELECT DISTINCT workflow_id FROM candidates))
    FOR NO KEY UPDATE SKIP LOCKED
), picked AS (
    SELECT c.id, c.version FROM candidates c
    WHERE c.workflow_id IN (SELECT id FROM runs)
       OR NOT EXISTS (SELECT FROM livepush_workflows w WHERE w.id = c.workflow_id)
), {queries.CLAIMED}, shown AS (
    SELECT livepush_workflow_steps_claimed(array_agg(c.id), array_agg(c.workflow_id), array_agg(c.attempt)) AS n
    FROM claimed c
), passed AS (
    SELECT (SELECT count(*) FROM candidates) > (SELECT count(*) FROM picked) AS busy
)
SELECT {queries.CLAIMED_COLUMNS}, b.busy
FROM passed b CROSS JOIN shown
LEFT JOIN (claimed j JOIN livepush_job_payloads p ON p.id = j.id) ON true
ORDER BY j.priority, j.run_at, j.id
"""

# name: audit
# An audit line of its own (jobs.workflows.signal, in the transaction that delivers the signal).
AUDIT = """
INSERT INTO livepush_workflow_audit (workflow_id, verb, step, actor, reason)
VALUES (%(id)s, %(verb)s, %(step)s, %(actor)s, %(reason)s)
"""

# name: keep_signal
# Under the run's lock (LOCK_RUN_FOR_SIGNAL: no decision, nor another signal, runs meanwhile): a
# signal for a step that has no job yet waits here, kept for that step (DECIDE hands it to the
# step's next job). The unique index keeps one per step whatever happens: a second insert for the
# step inserts nothing (no row returned), and its sender then looks again, in a later statement
# that sees the first (operators.py: _signal_steps).
KEEP_SIGNAL = """
INSERT INTO livepush_workflow_signals (workflow_id, step, name, data)
VALUES (%(id)s, %(step)s, %(name)s, %(data)s::jsonb)
ON CONFLICT (workflow_id, step) DO NOTHING
RETURNING id
"""

# name: kept_signals
# jobs.workflows.signal: whether the run keeps a signal of this name for this step already (a
# step takes one). Read under the run's lock (LOCK_RUN_FOR_SIGNAL), or before it as a first look
# that the locked look repeats: no decision hands or drops a kept signal meanwhile.
KEPT_SIGNALS = """
SELECT count(*) AS n FROM livepush_workflow_signals
WHERE workflow_id = %(id)s AND step = %(step)s AND name = %(name)s
"""

# name: claim_signal_key
# jobs.workflows.signal(key=), its transaction's first statement: the key, taken for this send. A
# send of the same key by another transaction, not yet committed, makes this insert wait for its
# end on the key's primary key (holding no other lock meanwhile, so no circle of waits); once that
# one committed, this one inserts nothing (no row returned) and the caller sends nothing. A send
# refused afterwards drops its key (DROP_SIGNAL_KEY), so a later send of it is not taken for sent.
CLAIM_SIGNAL_KEY = """
INSERT INTO livepush_workflow_signal_keys (workflow_id, key, name) VALUES (%(id)s, %(key)s, %(name)s)
ON CONFLICT (workflow_id, key) DO NOTHING
RETURNING key
"""

# name: keyed_run_signal
# jobs.workflows.signal(key=) whose key was sent before: the name it was sent with. A later
# statement than CLAIM_SIGNAL_KEY, so it sees the send that committed while that one waited.
KEYED_RUN_SIGNAL = "SELECT name FROM livepush_workflow_signal_keys WHERE workflow_id = %(id)s AND key = %(key)s"

# name: drop_signal_key
# jobs.workflows.signal(key=) refused (no run, no step waiting): its key goes, in the transaction
# that took it (CLAIM_SIGNAL_KEY), which still holds it.
DROP_SIGNAL_KEY = "DELETE FROM livepush_workflow_signal_keys WHERE workflow_id = %(id)s AND key = %(key)s"

# name: run_of
# jobs.workflows.signal, first look (a plain read: the step's job row, locked next, decides).
RUN_OF = "SELECT id, state, graph FROM livepush_workflows WHERE id = %(id)s"

# name: lock_run_for_signal
# jobs.workflows.signal: signals to one run take its row one at a time (FOR NO KEY UPDATE conflicts
# with itself), so each sees, in a later statement, where the one before it went: two sent at once
# never both reach one step's job, nor are both kept for one step. A signal sent to a step's job
# takes it after the send (which locked the job's row if it woke it: the lock order) and then
# checks that it is the job's only one, else takes the send back (SIGNAL_SAVEPOINT). When the step
# has no active job, it takes it before keeping the signal for the run: that holds off decisions
# too (they lock FOR UPDATE), so no job of that step starts meanwhile. It conflicts with nothing
# else that FOR SHARE, which this lock was, did not (foreign keys to the run take FOR KEY SHARE).
LOCK_RUN_FOR_SIGNAL = "SELECT id, state, graph FROM livepush_workflows WHERE id = %(id)s FOR NO KEY UPDATE"

# name: step_waiting_for
# jobs.signal straight to job `id`, under its key-share lock (durable/queries.py: SIGNAL_TARGET):
# the step of its run whose job it is (by the job's name, in the graph the run started with) when
# that step's wait_for= is signal `name`. A plain read of the run's row, which never changes its graph.
STEP_WAITING_FOR = """
SELECT w.id AS run_id, s.key AS step
FROM livepush_jobs j
JOIN livepush_workflows w ON w.id = j.workflow_id
CROSS JOIN LATERAL jsonb_each(w.graph -> 'steps') s
WHERE j.id = %(id)s AND s.value ->> 'job' = j.name AND s.value ->> 'wait_for' = %(name)s
"""

# name: step_runs_job
# jobs.workflows.signal, under the run's lock (LOCK_RUN_FOR_SIGNAL, which holds off decisions): whether
# the step is still active with this job, as it was at the signal's look before that lock.
STEP_RUNS_JOB = """
SELECT 1 FROM livepush_workflow_steps
WHERE workflow_id = %(id)s AND name = %(name)s AND job_id = %(job_id)s AND state IN ('running', 'waiting')
"""

# name: signal_savepoint, signal_undo, signal_release
# Around a signal's send to a step's job (operators.py: _to_job): taken back when a signal sent
# at the same time reached the job first. Whatever the send locked, wrote or rang (NOTIFY) in the
# savepoint goes with it.
SIGNAL_SAVEPOINT = "SAVEPOINT livepush_workflow_signal"
SIGNAL_UNDO = "ROLLBACK TO SAVEPOINT livepush_workflow_signal"
SIGNAL_RELEASE = "RELEASE SAVEPOINT livepush_workflow_signal"

# name: step_inputs
# What a step's job reads when it starts: the run's input and the outputs of the steps that
# succeeded, and of skipped ones that have one (a fan-out keeps its batch's counts: a skipped step
# stands for one that succeeded, and what follows reads it as such). A plain read; outputs never
# change once their step finished.
# The outputs come as two arrays, names and values, not as one jsonb object: outputs that
# together passed what one jsonb value holds (255 MiB) made every attempt of the step fail.
# Also the step as the run's graph stores it (its kind and options: the run follows the graph it
# started with), and its batch so far (a fan-out step): made by whom, and how many of it succeeded.
STEP_INPUTS = """
WITH done_steps AS MATERIALIZED (
    SELECT s.name, s.output FROM livepush_workflow_steps s
    WHERE s.workflow_id = %(id)s AND (s.state = 'succeeded' OR s.state = 'skipped' AND s.output IS NOT NULL)
)
SELECT w.input, w.state, w.graph -> 'steps' -> %(step)s AS spec,
       (SELECT array_agg(s.name ORDER BY s.name) FROM done_steps s) AS output_names,
       (SELECT array_agg(s.output ORDER BY s.name) FROM done_steps s) AS outputs,
       me.state AS step_state, me.job_id AS step_job, me.output AS step_output, me.group_id,
       g.parent_id AS group_parent,
       (SELECT coalesce(sum(sh.succeeded), 0)::int FROM livepush_group_shards sh
        WHERE sh.group_id = me.group_id) AS group_succeeded
FROM livepush_workflows w
JOIN livepush_workflow_steps me ON me.workflow_id = w.id AND me.name = %(step)s
LEFT JOIN livepush_groups g ON g.id = me.group_id
WHERE w.id = %(id)s
"""

# name: failed_members
# The members of an earlier batch that did not succeed, to run again (a resumed fan-out step). A
# plain read: the batch finished, and a finished batch's members never change (a member's
# retry_failed and discard_failed are refused, retention keeps them while the run goes on), so
# a replay that reads them again, before its new batch is written, reads the same.
FAILED_MEMBERS = """
SELECT j.name, j.queue, p.args FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
WHERE j.group_id = %(group_id)s AND j.state IN ('failed', 'cancelled')
ORDER BY j.id
"""

# name: set_step_group
# In the transaction that creates a fan-out step's batch, after its park (which gave the run a new
# version): the step shows its batch and its counts at that version. The step row comes after the
# run's, as in every decision.
SET_STEP_GROUP = """
UPDATE livepush_workflow_steps SET group_id = %(group_id)s, batch = livepush_workflow_batch(%(group_id)s)
WHERE workflow_id = %(id)s AND name = %(name)s
"""

# A step's state as every view shows it (s: its row, j: its job's): `waiting` while its running
# job is parked (docs/workflows.md "Runs and steps"). One fragment, so the views cannot disagree.
_STEP_STATE = "CASE WHEN s.state = 'running' AND j.state = 'waiting' THEN 'waiting' ELSE s.state END"


# RUN_VIEWS and TOPIC_VIEWS: each run asked for, and each of its steps as the topic shows it
# (`extra` adds to a step what only jobs.workflows.get() shows).
def _run_views(run_columns: str, extra: str = "") -> str:
    return f"""
SELECT w.id, w.name, w.state, w.version, w.event, {run_columns},
       coalesce(jsonb_object_agg(s.name, jsonb_build_object(
           'state', {_STEP_STATE},
           'attempt', s.attempt, 'group', s.group_id, 'batch', s.batch{extra})) FILTER (WHERE s.name IS NOT NULL),
                '{{}}'::jsonb) AS steps
FROM livepush_workflows w
LEFT JOIN livepush_workflow_steps s ON s.workflow_id = w.id
LEFT JOIN livepush_jobs j ON j.id = s.job_id
WHERE w.id = ANY(%(ids)s::bigint[])
GROUP BY w.id
"""


# name: run_views
# jobs.workflows.get(): the run and each step, with its attempt
# and its batch's counts as the run's version recorded them (sql/0006_workflows.sql), and whether
# its job is parked (the step shows `waiting`: every statement that parks or wakes a step's job
# gives its run a new version in the same transaction). A step whose job is `scheduled` between
# two attempts stays `running`: an attempt's end into a retry gives the run no new version, so
# the topic could not show it (docs/workflows.md "Runs and steps"). A plain read: one snapshot. The steps'
# outputs come apart (STEP_OUTPUTS): built into this one object, outputs that together passed
# what one jsonb value holds (255 MiB) made the run unreadable. The run's input is a column of its
# own, beside that object, for the same reason.
RUN_VIEWS = _run_views("w.input, w.output, w.error, w.created_at, w.finished_at, w.graph, w.key",
                       ", 'error', s.error, 'job', s.job_id")

# name: topic_views
# The state topic workflow:<id> (events/source.py), read at each of its versions (a claim, a park,
# a batch's progress ring): the run and what the topic shows of each step, as RUN_VIEWS has them,
# and not the steps' outputs and errors. An output is whatever JSON the step returned, megabytes
# maybe: read at every version they cost a page's every update, and several together pass what
# one jsonb value holds, which made the run unreadable on its topic. A plain read: one snapshot.
TOPIC_VIEWS = _run_views("jsonb_build_object('order', w.graph -> 'order') AS graph")

# name: step_outputs
# jobs.workflows.get(), in RUN_VIEWS's snapshot: each step's output, a row apiece (each may be as
# large as one jsonb value, whatever the others hold).
STEP_OUTPUTS = """
SELECT name, output FROM livepush_workflow_steps WHERE workflow_id = %(id)s AND output IS NOT NULL
"""

# name: run_snapshot
# jobs.workflows.get(): the transaction's first statement, so RUN_VIEWS, STEP_OUTPUTS and AUDIT_OF read one
# snapshot (read committed gave each its own: a verb committed between them showed on the audit
# trail of a run still shown as before it). The statement `livepush status` starts with.
RUN_SNAPSHOT = queries.STATUS_SNAPSHOT

# name: audit_of
AUDIT_OF = """
SELECT seq, verb, step, actor, reason, at FROM livepush_workflow_audit WHERE workflow_id = %(id)s ORDER BY seq
"""

def _list_runs(key_filter: str) -> str:
    return f"""
SELECT id, name, state, created_at, finished_at, key FROM livepush_workflows
WHERE {key_filter}(%(name)s::text IS NULL OR name = %(name)s) AND (%(state)s::text IS NULL OR state = %(state)s)
  AND id < %(before)s
ORDER BY id DESC
LIMIT %(limit)s + 1
"""


# name: list_runs
# Keyset paging, newest first (id descending), optionally by name and state
# (livepush_workflows_list_idx). Run unprepared (operators.list_runs), so that each call is planned
# for its values: the filters left out fold away, and a workflow with few runs among many is read
# through the index. Prepared (the jobs' pool prepares from the first run), Postgres planned it
# from its sixth run on once for every value: that generic plan, which cannot tell a rare name
# from a common one, read every run newest first, whatever the filters' form.
LIST_RUNS = _list_runs("")

# name: list_keyed_runs
# LIST_RUNS of the runs started with a key (jobs.workflows.list(key=)), finished ones too: their
# own statement, whose plan reads livepush_workflows_keys_idx, where `key IS NULL OR key = ...`
# would leave it for a scan of every run.
LIST_KEYED_RUNS = _list_runs("key = %(key)s AND ")

# name: prune_runs
# Retention: finished runs older than the cutoff, a bounded batch (SKIP LOCKED: two runtimes
# pruning split the work); their steps, audit and signals go with them (ON DELETE CASCADE), and
# their signal keys (no foreign key, sql/0006_workflows.sql) in the same statement. One row per
# run deleted. The jobs that ran their steps are ordinary finished jobs, pruned as such.
PRUNE_RUNS = """
WITH gone AS (
    DELETE FROM livepush_workflows WHERE id IN (
        SELECT id FROM livepush_workflows
        WHERE finished_at < now() - make_interval(secs => %(retention)s)
        ORDER BY finished_at LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id
), keys AS (
    DELETE FROM livepush_workflow_signal_keys k USING gone g WHERE k.workflow_id = g.id
)
SELECT id FROM gone
"""

# name: clear (tests only)
CLEAR = ("DELETE FROM livepush_workflow_signals; DELETE FROM livepush_workflow_signal_keys; "
         "DELETE FROM livepush_workflow_audit; "
         "DELETE FROM livepush_workflow_steps; DELETE FROM livepush_workflows")

# name: runs_in_progress
# `livepush status`: a plain read (no lock; api/status.py runs it in a read-only snapshot). The
# newest `limit` runs not finished (running or paused), each with its steps as RUN_VIEWS shows
# them (a step whose job is parked is `waiting`) and the graph's step order, so that
# events/views.workflow_view gives the same state and steps as the run's topic; `in_progress`
# counts every unfinished run (before the LIMIT; `limit` is at least 1). Steps are read only
# for the runs shown.
RUNS_IN_PROGRESS = f"""
WITH page AS (
    SELECT id, name, state, created_at, graph -> 'order' AS step_order, count(*) OVER () AS in_progress
    FROM livepush_workflows
    WHERE state IN ('running', 'paused')
    ORDER BY id DESC
    LIMIT %(limit)s
)
SELECT p.id, p.name, p.state, p.created_at, p.in_progress::int AS in_progress,
       jsonb_build_object('order', p.step_order) AS graph, st.steps
FROM page p
CROSS JOIN LATERAL (
    SELECT coalesce(jsonb_object_agg(s.name, jsonb_build_object(
               'state', {_STEP_STATE},
               'attempt', s.attempt, 'group', s.group_id)), '{{}}'::jsonb) AS steps
    FROM livepush_workflow_steps s LEFT JOIN livepush_jobs j ON j.id = s.job_id
    WHERE s.workflow_id = p.id
) st
ORDER BY p.id DESC
"""
