"""Every SQL statement of durable jobs, named, with why it is safe under concurrency.

Tables: sql/0005_durable.sql (steps, signals); the job rows are sql/0003_jobs.sql's, the groups
of children sql/0004_groups.sql's (a group's `parent_id` is the job parked on it).

Fencing: every write of a run names its lease. A parking transaction first locks the job's row
with FENCE (its lease, still running), so from then on nothing else changes that row until the
transaction ends: a rescue or a cancel waits (or skips it), and a wake-up (a signal, the finish
of its children's group) waits for the park and then sees the job `waiting`. Whatever the
transaction reads after FENCE is read in a later statement, whose snapshot sees every change
committed by whoever held the row before: a signal sent or a group finished before the park is
seen by it, one after the park sees the park. So a job never parks on something that already
happened, and never sleeps through something that happens after it parked.
"""

from __future__ import annotations

from ..queries import TOUCH_RUNS, ring

# name: load_steps
# What earlier runs stored, read once per run (only for a job whose row says it has steps). A
# plain read: only this job's run, which holds the lease, writes its steps. `read_at` is Postgres'
# clock at the read: a replayed sleep that ended by then returns without a round trip of its own,
# and the app's clock, which may run ahead, decides nothing (durable.md: sleeps keep Postgres' time).
LOAD_STEPS = "SELECT kind, name, result, fingerprint, now() AS read_at FROM livepush_job_steps WHERE job_id = %(id)s"

# name: save_checkpoint
# One statement, in autocommit: the fenced update of the job's row (a new version, the
# `checkpoint` event; it locks the row, so a rescue of this job waits for it or goes first and
# makes it match nothing) and the step, inserted only if the fence held. ON CONFLICT: a name is
# stored once, whatever happens. Returns the value as jsonb spells it (its keys reordered, -0.0
# written as 0.0): the first run returns exactly what every replay will. `stored` false: the name
# was stored already (a store that lost its connection, committed after its retry looked), and
# the caller reads that result with STORED_CHECKPOINT: the one every replay returns.
SAVE_CHECKPOINT = f"""
WITH given AS (
    SELECT %(result)s::jsonb AS result
), fenced AS (
    UPDATE livepush_jobs j SET version = j.version + 1, event = 'checkpoint', has_steps = true
    WHERE j.id = %(id)s AND j.lease = %(lease)s AND j.state = 'running'
    RETURNING j.id, j.version
), saved AS (
    INSERT INTO livepush_job_steps (job_id, kind, name, result, fingerprint)
    SELECT f.id, 'checkpoint', %(name)s, g.result, %(fingerprint)s FROM fenced f CROSS JOIN given g
    ON CONFLICT (job_id, kind, name) DO NOTHING
    RETURNING 1
), rung AS ({ring("fenced")})
SELECT f.id, g.result -> 'value' AS value, EXISTS (SELECT 1 FROM saved) AS stored
FROM fenced f CROSS JOIN given g CROSS JOIN rung
"""

# name: stored_checkpoint
# After a SAVE_CHECKPOINT that found its name stored: that result and its input's fingerprint. A
# later statement, so it sees the row that conflicted (committed, or the insert would have waited).
STORED_CHECKPOINT = """
SELECT result -> 'value' AS value, fingerprint FROM livepush_job_steps
WHERE job_id = %(id)s AND kind = 'checkpoint' AND name = %(name)s
"""

# name: fence
# The first statement of every parking transaction: locks the running job's row (its lease),
# and reads whether a cancel was requested and the database's clock (deadlines and sleeps are
# in its time, the time the promoter compares with).
FENCE = """
SELECT cancel_requested, now() AS now FROM livepush_jobs
WHERE id = %(id)s AND lease = %(lease)s AND state = 'running'
FOR UPDATE
"""

# name: save_step
# A step of a parking call (children, signal, sleep), under FENCE's lock: inserted, or replaced
# (a signal wait's deadline becomes what it received).
SAVE_STEP = """
WITH saved AS (
    INSERT INTO livepush_job_steps (job_id, kind, name, result)
    VALUES (%(id)s, %(kind)s, %(name)s, %(result)s::jsonb)
    ON CONFLICT (job_id, kind, name) DO UPDATE SET result = EXCLUDED.result, at = clock_timestamp()
)
UPDATE livepush_jobs SET has_steps = true WHERE id = %(id)s AND NOT has_steps
"""

# name: park
# Under FENCE's lock: the run ends and the job waits, holding no slot: its lease and runtime go
# (whatever the run still writes is fenced off), its attempt is given back (parking is not a
# failure: the run that wakes is the same attempt), `run_at` is when the promoter wakes it
# ('infinity' when only an event can). The payload keeps what it waits for and the latest progress:
# this run's, or one an earlier run of this attempt reported. Not an earlier attempt's (a retry
# that parks before reporting any): with the attempt given back it would show as the parked
# run's (events/views.py), stale progress of a failed attempt shown as current.
# A workflow step's park also makes a new version of its run's state topic; `run_touched` < 0
# says its run has finished (the caller then rolls the park back: a step never waits in a run
# that ended, whose end could not stop it while this transaction held the job).
PARK = f"""
WITH moved AS (
    UPDATE livepush_jobs j SET state = 'waiting', event = 'waiting', attempt = j.attempt - 1,
        run_at = coalesce(%(until)s::timestamptz, 'infinity'), lease = NULL, runtime_id = NULL,
        version = j.version + 1, has_steps = true
    WHERE j.id = %(id)s AND j.lease = %(lease)s AND j.state = 'running'
    RETURNING j.id, j.version, j.workflow_id, j.attempt
), payload AS (
    -- m.attempt is the attempt given back: progress stored with it or an older one is not this run's.
    UPDATE livepush_job_payloads p SET waiting = %(waiting)s::jsonb,
        progress = CASE WHEN %(progress)s::jsonb IS NOT NULL THEN %(progress)s::jsonb
                        WHEN (p.progress ->> 'attempt')::int <= m.attempt THEN NULL
                        ELSE p.progress END
    FROM moved m WHERE p.id = m.id
), rung AS ({ring("moved")}
), run AS ({TOUCH_RUNS.format(rel="moved")})
SELECT m.id, run.n AS run_touched FROM moved m CROSS JOIN rung CROSS JOIN run
"""

# name: group_finished
# Whether the group of children has finished (a plain read: after FENCE in a parking
# transaction, see the module docstring).
GROUP_FINISHED = "SELECT finished_at IS NOT NULL AS finished FROM livepush_groups WHERE id = %(group_id)s"

# name: children
# The first `count` members of a finished group of children, in the order they were asked for
# (the parking statement inserted them with ascending ids; members they added themselves come
# later). A plain read: they are all terminal and no longer change.
CHILDREN = """
SELECT j.id, j.name, j.state, p.result, p.error
FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
WHERE j.group_id = %(group_id)s
ORDER BY j.id
LIMIT %(count)s
"""

# name: take_signal
# Under FENCE's lock: the oldest signal of that name sent to this job, taken (deleted) in the
# transaction that stores it as the wait's result, so it is delivered exactly once. Only this
# job's run, holding the lock, takes its signals.
TAKE_SIGNAL = """
DELETE FROM livepush_job_signals
WHERE id = (SELECT id FROM livepush_job_signals WHERE job_id = %(id)s AND name = %(name)s ORDER BY id LIMIT 1)
RETURNING data
"""

# name: signal_target
# jobs.signal, first statement: a KEY SHARE lock on the job's row, which a parking run's FENCE
# (FOR UPDATE) waits for and which waits for it: a park and a signal are ordered. It does not
# conflict with the plain updates of a running job (outcome, progress, checkpoint), so a caller
# that keeps its transaction open after jobs.signal(conn=) holds up nothing but a park. Tells
# whether the job exists and is not finished, and whether it runs a workflow's step.
SIGNAL_TARGET = "SELECT state, workflow_id FROM livepush_jobs WHERE id = %(id)s FOR KEY SHARE"

# Whether job `id` (a workflow step's) still waits for its first signal `name` (the step's
# wait_for=): no answer stored for that wait (a signal it took, or its timeout), and none sent to
# it that it has not taken yet. A step that got its signal takes no second one: that one is for
# the next step waiting for the name.
_AWAITS = """(NOT EXISTS (SELECT 1 FROM livepush_job_steps s
                    WHERE s.job_id = %(id)s AND s.kind = 'signal' AND s.name = '0:' || %(name)s
                      AND (s.result ? 'data' OR s.result ? 'timeout'))
    AND NOT EXISTS (SELECT 1 FROM livepush_job_signals g WHERE g.job_id = %(id)s AND g.name = %(name)s))"""

# name: awaits_signal
# jobs.workflows.signal, looking for the step to signal (no lock: the target is checked again
# under SIGNAL_TARGET_AWAITING's).
AWAITS_SIGNAL = f"SELECT {_AWAITS} AS waits"

# name: awaits_only_signal
# jobs.workflows.signal, after it sent signal `signal_id` to job `id` and then took the run's row
# (workflows/queries.py: LOCK_RUN_FOR_SIGNAL), in a later statement that sees what a signal sent
# before it committed: whether the job still waits for its first signal `name` with this one as
# the only one sent to it. False: another reached it first, and the caller takes this one back.
AWAITS_ONLY_SIGNAL = """
SELECT NOT EXISTS (SELECT 1 FROM livepush_job_steps s
                   WHERE s.job_id = %(id)s AND s.kind = 'signal' AND s.name = '0:' || %(name)s
                     AND (s.result ? 'data' OR s.result ? 'timeout'))
   AND NOT EXISTS (SELECT 1 FROM livepush_job_signals g
                   WHERE g.job_id = %(id)s AND g.name = %(name)s AND g.id <> %(signal_id)s) AS waits
"""

# name: signal_target_awaiting
# jobs.workflows.signal: SIGNAL_TARGET (the same lock, for the same reason), and whether the job
# still waits for signal `name`.
SIGNAL_TARGET_AWAITING = f"SELECT j.state, {_AWAITS} AS waits FROM livepush_jobs j WHERE j.id = %(id)s FOR KEY SHARE"

# name: keyed_signal
# jobs.signal(key=), under SIGNAL_TARGET's lock: the id of the signal sent to job `id` with this key,
# if one was. A plain read: a send of the same key not yet committed is met by SEND_SIGNAL's insert
# of the key, which waits for it.
KEYED_SIGNAL = "SELECT signal_id, name FROM livepush_job_signal_keys WHERE job_id = %(id)s AND key = %(key)s"

# name: send_signal
# jobs.signal, after SIGNAL_TARGET (a new snapshot: a park that held the row before is seen): keeps
# the signal, and makes the job available if it is parked waiting for a signal of that name; it
# takes the signal when it runs. Rings its topic and the runtimes' doorbell at commit.
# With a key, the key is inserted first, with the signal's id: a send of the same key by another
# transaction, not yet committed, makes this insert wait for its end on the key's primary key;
# once that one committed, this one inserts nothing, sends nothing and wakes nothing (signal_id
# null: the caller reads the first one's id with KEYED_SIGNAL, in a later statement that sees it),
# so a key is sent once however many sends race.
SEND_SIGNAL = f"""
WITH keyed AS (
    INSERT INTO livepush_job_signal_keys (job_id, key, signal_id, name)
    SELECT %(id)s, %(key)s::text, nextval('livepush_job_signals_id_seq'), %(name)s WHERE %(key)s::text IS NOT NULL
    ON CONFLICT (job_id, key) DO NOTHING
    RETURNING signal_id
), sent AS (
    INSERT INTO livepush_job_signals (id, job_id, name, data)
    SELECT coalesce((SELECT signal_id FROM keyed), nextval('livepush_job_signals_id_seq')), %(id)s, %(name)s,
           %(data)s::jsonb
    WHERE %(key)s::text IS NULL OR EXISTS (SELECT 1 FROM keyed)
    RETURNING id
), woken AS (
    UPDATE livepush_jobs j SET state = 'available', event = 'enqueued', run_at = now(), version = j.version + 1
    FROM livepush_job_payloads p
    WHERE j.id = %(id)s AND p.id = j.id AND j.state = 'waiting' AND EXISTS (SELECT 1 FROM sent)
      AND p.waiting ->> 'for' = 'signal' AND p.waiting ->> 'name' = %(name)s
    RETURNING j.id, j.version, j.workflow_id
), rung AS ({ring("woken")}
), run AS ({TOUCH_RUNS.format(rel="woken")})
SELECT (SELECT id FROM sent) AS signal_id,
       CASE WHEN EXISTS (SELECT 1 FROM woken) THEN livepush_jobs_ready() ELSE 0 END AS woke
FROM rung CROSS JOIN run
"""
