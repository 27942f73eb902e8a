"""The statements of periodic jobs, on `livepush_periodic` (sql/0009_periodic.sql). The job itself
is enqueued through the enqueue's own statement (api/enqueue.Batch), in the same transaction as
ADVANCE."""

from __future__ import annotations

# name: periodic_state
# A plain read: each name asked for with its newest enqueued tick (NULL for a job no runtime has
# seen yet), and the database's clock, which every runtime uses so that skewed machine clocks
# agree on which tick is due. clock_timestamp(), not now(): the read may sit in a transaction.
STATE = """
SELECT n.name, p.last_tick, clock_timestamp() AS now
FROM unnest(%(names)s::text[]) AS n(name) LEFT JOIN livepush_periodic p ON p.name = n.name
"""

# name: periodic_start
# A new periodic job: record the newest due tick as done, so it starts from its next tick. Two
# runtimes starting it at once: one insert wins, the other does nothing (ON CONFLICT), and both
# go on from the row that is there.
START = """
INSERT INTO livepush_periodic (name, last_tick) VALUES (%(name)s, %(tick)s)
ON CONFLICT (name) DO NOTHING
"""

# name: periodic_advance
# Claims a tick: moves last_tick forward to it, or changes nothing. Safe under concurrency: the
# UPDATE locks the row until the transaction (which also enqueues the job) ends. A runtime
# advancing to the same tick meanwhile waits for that lock, then re-checks its WHERE against the
# committed row (READ COMMITTED), finds last_tick no longer before the tick and updates nothing,
# so it enqueues nothing; under a stricter isolation level it gets a serialization error instead,
# which the scheduler logs and retries next round. If the winner rolls back (its enqueue failed),
# the row is unchanged and the waiter advances it and enqueues. `<` never moves it backwards: a
# runtime that read the clock before another advanced cannot enqueue an older tick again.
# The waiters wait on the winner's row lock for as long as its transaction stays open, so the
# statement also sets idle_in_transaction_session_timeout for this transaction (set_config(...,
# true), once: an uncorrelated subquery): a winner whose machine pauses or vanishes before it
# commits (its connection would linger until TCP keepalive gives up, hours) is ended by Postgres
# after IDLE_TIMEOUT, its transaction rolled back, and a waiter advances and enqueues instead. A
# live winner is idle only between two short statements; one whose event loop a job held up past
# the timeout loses its round, which the scheduler logs and tries again.
IDLE_TIMEOUT = "5s"
ADVANCE = f"""
UPDATE livepush_periodic SET last_tick = %(tick)s, updated_at = now()
WHERE name = %(name)s AND last_tick < %(tick)s
  AND (SELECT set_config('idle_in_transaction_session_timeout', '{IDLE_TIMEOUT}', true)) IS NOT NULL
"""

# name: periodic_status
# A plain read for `livepush status`: each periodic job's newest enqueued tick (the one recorded
# as done, for a job that has enqueued none yet) and how long ago it was, on the clock of the
# report's snapshot. A tick that keeps ageing past the job's period means no runtime schedules it:
# none runs that imports its module and serves its queue.
PERIODIC_STATUS = """
SELECT name, last_tick, greatest(extract(epoch FROM now() - last_tick), 0)::float8 AS since_last_tick
FROM livepush_periodic
ORDER BY name
"""

# name: periodic_forget
# jobs.forget_periodic(): forgets a periodic job's newest tick, once no live runtime schedules it
# (checked first, jobs/queries.py LIVE_RUNTIMES_SCHEDULING); the name if there was a row.
# Safe against a runtime that schedules the name at the same moment (one that registered since
# the check): the DELETE and that
# runtime's ADVANCE lock the same row, so one waits for the other. An ADVANCE that commits first
# has enqueued its tick once, and the DELETE then removes the row it moved; a DELETE that commits
# first leaves ADVANCE no row to move, so it enqueues nothing. Either way that runtime's next round
# finds no row and STARTs one, recording the tick due then as done: the job goes on from its
# next tick, as a new periodic job does, and no tick is enqueued twice.
FORGET = "DELETE FROM livepush_periodic WHERE name = %(name)s RETURNING name"

# name: periodic_clear (tests only: jobs.clear())
# Forgets every periodic job's newest tick, so that after jobs.clear() a periodic job starts from
# its next tick, as in a fresh database, instead of running at once for a tick missed since an
# earlier test. DELETE rather than TRUNCATE, which a runtime role may not do.
CLEAR = "DELETE FROM livepush_periodic"
