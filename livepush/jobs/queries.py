"""Every SQL statement of the job runtime, named, with why it is safe under concurrency.

Only this module spells SQL for jobs. Statements that take a batch get it as arrays and
`unnest` them, so a batch of any size is one round trip. The hot ones take their arrays in
binary (`%(x)b`): psycopg builds a text array in Python, escaping each element, which was
the runtime's largest single cost in Python per job. The enqueue takes its batch as one JSON
document instead (enqueue.Batch: seven columns, one encoder call). Tables: see
sql/0003_jobs.sql.

Fencing rule: every statement that changes a running job names its lease
(`WHERE id = … AND lease = … AND state = 'running'`). A claim gives each job a fresh lease,
so an outcome from a worker that lost its job (rescued, cancelled, timed out, released)
matches no row and changes nothing.
"""

from __future__ import annotations

# Doorbell channel: a payload-free NOTIFY that wakes idle runtimes. Postgres folds identical
# notifications of one transaction into one and delivers them at commit, so an enqueue in a
# rolled-back transaction never wakes anyone.
READY_CHANNEL = "livepush_jobs"
# Cancel requests for running jobs: payload is the job id.
CANCEL_CHANNEL = "livepush_jobs_cancel"

# The columns an event needs, from the state table `j` and the payload table `p`.
_EVENT_COLUMNS = "j.id, j.name, j.queue, j.state, j.attempt, j.max_attempts, j.run_at, j.group_id, p.progress, p.error"


# "Still running" for the statements that look jobs up by the ids of a batch (outcomes,
# starts, progress). Spelled so that it cannot match the partial index on running jobs:
# the planner sizes that index (and an unnested array parameter) at a few rows, and
# picked a nested loop that re-ran the unnest for every running row, quadratic in the
# batch (500 outcomes took 108 ms, and a slow batch makes the next one bigger). Written
# this way, the jobs are read by primary key, one lookup per array element (or, in a small
# table, by one scan and a hash): linear either way. States are lower case (CHECK), so
# this is exactly `j.state = 'running'`.
_STILL_RUNNING = "lower(j.state) = 'running'"


def _event_sql(event: str, alias: str) -> str:
    """SQL for the JSON text of a job event (sql/0005: livepush_job_event, the twin of
    events.job_view) from a relation `alias` with the _EVENT_COLUMNS."""
    a = alias
    return (f"livepush_job_event({event}, {a}.id, {a}.name, {a}.queue, {a}.state, {a}.attempt, "
            f"{a}.max_attempts, {a}.progress, {a}.error, {a}.run_at)")


# The event a job publishes on reaching its state (events._STATE_EVENT in SQL).
_STATE_EVENT_SQL = """CASE {a}.state WHEN 'succeeded' THEN 'succeeded' WHEN 'failed' THEN 'failed'
    WHEN 'cancelled' THEN 'cancelled' WHEN 'running' THEN 'started' ELSE 'retrying' END"""

# name: enqueue_many
# One statement for any number of jobs. Ids come from the sequence inside the `input` CTE,
# which Postgres materializes once (it calls a volatile function), so both inserts see the
# same ids. New rows are invisible to claims until commit: nothing to race with.
# `input` holds every column of the new rows' events, so the inserts return nothing and
# nothing joins back to them (RETURNING and the join back cost ~1 us a job). The payload
# keeps the run_at asked for: a derived "enqueued" event is built from it (sql/0010).
_ENQUEUE_CTES = f"""
WITH input AS (
    SELECT nextval('livepush_jobs_id_seq') AS id, f.name, f.queue, f.priority,
           coalesce(f.at, now()) AS run_at,
           CASE WHEN f.at > now() THEN 'scheduled' ELSE 'available' END AS state,
           0 AS attempt, f.max_attempts, f.group_id, NULL::jsonb AS progress, NULL::text AS error,
           f.args, f.ord, f.at
    FROM (
        -- enqueue.Batch: one JSON array per job, in this column order.
        SELECT u.j ->> 0 AS name, u.j ->> 1 AS queue, (u.j ->> 2)::int AS priority,
               (u.j ->> 3)::timestamptz AS at, (u.j ->> 4)::int AS max_attempts,
               (u.j ->> 5)::bigint AS group_id, u.j -> 6 AS args, u.ord
        FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS u(j, ord)
    ) f
), jobs AS (
    INSERT INTO livepush_jobs (id, queue, name, priority, run_at, state, max_attempts, group_id)
    SELECT id, queue, name, priority, run_at, state, max_attempts, group_id FROM input
), payloads AS (
    INSERT INTO livepush_job_payloads (id, args, requested_run_at) SELECT id, args, at FROM input
)
"""
ENQUEUE_MANY = _ENQUEUE_CTES + f"""
SELECT {_EVENT_COLUMNS.replace("j.", "i.").replace("p.", "i.")}, pg_notify('{READY_CHANNEL}', '') IS NULL AS _rang
FROM input i
ORDER BY i.ord
"""

# The "enqueued" event of a job the statement creates, from `input`: the text
# livepush_job_event('enqueued', ...) gives for it (a test holds them equal), written out for
# what every new job has (attempt 0, no progress, no error, a state that needs no quoting),
# and with run_at's JSON computed once when it is the statement's now(): ~0.8 us a job
# against the function's ~1.5 (measured on 100,000 rows).
_ENQUEUED_EVENT_SQL = """'{"event":"enqueued","job":{"id":' || i.id::text
        || ',"name":' || to_json(i.name)::text || ',"queue":' || to_json(i.queue)::text
        || ',"state":"' || i.state || '","attempt":0,"max_attempts":' || i.max_attempts::text
        || ',"progress":{"done":0,"total":null,"message":null},"error":null,"run_at":'
        || CASE WHEN i.at IS NULL THEN (SELECT to_json(now())::text) ELSE to_json(i.run_at)::text END
        || '}}'"""

# name: enqueue_many_publishing_fresh
# ENQUEUE_MANY plus the "enqueued" events, published by the same statement (Postgres fan-out
# in the jobs' database): one round trip. Returns only what a JobHandle needs, in item order.
# Each job's topic is new: its id comes from the sequence in this statement. So its event is
# the topic's first message, offset EPOCH-1, with one epoch for the statement (the topic
# table's default, taken once): a plain insert of the topic rows, nothing to number, nothing
# to join back. The event itself is not written: the topic row is marked `first_derived`
# and the history view builds it from the job's rows when someone reads it (why and what
# holds: sql/0010_derived_enqueued_events.sql). The NOTIFY carries only offset and topic
# ("EPOCH-1 job:<id>", the form livepush_publish() uses past 8,000 bytes): nobody watches a
# job that did not exist yet, so a listening server reads the event from the history in the
# rare case someone does (a page that subscribed while the caller's transaction was open),
# and otherwise no server parses a thousand notifications to drop them. Measured with 1,000
# jobs a call through enqueue_many(), alternating with ENQUEUE_MANY_PUBLISHING: median call
# 16.0 -> 11.9 ms with the event still stored; not storing it: 9.66 -> 7.10 ms (sql/0010).
# Safe under concurrency: no other enqueue can create these topics (the ids are ours). A
# topic that already exists (someone published on job:<id> first, or the sequence was
# reset) fails the statement with a unique violation on livepush_topics_pkey, also when it
# is another transaction's and that commits (the statement waits for it); the caller then
# reruns the batch with ENQUEUE_MANY_PUBLISHING. So this runs only in autocommit, where the
# failed statement leaves nothing behind (enqueue.run_batch).
ENQUEUE_MANY_PUBLISHING_FRESH = _ENQUEUE_CTES.rstrip() + f"""
, epoch AS (
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS epoch
), created AS (
    INSERT INTO livepush_topics (topic, epoch, last_seq, first_derived)
    SELECT 'job:' || i.id, epoch.epoch, 1, true FROM input i, epoch
)
SELECT i.id, i.name, pg_notify('{READY_CHANNEL}', '') IS NULL AS _rang,
       pg_notify('livepush', epoch.epoch::text || '-1 job:' || i.id) IS NULL AS _published
FROM input i, epoch
ORDER BY i.ord
"""

# name: enqueue_many_publishing
# ENQUEUE_MANY_PUBLISHING_FRESH for topics that may already hold messages: in the caller's
# transaction (where a failed statement would abort it), in a task group's, and as the
# fresh statement's fallback. Each event is numbered after whatever its topic holds
# (`bumped`), logged, and rung in item order with livepush_publish()'s text (sql/0009), as
# livepush_publish_many() would, without building two arrays for it to unnest and group by
# topic (each topic gets one message here).
# Safe under concurrency as livepush_publish_many(): the upsert locks each topic row, in
# topic order (it reads its rows sorted), and holds the lock to commit, so a topic's
# offsets are assigned in commit order and two statements sharing topics never deadlock.
# `published` must be a hash join. Postgres sizes a CTE by its input's estimate, here
# jsonb_array_elements()'s fixed 100 rows, so the plan is the same for every batch size
# (measured: 17-20 us a job from 1,000 to 50,000 jobs a call). Not for inputs unnested
# from arrays, sized at a few rows: tried for the completer's events, the planner
# nested-looped over the CTEs, quadratic in the batch, 4x slower.
ENQUEUE_MANY_PUBLISHING = _ENQUEUE_CTES.rstrip() + f"""
, enqueued AS (
    SELECT i.id, i.name, i.ord, 'job:' || i.id AS topic, {_ENQUEUED_EVENT_SQL} AS data FROM input i
), bumped AS (
    INSERT INTO livepush_topics AS t (topic, last_seq)
    SELECT topic, 1 FROM enqueued ORDER BY topic
    ON CONFLICT (topic) DO UPDATE SET last_seq = t.last_seq + 1
    RETURNING t.topic, t.epoch, t.last_seq
), published AS (
    SELECT e.*, b.epoch, b.last_seq AS seq FROM enqueued e JOIN bumped b USING (topic)
), logged AS (
    INSERT INTO livepush_messages (topic, seq, data) SELECT topic, seq, data FROM published
)
SELECT n.id, n.name, pg_notify('{READY_CHANNEL}', '') IS NULL AS _rang,
       pg_notify('livepush', livepush_notification(n.epoch, n.seq, n.topic, n.data)) IS NULL AS _published
FROM (SELECT * FROM published ORDER BY ord) n
ORDER BY n.ord
"""

# name: enqueue_one
# ENQUEUE_MANY for a single job, with scalar parameters: the same rows, but no arrays to
# unnest and materialize, which is a quarter of a lone enqueue's time on an idle server
# (measured: 1.33 ms against 1.08 ms). New rows are invisible to claims until commit.
_ENQUEUE_ONE_CTES = f"""
WITH jobs AS (
    INSERT INTO livepush_jobs AS j (queue, name, priority, run_at, state, max_attempts, group_id)
    VALUES (%(queue)s, %(name)s, %(priority)s, coalesce(%(run_at)s::timestamptz, now()),
            CASE WHEN %(run_at)s::timestamptz > now() THEN 'scheduled' ELSE 'available' END,
            %(max_attempts)s, %(group_id)s::bigint)
    RETURNING {_EVENT_COLUMNS.replace("p.progress, p.error", "NULL::jsonb AS progress, NULL::text AS error")}
), payloads AS (
    INSERT INTO livepush_job_payloads (id, args) SELECT id, %(args)s::jsonb FROM jobs
)
"""
ENQUEUE_ONE = _ENQUEUE_ONE_CTES + f"""
SELECT jobs.*, pg_notify('{READY_CHANNEL}', '') IS NULL AS _rang FROM jobs
"""

# name: enqueue_one_publishing
# ENQUEUE_ONE plus its "enqueued" event, as ENQUEUE_MANY_PUBLISHING (livepush_publish():
# the topic row's lock orders it, in the caller's transaction).
ENQUEUE_ONE_PUBLISHING = _ENQUEUE_ONE_CTES + f"""
SELECT jobs.id, jobs.name, pg_notify('{READY_CHANNEL}', '') IS NULL AS _rang,
       livepush_publish('job:' || jobs.id, {_event_sql("'enqueued'", "jobs")}) AS _offset
FROM jobs
"""

# name: claim
# Safe under concurrency: FOR UPDATE SKIP LOCKED hands each available row to exactly one
# claimer; the others skip it instead of waiting. The partial index covers only available
# rows in claim order, so the scan never wades through jobs others hold. The LIMIT is the
# claimer's free slots, never more. `excluded` holds names this runtime does not know.
# The "started" events follow in the completer's next batch (PUBLISH_STARTED).
# The claim commits asynchronously (set_config(..., true): this transaction only; the
# uncorrelated subquery runs once, before the scan): losing it in a crash only makes the
# job run again, and its random lease (livepush_job_lease(), sql/0006) keeps the forgotten
# claim's worker from matching any later claim. Why: sql/0006_async_claims.sql.
CLAIM = f"""
WITH picked AS (
    SELECT id FROM livepush_jobs
    WHERE state = 'available' AND queue = %(queue)s AND name <> ALL(%(excluded)s::text[])
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE livepush_jobs j
    SET state = 'running', attempt = j.attempt + 1, runtime_id = %(runtime_id)s,
        lease = livepush_job_lease()
    FROM picked WHERE j.id = picked.id
    RETURNING j.*
)
SELECT {_EVENT_COLUMNS}, j.priority, j.lease, j.cancel_requested, p.args
FROM claimed j JOIN livepush_job_payloads p ON p.id = j.id
ORDER BY j.priority, j.run_at, j.id
"""

# name: publish_started
# The "started" events of jobs this runtime claimed, published by the completer in the
# transaction of its next batch, before that batch's progress and outcomes (the claim
# itself stays a bare UPDATE, the shortest statement on the path to running a job).
# Fenced like WRITE_PROGRESS: only jobs still running under the lease the claim gave, and
# FOR SHARE makes a concurrent rescue wait for this transaction (or this one see its
# result), so "started" can never land after another writer's event for the job.
PUBLISH_STARTED = f"""
WITH live AS (
    SELECT {_EVENT_COLUMNS}
    FROM unnest(%(started_ids)b::bigint[], %(started_leases)b::bigint[]) AS u(id, lease)
    JOIN livepush_jobs j ON j.id = u.id AND j.lease = u.lease AND {_STILL_RUNNING}
    JOIN livepush_job_payloads p ON p.id = j.id
    ORDER BY j.id
    FOR SHARE OF j
)
SELECT livepush_publish_many(array_agg('job:' || l.id ORDER BY l.id),
                             array_agg({_event_sql("'started'", "l")} ORDER BY l.id))
FROM live l
"""

# name: complete
# One statement for a batch of outcomes. Fenced: a row changes only if it is still running
# under the lease the outcome names; the rest (rescued, cancelled, released elsewhere) are
# left alone and missing from the result, which the completer logs. The UPDATE locks each
# row, so a concurrent rescue or cancel of the same job either runs first (and this misses
# it) or waits for this one (and then finds it finished).
# kind: succeeded | retry (failed, may retry) | fail (failed for good) | cancelled | released
# A released job (draining runtime, unknown name) gives its attempt back.
_COMPLETE_CTES = f"""
WITH outcome AS (
    SELECT * FROM unnest(%(ids)b::bigint[], %(leases)b::bigint[], %(kinds)b::text[],
                         %(errors)b::text[], %(delays)b::float8[], %(progress)b::jsonb[])
         AS o(id, lease, kind, error, delay, progress)
), moved AS (
    UPDATE livepush_jobs j SET
        state = CASE
            WHEN o.kind = 'succeeded' THEN 'succeeded'
            WHEN j.cancel_requested OR o.kind = 'cancelled' THEN 'cancelled'
            WHEN o.kind = 'released' THEN 'available'
            WHEN o.kind = 'retry' AND j.attempt < j.max_attempts THEN 'scheduled'
            ELSE 'failed' END,
        run_at = CASE
            WHEN o.kind = 'retry' AND NOT j.cancel_requested AND j.attempt < j.max_attempts
                THEN now() + make_interval(secs => o.delay)
            WHEN o.kind = 'released' THEN now()
            ELSE j.run_at END,
        attempt = CASE WHEN o.kind = 'released' THEN j.attempt - 1 ELSE j.attempt END,
        finished_at = CASE
            WHEN o.kind IN ('succeeded', 'cancelled', 'fail') OR j.cancel_requested
                 OR (o.kind = 'retry' AND j.attempt >= j.max_attempts) THEN now() END,
        lease = NULL, runtime_id = NULL
    FROM outcome o JOIN livepush_job_payloads p ON p.id = o.id
    WHERE j.id = o.id AND j.lease = o.lease AND {_STILL_RUNNING}
    -- Each job's payload as `written` leaves it, computed here from the row read, so no
    -- later step joins `moved` back to anything: the planner cannot size a CTE, and a
    -- nested loop over two copies of it made a batch of 300 cost 90,000 comparisons.
    -- The state row's lock, taken here, orders this against every other payload writer
    -- (they lock it first too). (In RETURNING, j is the new version of the row.)
    RETURNING j.id, j.name, j.queue, j.state, j.attempt, j.max_attempts, j.run_at, j.group_id,
              coalesce(o.progress, p.progress) AS progress,
              CASE WHEN j.state = 'succeeded' THEN NULL ELSE coalesce(o.error, p.error) END AS error,
              o.kind AS kind,
              -- Write the payload only when it changes (a final progress, an error to keep or
              -- to clear): most jobs succeed with neither, and rewriting their row (arguments
              -- and all) would cost a row version and its WAL for nothing.
              (o.progress IS NOT NULL AND o.progress IS DISTINCT FROM p.progress
               OR CASE WHEN j.state = 'succeeded' THEN p.error IS NOT NULL
                       ELSE o.error IS NOT NULL AND o.error IS DISTINCT FROM p.error END) AS _write
), written AS (
    UPDATE livepush_job_payloads p SET error = m.error, progress = m.progress
    FROM moved m
    WHERE p.id = m.id AND m._write
)
"""
COMPLETE = _COMPLETE_CTES + f"""
SELECT {_EVENT_COLUMNS.replace("p.", "j.")}, j.kind
FROM moved j
ORDER BY j.id
"""

# name: complete_publishing
# COMPLETE plus each job's state event (none for a plain release), published by the same
# statement, so with an autocommit connection a batch of outcomes is one round trip and its
# events commit if and only if the outcomes do. Only for batches that need nothing else in
# their transaction (no progress to write first, no task group to count). Returns only what
# the completer counts (the events are already out).
COMPLETE_PUBLISHING = _COMPLETE_CTES + f"""
, done AS (
    SELECT {_EVENT_COLUMNS.replace("p.", "j.")}, j.kind FROM moved j
)
SELECT done.id, done.state, done.kind,
       (SELECT livepush_publish_many(array_agg('job:' || d.id ORDER BY d.id),
                                     array_agg({_event_sql(_STATE_EVENT_SQL.format(a="d"), "d")} ORDER BY d.id))
        FROM done d WHERE d.kind <> 'released' OR d.state = 'cancelled') AS _published
FROM done
ORDER BY done.id
"""

# name: write_progress
# Fenced like COMPLETE; FOR SHARE on the state rows makes a concurrent rescue or
# completion of the same job wait for this write (or this one wait for it), so a stale
# worker's progress never lands after another attempt took the job.
WRITE_PROGRESS = f"""
WITH live AS (
    SELECT j.id, u.progress
    FROM unnest(%(ids)b::bigint[], %(leases)b::bigint[], %(progress)b::jsonb[]) AS u(id, lease, progress)
    JOIN livepush_jobs j ON j.id = u.id AND j.lease = u.lease AND {_STILL_RUNNING}
    ORDER BY j.id
    FOR SHARE OF j
)
UPDATE livepush_job_payloads p SET progress = live.progress
FROM live WHERE p.id = live.id
RETURNING p.id
"""

# name: promote_scheduled
# Makes due scheduled jobs available. SKIP LOCKED: two runtimes promoting at once split
# the rows instead of queueing on each other's locks; each row flips once. Rings the
# doorbell (delivered at commit) when anything moved.
PROMOTE_SCHEDULED = f"""
WITH due AS (
    SELECT id FROM livepush_jobs
    WHERE state = 'scheduled' AND run_at <= now()
    ORDER BY run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE livepush_jobs j SET state = 'available'
    FROM due WHERE j.id = due.id
    RETURNING j.id
)
SELECT count(*) AS n, CASE WHEN count(*) > 0 THEN pg_notify('{READY_CHANNEL}', '') END IS NULL AS _rang
FROM moved
"""

# name: next_scheduled
NEXT_SCHEDULED = """
SELECT extract(epoch FROM min(run_at) - now()) FROM livepush_jobs WHERE state = 'scheduled'
"""

# name: register_runtime
REGISTER_RUNTIME = """
INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat)
VALUES (%(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(heartbeat)s)
RETURNING id
"""

# name: reregister_runtime
# A runtime that stalled past three beats was pruned; it comes back under its old id
# (ON CONFLICT: a beat racing another re-register is harmless). Its old jobs were released
# and their leases are gone, so whatever it still finishes is fenced off.
REREGISTER_RUNTIME = """
INSERT INTO livepush_job_runtimes (id, host, pid, queues, concurrency, heartbeat, state, in_hand)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(heartbeat)s, %(state)s, %(in_hand)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
"""

# name: beat
BEAT = """
UPDATE livepush_job_runtimes SET heartbeat_at = now(), state = %(state)s, in_hand = %(in_hand)s
WHERE id = %(id)s
"""

# name: deregister_runtime
DEREGISTER_RUNTIME = "DELETE FROM livepush_job_runtimes WHERE id = %(id)s"

# name: prune_dead_runtimes
# A runtime is dead when silent for three of its own beats. DELETE locks each row, so two
# runtimes pruning at once delete each dead row once; the loser finds nothing.
PRUNE_DEAD_RUNTIMES = """
DELETE FROM livepush_job_runtimes
WHERE heartbeat_at < now() - make_interval(secs => heartbeat * 3)
RETURNING id
"""

# name: rescue_orphans
# Releases running jobs whose runtime has no row (pruned above, or claimed by a runtime
# that was pruned mid-claim), counting the attempt (SPEC §4): back to available, or failed
# when that was the last attempt. Runs after PRUNE_DEAD_RUNTIMES committed, so a runtime's
# row is either there (alive, registered before it claimed) or gone for good. Row locks
# order this against a late completion of the same job: whichever comes second finds the
# state or lease changed and does nothing.
RESCUE_ORPHANS = f"""
WITH orphans AS (
    SELECT j.id FROM livepush_jobs j
    WHERE j.state = 'running'
      AND NOT EXISTS (SELECT 1 FROM livepush_job_runtimes r WHERE r.id = j.runtime_id)
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
), moved AS (
    UPDATE livepush_jobs j SET
        state = CASE WHEN j.cancel_requested THEN 'cancelled'
                     WHEN j.attempt >= j.max_attempts THEN 'failed'
                     ELSE 'available' END,
        finished_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN now() END,
        run_at = now(), lease = NULL, runtime_id = NULL
    FROM orphans WHERE j.id = orphans.id
    RETURNING j.*
), payload AS (
    -- Returns the moved row's columns too, so nothing joins two CTEs (a planner that cannot
    -- size them picks a nested loop, quadratic in the number of orphans).
    UPDATE livepush_job_payloads p SET error = %(error)s
    FROM moved j WHERE p.id = j.id
    RETURNING {_EVENT_COLUMNS}
)
SELECT *, CASE WHEN count(*) OVER () > 0 THEN pg_notify('{READY_CHANNEL}', '') END IS NULL AS _rang
FROM payload
ORDER BY id
"""

# name: cancel_requests_for
# Running jobs of this runtime whose cancel was requested: the heartbeat's fallback for a
# missed cancel notification.
CANCEL_REQUESTS_FOR = """
SELECT id FROM livepush_jobs WHERE state = 'running' AND runtime_id = %(runtime_id)s AND cancel_requested
"""

# name: release_all_of_runtime
# At deregistration: anything still running under this runtime's id goes back with its
# attempt given back (a drain did not spend it). Fenced by runtime_id and state.
RELEASE_ALL_OF_RUNTIME = f"""
WITH moved AS (
    UPDATE livepush_jobs j SET
        state = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'available' END,
        attempt = j.attempt - 1, run_at = now(), lease = NULL, runtime_id = NULL
    WHERE j.state = 'running' AND j.runtime_id = %(runtime_id)s
    RETURNING j.*
)
SELECT {_EVENT_COLUMNS} FROM moved j JOIN livepush_job_payloads p ON p.id = j.id ORDER BY j.id
"""

# name: cancel
# Queued jobs are cancelled on the spot; a running one is flagged and its runtime told
# (pg_notify, delivered at commit). The row lock orders this against a claim (SKIP LOCKED
# claimers skip a row being cancelled) and against completion.
CANCEL = f"""
WITH target AS (
    SELECT id, state FROM livepush_jobs WHERE id = %(id)s FOR UPDATE
), moved AS (
    UPDATE livepush_jobs j SET
        state = CASE WHEN t.state IN ('available', 'scheduled') THEN 'cancelled' ELSE j.state END,
        finished_at = CASE WHEN t.state IN ('available', 'scheduled') THEN now() ELSE j.finished_at END,
        cancel_requested = (t.state = 'running')
    FROM target t
    WHERE j.id = t.id AND t.state IN ('available', 'scheduled', 'running')
    RETURNING j.*
)
SELECT {_EVENT_COLUMNS},
       CASE WHEN j.state = 'running' THEN pg_notify('{CANCEL_CHANNEL}', j.id::text) END IS NULL AS _told
FROM moved j JOIN livepush_job_payloads p ON p.id = j.id
"""

# name: retry_failed
# A failed job gets a fresh set of attempts and runs again now. Only from 'failed'; the row
# lock makes two concurrent retries re-queue it once.
RETRY_FAILED = f"""
WITH moved AS (
    UPDATE livepush_jobs j SET state = 'available', attempt = 0, run_at = now(), finished_at = NULL,
                               cancel_requested = false
    WHERE j.id = %(id)s AND j.state = 'failed'
    RETURNING j.*
)
SELECT {_EVENT_COLUMNS}, pg_notify('{READY_CHANNEL}', '') IS NULL AS _rang
FROM moved j JOIN livepush_job_payloads p ON p.id = j.id
"""

def delete_topics_of_gone(kind: str) -> str:
    """CTEs deleting the `<kind>:<id>` topics (job, group) of the rows a statement deleted
    (a CTE `gone (id)`): their topic rows and any history left. A topic row is otherwise
    never deleted and every job and group has one, so the table (and the index each enqueue
    inserts into) grew by a row per job for good. A page resuming on such a topic gets
    `reset` (no row: older than the history kept), never a silent gap. The history is long
    pruned (TTL: minutes; retention: days); what is left, for a job discarded at once, goes."""
    return f"""
, topics AS (
    DELETE FROM livepush_topics t USING gone g WHERE t.topic = '{kind}:' || g.id
), history AS (
    DELETE FROM livepush_messages m USING gone g WHERE m.topic = '{kind}:' || g.id
)"""


# Every statement that deletes jobs ends with this: the jobs it deleted (a CTE `gone (id)`)
# take their payloads with them, in the same statement (no foreign key cascades it: sql/0008),
# and their topics. Returns the deleted ids.
DELETE_PAYLOADS_OF_GONE = """
, payloads AS (
    DELETE FROM livepush_job_payloads p USING gone g WHERE p.id = g.id
)""" + delete_topics_of_gone("job") + """
SELECT id FROM gone
"""

# name: discard_failed
# Deletes a failed job and its payload. Only from 'failed': the row lock makes a concurrent
# retry_failed either win (nothing deleted) or wait and find the job gone.
DISCARD_FAILED = """
WITH gone AS (
    DELETE FROM livepush_jobs WHERE id = %(id)s AND state = 'failed' RETURNING id
)""" + DELETE_PAYLOADS_OF_GONE

# name: job_state
JOB_STATE = f"""
SELECT {_EVENT_COLUMNS} FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
WHERE j.id = %(id)s
"""

# name: queues_with_due_jobs (tests: drain)
QUEUES_WITH_DUE_JOBS = "SELECT DISTINCT queue FROM livepush_jobs WHERE state = 'available'"

# name: clear (tests only)
CLEAR = "TRUNCATE livepush_job_payloads, livepush_jobs, livepush_job_runtimes"

# name: publish_many
# The Postgres fan-out's publish, for a whole batch in one call (sql/0005): as if
# livepush_publish() ran per event in array order (events of one job keep their order), with
# topic row locks taken in topic order so concurrent batches cannot deadlock. Runs in the
# caller's transaction, so events go out if and only if the state change they describe commits.
PUBLISH_MANY = """
SELECT livepush_publish_many(%(topics)s::text[], %(datas)s::text[])
"""
