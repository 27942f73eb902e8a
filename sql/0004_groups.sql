-- Task groups (livepush/jobs/groups/ owns these tables: its statements are in
-- livepush/jobs/groups/queries.py, with the lock order and the races it closes; see also
-- docs/groups.md).
--
-- A group's members are ordinary jobs whose `group_id` is the group's id; its callbacks are
-- jobs whose `callback_of` is (they belong to the group without being counted in it).
--
-- Counting without a hot row: each member's outcome is counted on one of the group's `shards`
-- rows, in the transaction that records the outcome. The group row itself is locked only when
-- a shard's pending count reaches 0 (to check whether the whole group is done), on adds and on
-- seal and cancel.
--
-- The group's state topic `group:<id>` has no hot row either: its version is the group row's
-- version plus the sum of its shards' versions, each of which grows with every change to its
-- row, so the version grows with every change a page could see and is read in the same
-- snapshot as the counts it describes.

CREATE TABLE livepush_groups (
    id            bigserial PRIMARY KEY,
    -- open: members may be added; sealed: only running members add (ctx.group.enqueue);
    -- finished: done, callbacks enqueued; cancelled: cancel_group() ran (finished once
    -- finished_at is set).
    state         text        NOT NULL DEFAULT 'open'
        CHECK (state IN ('open', 'sealed', 'finished', 'cancelled')),
    -- Counter rows of this group; fixed at creation (a member's shard is computed from its id).
    shards        integer     NOT NULL CHECK (shards BETWEEN 1 AND 1024),
    -- Members added so far. Written by adds only (they lock this row anyway to check the state
    -- and the member limit), never by a member's outcome.
    total         integer     NOT NULL DEFAULT 0,
    -- Callback specs {"name", "queue", "priority", "max_attempts", "args", "limited",
    -- "concurrency_key"} (jobs/groups/steps.py: callback_spec), resolved at creation so that
    -- whichever process finishes the group can enqueue them without knowing the functions.
    on_finish     jsonb,
    on_success    jsonb,
    on_failure    jsonb,
    -- The durable job parked on this group (ctx.run_child, ctx.run_children): the group's
    -- finish makes it available again, in the finishing transaction.
    parent_id     bigint,
    created_at    timestamptz NOT NULL DEFAULT now(),
    sealed_at     timestamptz,
    cancelled_at  timestamptz,
    -- Set in the transaction that enqueues the callbacks: the group is done.
    finished_at   timestamptz,
    -- This row's part of the state topic's version, and its last event before any member
    -- finished ('created' or 'progress'; 'cancelled' and 'finished' follow from state and
    -- finished_at).
    version       bigint      NOT NULL DEFAULT 1,
    event         text        NOT NULL DEFAULT 'created' CHECK (event IN ('created', 'progress'))
) WITH (fillfactor = 70, autovacuum_vacuum_cost_delay = 0);

-- Cancelling a waiting job cancels the groups of children it waits for.
CREATE INDEX livepush_groups_parent_idx ON livepush_groups (parent_id) WHERE parent_id IS NOT NULL;

-- Retention finds finished groups by age.
CREATE INDEX livepush_groups_finished_idx ON livepush_groups (finished_at) WHERE finished_at IS NOT NULL;

-- `livepush status` lists the newest unfinished groups and counts them all (groups/queries.py:
-- GROUPS_IN_PROGRESS): without it the report read every finished group retention keeps. The
-- group row's updates stay as HOT as they were: only its finish changes finished_at, which
-- livepush_groups_finished_idx already indexes.
CREATE INDEX livepush_groups_unfinished_idx ON livepush_groups (id) WHERE finished_at IS NULL;

-- Runtimes find the cancels cut off part-way (marked, members left queued: the caller died) by
-- their age (livepush/jobs/groups/queries.py: CUT_OFF_CANCELS). Cancelled and unfinished groups
-- are few and short-lived: the index is almost always empty.
CREATE INDEX livepush_groups_cancelling_idx ON livepush_groups (cancelled_at)
    WHERE state = 'cancelled' AND finished_at IS NULL;

CREATE TABLE livepush_group_shards (
    group_id   bigint  NOT NULL REFERENCES livepush_groups (id) ON DELETE CASCADE,
    shard      integer NOT NULL,
    -- Members of this shard not yet finished (queued, running or waiting for a retry).
    pending    integer NOT NULL DEFAULT 0,
    succeeded  integer NOT NULL DEFAULT 0,
    failed     integer NOT NULL DEFAULT 0,
    cancelled  integer NOT NULL DEFAULT 0,
    -- This shard's part of the group topic's version.
    version    bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (group_id, shard)
) WITH (
    -- Rewritten on every batch of outcomes: room for HOT updates, vacuumed early.
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_cost_delay = 0
);

-- The exactly-once key: one row per (group, callback kind), inserted in the transaction that
-- enqueues that callback. A second attempt to enqueue it conflicts and enqueues nothing.
CREATE TABLE livepush_group_callbacks (
    group_id  bigint NOT NULL REFERENCES livepush_groups (id) ON DELETE CASCADE,
    kind      text   NOT NULL CHECK (kind IN ('finish', 'success', 'failure')),
    job_id    bigint NOT NULL UNIQUE,
    PRIMARY KEY (group_id, kind)
);

-- The group's events as its state topic showed them, for `jobs.group_history()` (newest first).
-- Progress is recorded at most ~10 times a second per group.
CREATE TABLE livepush_group_events (
    group_id  bigint      NOT NULL REFERENCES livepush_groups (id) ON DELETE CASCADE,
    seq       bigserial,
    event     text        NOT NULL,
    data      jsonb       NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, seq)
);

-- `livepush_groups_progress`: the ids of groups whose counts changed without a ring (an add in
-- the 100 ms after the group's last event: progress is coalesced), delivered at commit. A
-- runtime's progress publisher reads the group rows and records and rings what changed, as for
-- its own members' outcomes: a forged ring costs a read of the groups it names.
CREATE FUNCTION livepush_groups_unrung(p_ids bigint[]) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    SELECT livepush_notify_ids('livepush_groups_progress', p_ids)
$$;
