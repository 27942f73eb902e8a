"""Every SQL statement of task groups, named, with why it is safe under concurrency.

Tables: sql/0004_groups.sql. Members are rows of livepush_jobs with `group_id` = the group;
callbacks carry `callback_of` = the group (never counted).

The group's state topic: its version is the group row's `version` plus the sum of its shards'
`version`s. Every statement that writes a group or shard row adds one to that row's version, so
the sum grows with every change and is read in the same snapshot as the counts (GROUP_VIEWS).
Lifecycle changes (created, sealed, cancelled, finished) ring `group:<id>` in their statement;
progress is rung by the runtime's progress publisher at most ~10 times a second per group.

Lock order (every transaction that touches groups takes its locks in this order, so no two
can wait on each other in a cycle):

    member job rows  ->  shard rows (sorted by group, shard)  ->  group rows (sorted by id)

- a member's outcome (completer, cancel, rescue): job rows (COMPLETE), then COUNT_OUTCOMES
  locks its shard rows in sorted order, then, only if a shard drained, LOCK_GROUPS;
- an add (block, add_to_group, ctx.group.enqueue): the adding member's row (FENCE_MEMBER,
  for ctx.group.enqueue), new job rows (invisible to others), ADD_PENDING (shards), then
  ADD_TOTAL (the group row, where the state and the member limit are checked);
- seal and cancel lock the group row only (then read, never lock, the shards); but a seal in
  a caller's transaction that is not READ COMMITTED first share-locks the shards (SEAL_SHARDS);
- a progress recorder (the progress publisher, an operator's cancel) locks group rows
  FOR NO KEY UPDATE, sorted, and nothing after them but the runs RING_GROUPS touches.
Nobody who holds a group row lock goes on to lock a shard, or a job row other than the parked
parent a finishing group wakes (FINISH_GROUPS: woken, which says why that is safe).

Finishing (the one race that matters): a group finishes in the transaction that (a) holds
its row lock and (b) then, in a LATER statement, reads the sum of pending over all shards as
0 while the group is sealed (or cancelled). Under READ COMMITTED each statement takes a new
snapshot, so the read in (b) sees every transaction that held the group lock before us as
committed. Every transaction that could make the group finishable takes that lock after its
own change: a member whose outcome drains a shard (the last pending member of a shard is
well defined: the shard row's lock orders the decrements), the seal, the cancel. Whichever
of them takes the lock last sees all the others' changes and finishes the group; the ones
before it see something still pending (or the group still open) and do nothing. FINISH_GROUPS
itself only moves a group whose finished_at is NULL, and the callbacks' unique key (group,
kind) makes a second enqueue impossible even if that check were wrong.

Adding from inside: a running member M adding a member counts it pending in its own
transaction while M itself is still pending (M is not finished until its outcome commits,
and FENCE_MEMBER's share lock on M makes that outcome, a rescue or a cancel wait for the add).
So the sum of pending never reaches 0 between the add and M's outcome.
"""

from __future__ import annotations

from ..queries import _COMPLETE_CTES, DELETE_PAYLOADS_OF_GONE, TOUCH_RUNS, ring

# Members with consecutive ids share a shard in blocks of this many: a runtime claims
# members in id order, so one completer batch mostly touches one or two shard rows, and two
# runtimes working on different blocks rarely wait for each other's shard locks. (Plain
# `id % shards` would put every batch of 16+ members on all 16 rows, which serializes the
# completers again.)
SHARD_STRIDE = 32


def _shard_of(member_id: str, shards: str) -> str:
    """SQL for a member's shard: blocks of SHARD_STRIDE consecutive ids, round robin."""
    return f"mod({member_id} / {SHARD_STRIDE}, {shards})"

_VIEW_COLUMNS = """
    g.id, g.state, g.total, g.finished_at, g.created_at, g.sealed_at, g.cancelled_at,
    coalesce(c.pending, 0)::int AS pending, coalesce(c.succeeded, 0)::int AS succeeded,
    coalesce(c.failed, 0)::int AS failed, coalesce(c.cancelled, 0)::int AS cancelled,
    g.version + coalesce(c.version, 0) AS version,
    CASE WHEN g.finished_at IS NOT NULL THEN 'finished' WHEN g.state = 'cancelled' THEN 'cancelled'
         WHEN coalesce(c.succeeded + c.failed + c.cancelled, 0) > 0 THEN 'progress' ELSE g.event END AS event
"""

_COUNTS = """
    SELECT group_id, sum(pending) AS pending, sum(succeeded) AS succeeded,
           sum(failed) AS failed, sum(cancelled) AS cancelled, sum(version) AS version
    FROM livepush_group_shards WHERE group_id = ANY(%(ids)s::bigint[]) GROUP BY group_id
"""


def ring_groups(rel: str) -> str:
    """A CTE body that rings the `group:<id>` topics of the groups in `rel` (column id); the
    version is left out (it is a sum the ring does not have at hand)."""
    return f"SELECT livepush_state_changed(array_agg('group:' || r.id ORDER BY r.id), NULL) AS n FROM {rel} r"

# name: reserve_group_id
# Sequences are not transactional: an id reserved by a block that then raises is simply unused.
RESERVE_GROUP_ID = "SELECT nextval('livepush_groups_id_seq')"

# name: create_group
# A new row and its shard rows; invisible to everyone until commit, so nothing to race with.
CREATE_GROUP = f"""
WITH g AS (
    INSERT INTO livepush_groups (id, shards, on_finish, on_success, on_failure, parent_id)
    VALUES (%(id)s, %(shards)s, %(on_finish)s, %(on_success)s, %(on_failure)s, %(parent_id)s)
    RETURNING id, shards
), s AS (
    INSERT INTO livepush_group_shards (group_id, shard)
    SELECT g.id, n FROM g, generate_series(0, g.shards - 1) AS n
), rung AS ({ring_groups("g")})
SELECT g.id FROM g CROSS JOIN rung
"""

# name: fence_member
# ctx.group.enqueue: the adding member must still hold its claim (same lease, running). FOR
# SHARE keeps it so until the add commits: the member's own outcome (COMPLETE updates the
# row), a rescue (FOR UPDATE SKIP LOCKED skips it) or a cancel all wait or pass it by, so the
# member stays pending, and its group unfinished, while its new member is being counted.
FENCE_MEMBER = """
SELECT group_id FROM livepush_jobs
WHERE id = %(id)s AND lease = %(lease)s AND state = 'running' AND group_id IS NOT NULL
FOR SHARE
"""

# name: add_pending
# Counts new members as pending on their shards. Shard rows are locked in (shard) order
# (the MATERIALIZED CTE sorts before it locks), the same order COUNT_OUTCOMES uses, so an
# add and a batch of outcomes never deadlock. The group row is read, not locked (its
# `shards` never changes); it is locked after this, by ADD_TOTAL.
ADD_PENDING = f"""
WITH input AS (
    SELECT {_shard_of("u.id", "g.shards")} AS shard, count(*)::int AS n
    FROM unnest(%(ids)s::bigint[]) AS u(id), livepush_groups g
    WHERE g.id = %(group_id)s
    GROUP BY 1
), locked AS MATERIALIZED (
    SELECT s.shard FROM livepush_group_shards s JOIN input i ON i.shard = s.shard
    WHERE s.group_id = %(group_id)s
    ORDER BY s.shard
    FOR UPDATE OF s
)
UPDATE livepush_group_shards s SET pending = s.pending + i.n, version = s.version + 1
FROM input i JOIN locked l ON l.shard = i.shard
WHERE s.group_id = %(group_id)s AND s.shard = i.shard
"""

# name: add_total
# The last lock an add takes: the group row. Checks, under that lock, that the group still
# takes members in this way (`states`) and that the limit holds; a concurrent seal or cancel
# either committed first (then the re-checked WHERE fails and the add is refused, rolling
# back its pending counts) or waits for this add and then sees its members pending.
# `seal` seals in the same statement (the `jobs.group()` block).
# `ring`: 'now' rings the group (the block's `created`); 'later' leaves it to the caller's
# runtime, whose progress publisher is marked after the commit (ctx.group.enqueue); 'coalesced'
# (add_to_group) rings now unless the group recorded an event in the last 100 ms, and otherwise
# rings the runtimes' `livepush_groups_progress` doorbell, whose publishers ring the change (the
# trailing edge). `rung` says which: the caller records the `progress` event only if rung. Two
# adds at once may both ring, which is only one ring more. In a caller's REPEATABLE READ or
# SERIALIZABLE transaction a coalesced add never rings itself: its reads see the shards as they were
# when that transaction began, so the event it recorded could show members that finished since as
# pending, older counts after the newer ones recorded meanwhile; the publishers read afresh.
# An add of no member (an empty list, or items whose keys jobs outside the group hold) still locks
# the row and re-checks the state, so that a closed group refuses it as any add, but changes
# nothing a page sees: no new version, no ring, no event (unless it seals).
ADD_TOTAL = f"""
WITH added AS (
UPDATE livepush_groups SET
    total = total + %(n)s,
    state = CASE WHEN %(seal)s THEN 'sealed' ELSE state END,
    sealed_at = CASE WHEN %(seal)s THEN now() ELSE sealed_at END,
    version = version + CASE WHEN %(n)s > 0 OR %(seal)s THEN 1 ELSE 0 END,
    -- The block (created, filled and sealed at once) is still its `created` event.
    event = CASE WHEN %(seal)s OR %(n)s = 0 THEN event ELSE 'progress' END
WHERE id = %(group_id)s AND state = ANY(%(states)s::text[]) AND finished_at IS NULL
  AND total + %(n)s <= %(limit)s
RETURNING id, total, state
), due AS (
    SELECT a.id, CASE
        WHEN %(ring)s::text = 'now' THEN true
        WHEN %(ring)s::text = 'later' OR %(n)s = 0 THEN false
        WHEN current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN false
        -- The newest event through the primary key, read backwards: one row however many.
        ELSE coalesce((SELECT e.at FROM livepush_group_events e WHERE e.group_id = a.id
                       ORDER BY e.seq DESC LIMIT 1) <= statement_timestamp() - interval '100 milliseconds', true)
    END AS rung
    FROM added a
), rung AS ({ring_groups("(SELECT id FROM due WHERE rung)")}
), doorbell AS (
    SELECT livepush_groups_unrung(array_agg(d.id)) AS n FROM due d
    WHERE NOT d.rung AND %(ring)s::text = 'coalesced' AND %(n)s > 0
)
SELECT a.total, a.state, d.rung FROM added a JOIN due d ON d.id = a.id CROSS JOIN rung CROSS JOIN doorbell
"""

# name: child_groups
# The unfinished groups of children that `ids` (jobs just cancelled) were parked on: cancelling
# a waiting job cancels them (cancel.py). A plain read: cancel_group re-checks each under its lock.
CHILD_GROUPS = """
SELECT id FROM livepush_groups
WHERE parent_id = ANY(%(ids)s::bigint[]) AND finished_at IS NULL AND state IN ('open', 'sealed')
ORDER BY id
"""

# A cancelled, unfinished group `g` whose cancel did not get through: a member still queued,
# parked, or running untold; or nothing pending at all, so that only the cancel's own finish could
# have finished it (no member's outcome ever will). A group whose members were all cancelled or
# told, some still running, is left alone: it finishes when the running ones end.
_CANCEL_UNDONE = """g.state = 'cancelled' AND (EXISTS (
           SELECT 1 FROM livepush_jobs m WHERE m.group_id = g.id
             AND (m.state IN ('available', 'scheduled', 'waiting') OR m.state = 'running' AND NOT m.cancel_requested))
         OR NOT EXISTS (SELECT 1 FROM livepush_group_shards s WHERE s.group_id = g.id AND s.pending > 0))"""

# name: orphaned_child_groups
# Groups of children whose parent job has finished while they had not: the parent will never
# read them (a workflow run that ended stopped its parked fan-out step, or a cancel whose
# cancel_children did not get to run, or failed part-way: the group marked cancelled, members
# still queued, parked, or running untold). The heartbeat cancels them (runtime/maintenance.py;
# cancel_group works a cancelled, unfinished group through again). A plain read (the member check
# through the group index): cancel_group re-checks each under its lock.
ORPHANED_CHILD_GROUPS = f"""
SELECT g.id FROM livepush_groups g JOIN livepush_jobs p ON p.id = g.parent_id
WHERE g.parent_id IS NOT NULL AND g.finished_at IS NULL
  AND (g.state IN ('open', 'sealed') OR {_CANCEL_UNDONE})
  AND p.state IN ('succeeded', 'failed', 'cancelled')
ORDER BY g.id
LIMIT %(limit)s
"""

# name: cut_off_cancels
# Groups of any kind whose cancel_group was cut off after its mark committed (its caller died or
# lost its connection, and nobody called it again): marked cancelled more than `grace` seconds
# ago, members still queued or running untold, which would otherwise run as if no cancel had come,
# or nothing pending and no finish, which would never come.
# The heartbeat works them through again (runtime/maintenance.py). The grace leaves a cancel still
# under way to its own caller: each would finish the job anyway (CANCEL_MEMBERS locks members in
# id order, so two never wait for each other in a circle), but the caller's call could return
# while the other still held some of its members. A plain read through the partial index of
# cancelled, unfinished groups (sql/0004_groups.sql): cancel_group re-checks each under its lock.
CUT_OFF_CANCELS = f"""
SELECT g.id FROM livepush_groups g
WHERE g.state = 'cancelled' AND g.finished_at IS NULL
  AND g.cancelled_at < now() - make_interval(secs => %(grace)s) AND {_CANCEL_UNDONE}
ORDER BY g.id
LIMIT %(limit)s
"""

# name: group_row (why an add or seal was refused; plain read)
GROUP_ROW = "SELECT id, state, total, finished_at FROM livepush_groups WHERE id = %(id)s"

# name: seal_shards
# Before SEAL, in a caller's transaction (seal_group(conn=)) under REPEATABLE READ or SERIALIZABLE
# only (the condition is on the session, so under READ COMMITTED no row is read or locked).
# There every statement reads the transaction's first snapshot, so FINISH_GROUPS would read the
# shards as they were then: a member that finished since would still look pending, and the group
# would stay sealed with nothing pending, its callbacks never run. Share-locking the shards makes
# Postgres refuse the transaction (a serialization failure: the caller runs it again) if one of
# them changed since that snapshot, and keeps them unchanged until it commits, so the counts it
# reads are the latest. Shards before the group row: the lock order above.
SEAL_SHARDS = """
SELECT shard FROM livepush_group_shards
WHERE group_id = %(id)s AND current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted')
ORDER BY shard
FOR SHARE
"""

# name: seal
# Locks the group row and seals it; the caller then runs FINISH_GROUPS in a later statement
# (see the module docstring: the read of pending must come after the lock).
SEAL = f"""
WITH sealed AS (
    UPDATE livepush_groups SET state = 'sealed', sealed_at = now(), version = version + 1, event = 'progress'
    WHERE id = %(id)s AND state = 'open'
    RETURNING id
), rung AS ({ring_groups("sealed")})
SELECT s.id FROM sealed s CROSS JOIN rung
"""

# name: count_outcomes
# One statement per batch of members that just reached a terminal state, in the transaction
# that moved them. Shard rows are locked in (group, shard) order before they are updated
# (MATERIALIZED: the sort happens before the locks). Two batches on one shard serialize on
# its row, so exactly one of them sees pending reach 0: that one (and only such a one) goes
# on to lock the group (LOCK_GROUPS) and check whether the group is done. Returns, per
# shard touched, its new pending count.
# `_count_ctes` is this statement's body, fed from any set of (id, group_id, state) rows:
# COUNT_OUTCOMES feeds it parameters, COMPLETE_COUNTING the rows its completion returned.
def _count_ctes(source: str, where: str = "") -> str:
    return f"""
input AS (
    SELECT u.group_id, {_shard_of("u.id", "g.shards")} AS shard,
           count(*)::int AS n,
           count(*) FILTER (WHERE u.state = 'succeeded')::int AS succeeded,
           count(*) FILTER (WHERE u.state = 'failed')::int AS failed,
           count(*) FILTER (WHERE u.state = 'cancelled')::int AS cancelled
    FROM {source}
    JOIN livepush_groups g ON g.id = u.group_id
    {where}
    GROUP BY 1, 2
), locked AS MATERIALIZED (
    SELECT s.group_id, s.shard FROM livepush_group_shards s
    JOIN input i ON i.group_id = s.group_id AND i.shard = s.shard
    ORDER BY s.group_id, s.shard
    FOR UPDATE OF s
), counted AS (
    UPDATE livepush_group_shards s SET
        version = s.version + 1,
        pending = s.pending - i.n,
        succeeded = s.succeeded + i.succeeded,
        failed = s.failed + i.failed,
        cancelled = s.cancelled + i.cancelled
    FROM input i JOIN locked l ON l.group_id = i.group_id AND l.shard = i.shard
    WHERE s.group_id = i.group_id AND s.shard = i.shard
    RETURNING s.group_id, s.shard, s.pending
)"""


COUNT_OUTCOMES = "WITH " + _count_ctes(
    "unnest(%(ids)s::bigint[], %(group_ids)s::bigint[], %(states)s::text[]) AS u(id, group_id, state)"
) + """
SELECT group_id, shard, pending FROM counted
"""

# name: complete_counting
# The completer's batch when it holds group members or workflow steps (whose ends the caller then
# records in the same transaction: workflows/engine.steps_ended): jobs' COMPLETE (with its rings), then
# COUNT_OUTCOMES over the members COMPLETE just made terminal (its RETURNING rows), in ONE
# statement, run inside the completer's transaction (BEGIN is pipelined with it: one round trip).
# Safe as the statements it replaces: the member rows are locked first (by `moved`; `input`
# aggregates all of them before `locked` sorts and locks shard rows), then the shard rows in
# (group, shard) order: the lock order of the module docstring. Each shard's decrement is still
# ordered by its row lock (a concurrent holder is waited for and its committed row re-read, as in
# COUNT_OUTCOMES), so exactly one batch sees a shard reach 0. It does NOT finish groups: the
# shards it counted are returned (first row's `_shards`, a JSON list of {group_id, shard,
# pending}) and the caller runs LOCK_GROUPS and FINISH_GROUPS afterwards, in the same
# transaction, as separate statements (the fresh snapshot after the lock that exactly-once
# rests on).
COMPLETE_COUNTING = _COMPLETE_CTES + f"""
, {_count_ctes("moved u", "WHERE u.group_id IS NOT NULL AND u.state IN ('succeeded', 'failed', 'cancelled')")}
, shards AS MATERIALIZED (
    SELECT coalesce(jsonb_agg(jsonb_build_object('group_id', c.group_id, 'shard', c.shard,
                                                 'pending', c.pending)
                              ORDER BY c.group_id, c.shard), '[]'::jsonb) AS list
    FROM counted c
)
SELECT m.id, m.state, m.group_id, m.kind, m.workflow_id, m.result, m.error,
       CASE WHEN m.id = (SELECT min(d.id) FROM moved d) THEN (SELECT list FROM shards) END AS _shards
FROM moved m CROSS JOIN rung
ORDER BY m.id
"""

# name: lock_groups
# FOR UPDATE, in id order (two finishers of two groups never deadlock). Runs alone: the
# statement after it takes a fresh snapshot that sees every earlier holder's commit.
LOCK_GROUPS = "SELECT id FROM livepush_groups WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR UPDATE"

# name: finish_groups
# Runs right after LOCK_GROUPS (or SEAL, or CANCEL_MARK) in the same transaction, with the
# group rows locked. A group is finished when it is sealed or cancelled, not yet finished,
# and no member of any shard is pending (read in this statement's snapshot, taken after the
# lock). In the same statement its callbacks are enqueued: one key row per (group, kind)
# first, ON CONFLICT DO NOTHING, and a job only for the keys actually inserted, so a callback
# exists at most once even if this statement ran twice for a group; it runs at least once
# because the transaction that makes the group finishable always gets here (module docstring).
# on_finish always; on_success when every member succeeded and the group was not cancelled;
# on_failure otherwise. Callback jobs carry callback_of = the group (never counted in it), ring
# their own topics at version 1 and the runtimes' doorbell.
# A durable job parked on a group (its parent_id) is made available again in the same statement
# (the `woken` CTE says why that cannot miss a parent that is parking right now).
FINISH_GROUPS = f"""
WITH counts AS ({_COUNTS}
), done AS (
    -- Conditions on the target row itself (not a self-join): we hold its lock, and a
    -- self-joined copy would be read from the statement's snapshot, not re-checked.
    UPDATE livepush_groups g SET
        state = CASE WHEN g.state = 'cancelled' THEN 'cancelled' ELSE 'finished' END,
        finished_at = now(), version = g.version + 1
    FROM counts c
    WHERE g.id = c.group_id AND g.id = ANY(%(ids)s::bigint[])
      AND g.state IN ('sealed', 'cancelled') AND g.finished_at IS NULL
      AND c.pending = 0
    RETURNING g.id, g.state, g.total, g.finished_at, g.created_at, g.sealed_at, g.cancelled_at,
              g.on_finish, g.on_success, g.on_failure, g.parent_id,
              c.pending::int AS pending, c.succeeded::int AS succeeded,
              c.failed::int AS failed, c.cancelled::int AS cancelled,
              g.version + c.version AS version, 'finished' AS event
), due AS (
    SELECT nextval('livepush_jobs_id_seq') AS job_id, d.id AS group_id, k.kind, k.spec
    FROM done d CROSS JOIN LATERAL (VALUES
        ('finish', d.on_finish),
        ('success', CASE WHEN d.state <> 'cancelled' AND d.failed = 0 AND d.cancelled = 0 THEN d.on_success END),
        ('failure', CASE WHEN d.state = 'cancelled' OR d.failed > 0 OR d.cancelled > 0 THEN d.on_failure END)
    ) AS k(kind, spec)
    WHERE k.spec IS NOT NULL
), keyed AS (
    INSERT INTO livepush_group_callbacks (group_id, kind, job_id)
    SELECT group_id, kind, job_id FROM due
    ON CONFLICT (group_id, kind) DO NOTHING
    RETURNING job_id
), jobs AS (
    INSERT INTO livepush_jobs (id, queue, name, priority, state, max_attempts, callback_of, limited,
                               concurrency_key)
    SELECT due.job_id, due.spec->>'queue', due.spec->>'name', (due.spec->>'priority')::int, 'available',
           (due.spec->>'max_attempts')::int, due.group_id,
           -- A group made by an older livepush stored no limits with its callbacks: unlimited.
           coalesce((due.spec->>'limited')::boolean, false), due.spec->>'concurrency_key'
    FROM due JOIN keyed USING (job_id)
    RETURNING id, version
), payloads AS (
    INSERT INTO livepush_job_payloads (id, args)
    SELECT due.job_id, due.spec->'args' FROM due JOIN keyed USING (job_id)
), woken AS (
    -- The parked parent runs again. Its row is locked here, after the group rows (the lock order
    -- of the module docstring, extended: group rows -> their parents' job rows). Parking locks
    -- the parent, then reads its group without a lock. A parent may itself be a member of another
    -- group whose shard this statement's transaction holds, and a cancel of that parent locks it,
    -- then that shard: Postgres breaks such a deadlock, and both sides run again (the completer,
    -- and jobs.cancel through transactions.in_tx). The filter keeps `running` on purpose: a parent that is
    -- parking right now is running in this statement's snapshot, so the UPDATE waits for its
    -- transaction and then re-reads the row, finding it `waiting` (the CASEs are evaluated on the
    -- row as the parking left it). A parent that read the group as unfinished before this
    -- commits therefore always wakes; one that reads it later sees it finished and does not park.
    UPDATE livepush_jobs j SET
        state = CASE WHEN j.state = 'waiting' THEN 'available' ELSE j.state END,
        event = CASE WHEN j.state = 'waiting' THEN 'enqueued' ELSE j.event END,
        run_at = CASE WHEN j.state = 'waiting' THEN now() ELSE j.run_at END,
        version = CASE WHEN j.state = 'waiting' THEN j.version + 1 ELSE j.version END
    FROM done d
    WHERE j.id = d.parent_id AND j.state IN ('waiting', 'running')
    RETURNING j.id, j.version, j.state, j.workflow_id
), rung AS (
    SELECT (SELECT n FROM ({ring("jobs")}) c) + (SELECT n FROM ({ring_groups("done")}) g)
           + (SELECT n FROM ({ring("(SELECT * FROM woken WHERE state = 'available')")}) w)
           + (SELECT n FROM ({TOUCH_RUNS.format(rel="(SELECT * FROM woken WHERE state = 'available')")}) r)
           + CASE WHEN EXISTS (SELECT 1 FROM jobs) OR EXISTS (SELECT 1 FROM woken WHERE state = 'available')
                  THEN livepush_jobs_ready() ELSE 0 END AS n
)
SELECT d.id, d.state, d.total, d.pending, d.succeeded, d.failed, d.cancelled, d.version, d.event
FROM done d CROSS JOIN rung
ORDER BY d.id
"""

# name: cancel_mark
# cancel_group, first transaction: the group row only (conditions on the row itself, so a
# concurrent finish or cancel that committed first is seen by the re-check and wins). From its commit on, adds are refused
# (ADD_TOTAL re-checks the state under the same lock) and the group finishes as `cancelled`
# once nothing is pending.
CANCEL_MARK = f"""
WITH marked AS (
    UPDATE livepush_groups g SET state = 'cancelled', cancelled_at = now(), version = g.version + 1
    WHERE g.id = %(id)s AND g.state IN ('open', 'sealed')
    RETURNING g.id
), rung AS ({ring_groups("marked")})
SELECT m.id FROM marked m CROSS JOIN rung
"""

# name: cancel_members
# cancel_group, one chunk of members in id order: queued ones (available, scheduled, i.e.
# also those waiting for a retry) and parked ones (waiting) are cancelled, running ones flagged and told
# (livepush_jobs_cancel_requested(), at commit) so they stop cooperatively and end `cancelled` (COMPLETE turns any outcome of a
# flagged job into cancelled, except success). Without SKIP LOCKED: a member
# being claimed right now is waited for, and READ COMMITTED re-checks the locked row, so it
# is seen as running and flagged rather than missed. Claimers use SKIP LOCKED and never wait
# for us. A member that succeeds meanwhile is left alone (it no longer matches). NO KEY UPDATE,
# as CANCEL: it still waits for a claim, an outcome, a park (FENCE) or an add from inside
# (FENCE_MEMBER's FOR SHARE), but not for a signal's key-share lock (jobs.signal(conn=), held until
# its caller commits), for which FOR UPDATE waited while holding the chunk's earlier members,
# whose outcomes, and their completer's whole batch, waited in turn.
CANCEL_MEMBERS = f"""
WITH target AS (
    SELECT id FROM livepush_jobs
    WHERE group_id = %(id)s AND id > %(after)s AND state IN ('available', 'scheduled', 'waiting', 'running')
    ORDER BY id
    LIMIT %(limit)s
    FOR NO KEY UPDATE
), moved AS (
    UPDATE livepush_jobs j SET
        state = CASE WHEN j.state = 'running' THEN 'running' ELSE 'cancelled' END,
        event = CASE WHEN j.state = 'running' THEN j.event ELSE 'cancelled' END,
        version = CASE WHEN j.state = 'running' THEN j.version ELSE j.version + 1 END,
        finished_at = CASE WHEN j.state = 'running' THEN j.finished_at ELSE now() END,
        cancel_requested = true
    FROM target t WHERE j.id = t.id
    RETURNING j.id, j.state, j.group_id, j.version, j.has_steps
), rung AS ({ring("(SELECT * FROM moved WHERE state = 'cancelled')")}
), told AS (
    SELECT livepush_jobs_cancel_requested(array_agg(id ORDER BY id)) AS n FROM moved WHERE state = 'running'
)
SELECT m.id, m.state, m.group_id, m.has_steps FROM moved m CROSS JOIN rung CROSS JOIN told
ORDER BY m.id
"""

# name: group_views
# The `group` object of events and reads. A plain read: one snapshot, so total and the
# shard sums are consistent with each other (an add changes both in one transaction).
GROUP_VIEWS = f"""
WITH c AS ({_COUNTS})
SELECT {_VIEW_COLUMNS}
FROM livepush_groups g LEFT JOIN c ON c.group_id = g.id
WHERE g.id = ANY(%(ids)s::bigint[])
ORDER BY g.id
"""

# name: lock_groups_for_progress
# A progress recorder (progress_now): locks the groups it is about to report, then (next
# statement) reads their counts. A finisher needs FOR UPDATE, so it either commits before this
# (and the recorder then sees finished_at and records nothing) or waits until the recorder's
# progress event is committed: a `progress` never follows `finished`. Two recorders of one group
# take turns (FOR SHARE would let them overlap): the later one reads after the earlier one
# committed, so events are recorded in the order of the counts they show, never older counts
# after newer ones. NO KEY UPDATE, not UPDATE: inserts of members and events (foreign keys to the
# group take FOR KEY SHARE) do not wait for it. A recorder whose process hangs (a paused
# machine) while it holds the lock would hold up every other recorder and finisher of the group
# until TCP keepalive gave up, hours later; so this statement also sets
# idle_in_transaction_session_timeout for the transaction (set_config(..., true), once: an
# uncorrelated subquery), and Postgres ends such a transaction after IDLE_TIMEOUT. Recorders run
# only in livepush's own short transactions, never in a caller's. A live recorder is idle only
# between two short statements; one held up past the timeout fails: the publisher tries again,
# an operator's call (jobs.cancel, cancel_group) raises DependencyError.
IDLE_TIMEOUT = "5s"
LOCK_GROUPS_FOR_PROGRESS = f"""
SELECT id FROM livepush_groups
WHERE id = ANY(%(ids)s::bigint[])
  AND (SELECT set_config('idle_in_transaction_session_timeout', '{IDLE_TIMEOUT}', true)) IS NOT NULL
ORDER BY id FOR NO KEY UPDATE
"""

# name: record_events
# Keeps each change rung on group:<id>, for group_history(); in the transaction that rings it.
# `at` is the statement's time, not now() (the transaction's start): ADD_TOTAL coalesces adds by
# the newest event's `at`, and in a caller's transaction open for longer than 100 ms (adds with
# conn=, one per item) now() would make every later add ring and record an event of its own.
RECORD_EVENTS = """
INSERT INTO livepush_group_events (group_id, event, data, at)
SELECT u.group_id, u.event, u.data, statement_timestamp()
FROM unnest(%(group_ids)s::bigint[], %(events)s::text[], %(datas)s::jsonb[]) AS u(group_id, event, data)
"""

# name: callback_context (ctx.group of a callback job)
CALLBACK_CONTEXT = f"""
WITH c AS ({_COUNTS.replace("%(ids)s::bigint[]", "ARRAY[%(group_id)s]::bigint[]")})
SELECT {_VIEW_COLUMNS}, (SELECT kind FROM livepush_group_callbacks WHERE job_id = %(job_id)s) AS kind
FROM livepush_groups g LEFT JOIN c ON c.group_id = g.id
WHERE g.id = %(group_id)s
"""

# name: members_page
# Keyset paging by id: stable under concurrent adds (new members have larger ids) and
# cheap at any depth (livepush_jobs_group_idx). One row more than asked tells whether
# another page exists, so a full last page has no next cursor.
MEMBERS_PAGE = """
SELECT j.id, j.name, j.queue, j.state, j.attempt, j.max_attempts, nullif(j.run_at, 'infinity') AS run_at,
       j.finished_at, p.error, p.progress
FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
WHERE j.group_id = %(id)s AND j.id > %(after)s
ORDER BY j.id
LIMIT %(limit)s + 1
"""

# name: events_page (newest first, keyset by seq)
EVENTS_PAGE = """
SELECT seq, event, data, at FROM livepush_group_events
WHERE group_id = %(id)s AND seq < %(before)s
ORDER BY seq DESC
LIMIT %(limit)s + 1
"""

# A group of children is kept while the durable job that made it has not finished: it replays
# their results, however long it waits for something else. A failed one too, for as long as it is
# kept itself: jobs.retry_failed() runs it again, and its replay reads them.
_NO_LIVE_PARENT = """NOT EXISTS (SELECT 1 FROM livepush_jobs p WHERE p.id = g.parent_id
                                  AND p.state NOT IN ('succeeded', 'cancelled'))"""

# A group that is the batch of a workflow step (its `group`) is kept while the run has not
# finished: a run paused on its batch's failures waits for an operator however long, and its
# resume runs the failed members of that batch again (its step's job, the group's parent, has
# finished and may be gone). Looked up by the steps' partial index on group_id. Safe against a
# run finishing meanwhile: a finished run never runs again, so a batch pruned after that is never
# needed; and a resumed step points at its old batch until its new one, made from the old one's
# failed members, is committed.
_NO_UNFINISHED_RUN = """NOT EXISTS (SELECT 1 FROM livepush_workflow_steps s
                                     JOIN livepush_workflows w ON w.id = s.workflow_id
                                     WHERE s.group_id = g.id AND w.finished_at IS NULL)"""

# A group is kept while one of its callbacks is queued or running. Left out of the oldest-first
# pick (not only of what is deleted): otherwise enough old groups with a callback that waits
# (its function deployed nowhere, its queue paused) would fill every pick, and retention would
# never reach the groups behind them.
_NO_LIVE_CALLBACK = """NOT EXISTS (SELECT 1 FROM livepush_jobs c WHERE c.callback_of = g.id
                                    AND c.state NOT IN ('succeeded', 'failed', 'cancelled'))"""

# Whether a group has no member or callback left, through the two partial indexes on the jobs.
_NO_JOB_LEFT = """(NOT EXISTS (SELECT 1 FROM livepush_jobs j WHERE j.group_id = g.id)
                 AND NOT EXISTS (SELECT 1 FROM livepush_jobs j WHERE j.callback_of = g.id))"""

# name: prune_group_jobs
# Retention: finished groups older than the cutoff. Their members and callbacks go first,
# a bounded batch per statement (SKIP LOCKED: two runtimes pruning split the work); a
# callback still queued or running keeps its group, and so does an unfinished workflow run
# whose step's batch it is. Members of unfinished groups are never
# touched: only groups with finished_at set are considered, and a group finishes only when
# every member is terminal.
# Only groups that still have a job are picked: a group whose jobs are gone waits for
# PRUNE_GROUPS, and picked again it would fill the pick, so that the next batch found nothing
# to delete and a prune ended after one batch of groups, however many were due.
PRUNE_GROUP_JOBS = f"""
WITH old AS (
    SELECT g.id FROM livepush_groups g
    WHERE g.finished_at < now() - make_interval(secs => %(retention)s) AND {_NO_LIVE_PARENT}
      AND {_NO_LIVE_CALLBACK} AND {_NO_UNFINISHED_RUN} AND NOT {_NO_JOB_LEFT}
    ORDER BY g.finished_at LIMIT 100
), victims AS (
    SELECT j.id FROM livepush_jobs j JOIN old ON j.group_id = old.id OR j.callback_of = old.id
    WHERE j.state IN ('succeeded', 'failed', 'cancelled')
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), gone AS (
    DELETE FROM livepush_jobs j USING victims v WHERE j.id = v.id RETURNING j.id
)""" + DELETE_PAYLOADS_OF_GONE

# name: prune_groups (the rows, once no job of theirs is left; cascades to shards, keys, events)
# Groups with a job left are not picked (rather than picked and then kept), for the same reason:
# they would fill the pick and end the prune early. No job joins a finished group (adds are
# refused, its callbacks were inserted as it finished), so none appears after this check.
PRUNE_GROUPS = f"""
WITH gone AS (
    DELETE FROM livepush_groups g
    WHERE g.id IN (
        SELECT g.id FROM livepush_groups g
        WHERE g.finished_at < now() - make_interval(secs => %(retention)s) AND {_NO_LIVE_PARENT}
          AND {_NO_LIVE_CALLBACK} AND {_NO_UNFINISHED_RUN} AND {_NO_JOB_LEFT}
        ORDER BY g.finished_at LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING g.id
)
SELECT id FROM gone
"""

# name: prune_jobs
# Retention of lone jobs (no group): finished longer ago than the cutoff, a bounded batch, oldest
# first, through livepush_jobs_finished_idx (sql/0003_jobs.sql), so a prune reads what it deletes
# and stops at the cutoff, however many finished jobs are kept. SKIP LOCKED: never waits for, nor
# blocks, a live transaction.
PRUNE_JOBS = """
WITH victims AS (
    SELECT id FROM livepush_jobs
    WHERE group_id IS NULL AND callback_of IS NULL AND state IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(retention)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM livepush_jobs j USING victims v WHERE j.id = v.id RETURNING j.id
)""" + DELETE_PAYLOADS_OF_GONE

# name: recently_shown
# Of `ids`, the groups that recorded an event in the last 100 ms (their newest event through the
# primary key, read backwards: one row however many). An operator call that counted outcomes
# (jobs.cancel, many a second under cancel_tagged) leaves these to the runtimes (UNRUNG below)
# rather than ringing them again at once. A plain read: an event recorded meanwhile only costs one
# ring more or one left to the runtimes, never a change that no ring shows.
RECENTLY_SHOWN = """
SELECT u.id FROM unnest(%(ids)s::bigint[]) AS u(id)
WHERE (SELECT e.at FROM livepush_group_events e WHERE e.group_id = u.id ORDER BY e.seq DESC LIMIT 1)
      > statement_timestamp() - interval '100 milliseconds'
ORDER BY u.id
"""

# name: unrung
# The runtimes' doorbell for groups whose counts changed without a ring (`livepush_groups_progress`,
# delivered at commit): their progress publishers read the rows afresh and ring what changed.
UNRUNG = "SELECT livepush_groups_unrung(%(ids)s::bigint[])"

# name: ring_groups (the progress publisher: the groups whose counts it saw change)
# A group that is a workflow fan-out step's batch also makes a new version of its run's topic,
# which shows the batch's counts (the lock order: group rows, then workflow rows).
RING_GROUPS = f"""
WITH g AS (SELECT unnest(%(ids)s::bigint[]) AS id
), rung AS ({ring_groups("g")}
), runs AS (
    SELECT j.workflow_id FROM livepush_groups gr JOIN livepush_jobs j ON j.id = gr.parent_id
    WHERE gr.id = ANY(%(ids)s::bigint[]) AND j.workflow_id IS NOT NULL
), touched AS ({TOUCH_RUNS.format(rel="runs")})
SELECT rung.n + touched.n AS n FROM rung, touched
"""

# name: unrung_groups
# After runtimes were found dead (maintenance.rescue, prune_gone_on_node): the unfinished groups
# whose counts differ from what their last recorded event showed (events are recorded in the
# transaction that rings them), i.e. changes no ring has shown. A dead runtime's progress
# publisher may have held them, marked after its outcomes committed and not yet flushed; the
# caller hands them to its own publisher, which locks them and reads them afresh before it
# rings, as for any mark. A plain read: a group a live runtime is about to ring is rung twice,
# which is harmless. Unfinished groups only (the scan `livepush status` makes too), at most `limit`.
UNRUNG_GROUPS = """
SELECT g.id FROM livepush_groups g
CROSS JOIN LATERAL (
    SELECT sum(s.pending)::int AS pending, sum(s.succeeded)::int AS succeeded, sum(s.failed)::int AS failed,
           sum(s.cancelled)::int AS cancelled
    FROM livepush_group_shards s WHERE s.group_id = g.id
) c
LEFT JOIN LATERAL (
    SELECT e.data -> 'group' AS v FROM livepush_group_events e WHERE e.group_id = g.id ORDER BY e.seq DESC LIMIT 1
) shown ON true
WHERE g.finished_at IS NULL
  AND (shown.v IS NULL OR shown.v IS DISTINCT FROM jsonb_build_object(
        'id', g.id, 'state', g.state, 'total', g.total, 'pending', c.pending, 'succeeded', c.succeeded,
        'failed', c.failed, 'cancelled', c.cancelled))
ORDER BY g.id
LIMIT %(limit)s
"""

# name: clear (tests only): DELETE rather than TRUNCATE, which a runtime role may not do.
CLEAR = ("DELETE FROM livepush_group_events; DELETE FROM livepush_group_callbacks; "
         "DELETE FROM livepush_group_shards; DELETE FROM livepush_groups")

# name: groups_in_progress
# `livepush status`: a plain read (no lock; api/status.py runs it in a read-only snapshot). The
# newest `limit` groups not finished (open, sealed, or cancelled with members still ending), with
# their counts summed over their shards, and in `in_progress` how many unfinished groups there
# are in all (counted before the LIMIT; `limit` is at least 1, so no groups means no rows and 0).
# The shards are read only for the groups shown.
GROUPS_IN_PROGRESS = """
WITH page AS (
    SELECT id, state, total, created_at, count(*) OVER () AS in_progress
    FROM livepush_groups
    WHERE finished_at IS NULL
    ORDER BY id DESC
    LIMIT %(limit)s
)
SELECT p.id, p.state, p.total, p.created_at, p.in_progress::int AS in_progress,
       coalesce(c.pending, 0)::int AS pending, coalesce(c.succeeded, 0)::int AS succeeded,
       coalesce(c.failed, 0)::int AS failed, coalesce(c.cancelled, 0)::int AS cancelled
FROM page p
LEFT JOIN LATERAL (
    SELECT sum(s.pending) AS pending, sum(s.succeeded) AS succeeded, sum(s.failed) AS failed,
           sum(s.cancelled) AS cancelled
    FROM livepush_group_shards s WHERE s.group_id = p.id
) c ON true
ORDER BY p.id DESC
"""
