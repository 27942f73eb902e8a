-- Enqueue options (docs/reference.md §4 Jobs, docs/jobs.md "Enqueue options"): idempotency keys,
-- debounce and tags. livepush/jobs/ owns these columns; its statements are in
-- livepush/jobs/queries.py (ENQUEUE_KEYED, ENQUEUE_DEBOUNCED, TAGGED_*).

-- The columns (key, key_slot, tags) are in sql/0003_jobs.sql, with the rest of the job row.

-- The key's invariant, held by Postgres whatever the caller does: one unfinished job per
-- (key, place). It is also what makes concurrent enqueues of a key safe: of two inserts of one
-- key the second waits on this index for the first's transaction, and if that committed it
-- inserts nothing (a single enqueue: ON CONFLICT DO NOTHING) or fails and is settled item by
-- item (a batch: livepush_enqueue_keyed); either way the winner is then looked up in a fresh
-- snapshot. A plain keyed enqueue takes no lock per key, so a
-- batch of any size holds no more locks than a plain one (debounced enqueues take one: see
-- livepush_enqueue_debounced). Partial: finished jobs free their key, and jobs without a
-- key cost nothing here.
CREATE UNIQUE INDEX livepush_jobs_key_idx ON livepush_jobs (key, key_slot)
    WHERE key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'waiting');

-- Debounced enqueues of one key take turns here (livepush_enqueue_debounced): each inserts its
-- key and deletes it again before it returns, so a second one waits on the first's uncommitted
-- row in the primary key until that transaction ends, then finds the key free. A row, not an
-- advisory lock: any login may take any advisory lock, and only livepush's roles may write this
-- table. Empty but for debounced enqueues in progress; unlogged, as nothing in it outlives them.
CREATE UNLOGGED TABLE livepush_key_turns (key text PRIMARY KEY);

-- jobs.list_tagged / cancel_tagged: tag containment (tags @> ARRAY[tag]). Partial, so untagged
-- jobs (most) never touch the GIN index on insert or on any rewrite.
CREATE INDEX livepush_jobs_tags_idx ON livepush_jobs USING gin (tags) WHERE tags IS NOT NULL;

-- One keyed job (scalar arguments): the unfinished job holding the key, or a new one. Each
-- statement of a volatile PL/pgSQL function takes a fresh snapshot, so the loop's lookup sees
-- every job of the key that committed before it. The insert (place 0) waits for an uncommitted
-- enqueue of the key and inserts nothing once that commits; the next round's lookup then finds
-- it. A holder that finishes between the two only frees the key for the next round. A key whose
-- place 0 is free while a job queued behind a started one (place 1, see key_slot) is unfinished
-- is found by the lookup, which reads every place. A lone keyed enqueue is the common case:
-- this is two statements where the batch function expands and joins a JSON document.
-- SET enable_seqscan = off: PL/pgSQL keeps a generic plan of each statement for the session, and
-- one planned while livepush_jobs was nearly empty read the whole table for each key of every
-- later call (1,000 keys against 8,000 rows: 2 s instead of 30 ms). Without sequential scans the
-- lookup always goes through livepush_jobs_key_idx, whatever size the table had when the plan was
-- made; nothing else here scans a table.
CREATE FUNCTION livepush_enqueue_one_keyed(p_name text, p_queue text, p_priority integer, p_at timestamptz,
                                           p_max_attempts integer, p_group_id bigint, p_args jsonb,
                                           p_tags text[], p_key text, p_concurrency_key text, p_limited boolean)
RETURNS TABLE (id bigint, name text, created boolean)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_id bigint;
    v_name text;
    v_version bigint;
BEGIN
    -- Each round either returns or saw another enqueue of the key commit; a few rounds at most.
    FOR v_round IN 1..100 LOOP
        SELECT x.id, x.name INTO v_id, v_name FROM livepush_jobs x
        WHERE x.key = p_key AND x.state IN ('available', 'scheduled', 'running', 'waiting')
        ORDER BY x.id + 0 LIMIT 1;
        IF FOUND THEN
            RETURN QUERY SELECT v_id, v_name, false;
            RETURN;
        END IF;
        INSERT INTO livepush_jobs AS j (queue, name, priority, run_at, state, max_attempts, group_id, key, tags,
                                        concurrency_key, limited)
        VALUES (p_queue, p_name, p_priority, coalesce(p_at, now()),
                CASE WHEN p_at > now() THEN 'scheduled' ELSE 'available' END,
                p_max_attempts, p_group_id, p_key, p_tags, p_concurrency_key, coalesce(p_limited, false))
        ON CONFLICT (key, key_slot) WHERE key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'waiting')
        DO NOTHING
        RETURNING j.id, j.name, j.version INTO v_id, v_name, v_version;
        IF FOUND THEN
            INSERT INTO livepush_job_payloads (id, args) VALUES (v_id, p_args);
            PERFORM livepush_state_changed(ARRAY['job:' || v_id], ARRAY[v_version]) + livepush_jobs_ready();
            RETURN QUERY SELECT v_id, v_name, true;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the enqueue of key % lost 100 races in a row', p_key;
END
$$;

-- An enqueue whose batch (livepush_job_items(), as for ENQUEUE) has keys. One statement does the
-- common case: the keys' unfinished jobs are looked up (one scan of the keys' index), and the
-- batch's first item of every key not held is inserted. A concurrent enqueue of one of those
-- keys meets this one on the unique index: the later insert waits for the earlier transaction
-- and, if it committed, fails with a unique violation. Then the whole statement is undone (a
-- subtransaction: nothing of it stays) and every item is settled one at a time by
-- livepush_enqueue_one_keyed, whose fresh snapshots see the winners. A plain insert, not ON
-- CONFLICT DO NOTHING: speculative insertion writes a second WAL record per row, which cost every
-- keyed batch more than the rare race costs here.
-- Only the batch's first item with a key (`first`: the caller marks it, which saves a sort here)
-- may create the job; a later item with the key gets the same one.
-- Returns one row per batch item, with its `ord` (in no order: the caller orders by it): the
-- job's id and name, and whether it was created (false: an unfinished job with the key already
-- held it, or an earlier item of the batch did).
-- SET enable_seqscan = off: as for livepush_enqueue_one_keyed.
CREATE FUNCTION livepush_enqueue_keyed(p_batch jsonb)
RETURNS TABLE (ord bigint, id bigint, name text, created boolean)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_ord bigint[];
    v_id bigint[];
    v_name text[];
    v_settled_ord bigint[];
    v_settled_id bigint[];
    v_settled_name text[];
    v_item record;
    v_one record;
    v_owner jsonb := '{}';
BEGIN
    BEGIN
        WITH items AS (
            SELECT * FROM livepush_job_items(p_batch)
        ), held AS (
            -- The oldest unfinished job of each key (more than one only after debounced enqueues:
            -- see key_slot), in one scan of the keys' index for all of them: a lookup per key
            -- cost three times as much.
            SELECT DISTINCT ON (x.key) x.key, x.id, x.name FROM livepush_jobs x
            WHERE x.key = ANY(ARRAY(SELECT i.key FROM items i WHERE i.key IS NOT NULL AND i.first))
              AND x.state IN ('available', 'scheduled', 'running', 'waiting')
            ORDER BY x.key, x.id
        ), input AS MATERIALIZED (
            SELECT nextval('livepush_jobs_id_seq') AS id, i.* FROM items i
            WHERE i.first AND NOT EXISTS (SELECT 1 FROM held WHERE held.key = i.key)
        ), jobs AS (
            INSERT INTO livepush_jobs (id, queue, name, priority, run_at, state, max_attempts, group_id, key, tags,
                                       concurrency_key, limited)
            SELECT n.id, n.queue, n.name, n.priority, coalesce(n.at, now()),
                   CASE WHEN n.at > now() THEN 'scheduled' ELSE 'available' END,
                   n.max_attempts, n.group_id, n.key, n.tags, n.concurrency_key, n.limited
            FROM input n
            -- In key order, whatever the items' order: two batches sharing keys wait for each
            -- other's inserts in one order, so they cannot deadlock. Code point order (COLLATE
            -- "C"), the order Python slices a batch in (Batch.chunks): under the database's
            -- collation ('a' before 'B' in most locales) a batch of many statements went in
            -- another order than a batch of one, and the two deadlocked.
            ORDER BY n.key COLLATE "C"
        ), payloads AS (
            INSERT INTO livepush_job_payloads (id, args) SELECT n.id, n.args FROM input n
        ), rung AS (
            SELECT CASE WHEN count(*) > 0 THEN livepush_states_created('job', min(n.id), max(n.id)) + livepush_jobs_ready()
                   END AS n FROM input n
        ), settled AS MATERIALIZED (
            -- The items that created nothing (a key held, or an earlier item's), with the job that
            -- holds their key. Read only when there are any (the CASEs below): most batches
            -- create a job per item, and joining every item to its owner cost them for nothing.
            SELECT i.ord, o.id, o.name FROM items i
            JOIN (SELECT held.key, held.id, held.name FROM held
                  UNION ALL SELECT n.key, n.id, n.name FROM input n WHERE n.key IS NOT NULL) o ON o.key = i.key
            WHERE NOT i.first OR EXISTS (SELECT 1 FROM held WHERE held.key = i.key)
        )
        -- Unordered (the caller orders by `ord`): one aggregation fills the first three arrays
        -- from the same rows, and the settled ones read one materialized CTE, whose scans
        -- return its rows in one order.
        SELECT array_agg(n.ord), array_agg(n.id), array_agg(n.name),
               CASE WHEN count(*) < (SELECT count(*) FROM items) THEN (SELECT array_agg(s.ord) FROM settled s) END,
               CASE WHEN count(*) < (SELECT count(*) FROM items) THEN (SELECT array_agg(s.id) FROM settled s) END,
               CASE WHEN count(*) < (SELECT count(*) FROM items) THEN (SELECT array_agg(s.name) FROM settled s) END
        INTO v_ord, v_id, v_name, v_settled_ord, v_settled_id, v_settled_name
        FROM rung CROSS JOIN input n;
        RETURN QUERY SELECT u.ord, u.id, u.name, true FROM unnest(v_ord, v_id, v_name) AS u(ord, id, name)
                     UNION ALL
                     SELECT u.ord, u.id, u.name, false FROM unnest(v_settled_ord, v_settled_id, v_settled_name) AS u(ord, id, name);
        RETURN;
    EXCEPTION WHEN unique_violation THEN
        NULL;  -- settled below, item by item
    END;
    -- Item by item in key order (the caller orders the rows by `ord`), for the same reason.
    FOR v_item IN SELECT * FROM livepush_job_items(p_batch) i ORDER BY i.key COLLATE "C", i.ord LOOP
        IF v_item.key IS NOT NULL AND v_owner ? v_item.key THEN
            RETURN QUERY SELECT v_item.ord, (v_owner -> v_item.key ->> 0)::bigint, v_owner -> v_item.key ->> 1, false;
            CONTINUE;
        END IF;
        SELECT * INTO v_one FROM livepush_enqueue_one_keyed(
            v_item.name, v_item.queue, v_item.priority, v_item.at, v_item.max_attempts, v_item.group_id, v_item.args,
            v_item.tags, v_item.key, v_item.concurrency_key, v_item.limited) o;
        IF v_item.key IS NOT NULL THEN
            v_owner := v_owner || jsonb_build_object(v_item.key, jsonb_build_array(v_one.id, v_one.name));
        END IF;
        RETURN QUERY SELECT v_item.ord, v_one.id, v_one.name, v_one.created;
    END LOOP;
END
$$;

-- A debounced enqueue of one job (a batch of one, as for ENQUEUE, whose key is not NULL) that
-- runs `p_delay` seconds from now: a pending job with the key (available or scheduled, and not
-- started) takes the new arguments (and tags, when given) and that run time; with none pending,
-- a new job is inserted at the lowest free place of the key, so with a job of the key started
-- (running or waiting) the new one is queued behind it. A job that has spent an attempt has
-- started too, even when it is scheduled or available again (waiting for its retry, or rescued):
-- its next attempt finishes what the first began with its arguments, and replaced it would run
-- the new ones with the old ones' spent attempts; and so has a durable job with stored steps
-- (woken from a park, which spends no attempt): its next run replays those steps, which belong
-- to its arguments and its function. A task group's member is left alone too, started or not: it
-- is the group's (its outcome is counted as the member's, or returned to the durable job it is a
-- child of), and replaced it would count another call's function and arguments. A job goes back
-- to pending as a started one, but for one a
-- draining runtime gave back with its attempt: it and a job queued behind it are then both
-- pending, and the newest is replaced (the one given back runs what it began).
-- Debounced enqueues of one key take turns on its row in livepush_key_turns (one key: a debounce
-- is a single enqueue), so they run one after the other; each statement takes a fresh snapshot.
-- The UPDATE re-checks the state on the latest row version: a pending job claimed meanwhile is
-- left alone (the claim holds its row lock, or the UPDATE holds it and the claim, SKIP LOCKED,
-- passes it by), and a new one is queued behind it; a claim whose snapshot is older than this
-- replacement does not start the job with the arguments it replaced (livepush/jobs/queries.py:
-- CLAIMED). A plain keyed enqueue takes no lock: when it
-- commits a pending job between the UPDATE and the choice of a place, the choice sees it and the
-- next round replaces it; when both insert at place 0, they meet on the unique index (the second
-- waits for the first, inserts nothing, and its next round finds the first's job). They do not
-- meet when this one queues behind a started job (a place above 0) and that job ends before this
-- commits: a plain enqueue of the key (or jobs.retry_failed() of a failed job with it) in that
-- moment finds place 0 free and this job not yet there, and the key gets two pending jobs: the one
-- race left, accepted in docs/jobs.md "Enqueue options" (closing it would take a lock per key from
-- every plain keyed enqueue).
-- SET enable_seqscan = off: as for livepush_enqueue_one_keyed.
CREATE FUNCTION livepush_enqueue_debounced(p_batch jsonb, p_delay float8) RETURNS TABLE (id bigint, name text, created boolean)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_job record;
    v_key text;
    -- From the call, not from now(), the start of the transaction: in a caller's transaction
    -- (conn=) open for longer than the delay, the job was due at its commit and the next call
    -- found it started, instead of replacing it.
    v_at timestamptz := clock_timestamp() + make_interval(secs => p_delay);
    v_state text := CASE WHEN p_delay > 0 THEN 'scheduled' ELSE 'available' END;
    v_tags text[];
    v_id bigint;
    v_name text;
    v_version bigint;
    v_slot smallint;
    v_pending boolean;
BEGIN
    SELECT * INTO v_job FROM livepush_job_items(p_batch);
    v_key := v_job.key;
    v_tags := nullif(v_job.tags, '{}');
    -- Our turn: waits while another transaction's debounced enqueue of the key is uncommitted.
    INSERT INTO livepush_key_turns (key) VALUES (v_key);
    DELETE FROM livepush_key_turns t WHERE t.key = v_key;
    -- Each round either returns or saw a plain enqueue of the key commit; a few rounds at most.
    FOR v_round IN 1..100 LOOP
        -- The pending job becomes the one asked for: keys are shared by every function, so its
        -- name, queue, priority and attempts are the new job's too, not only its arguments. New
        -- arguments: a limited function's concurrency key is taken from them again.
        UPDATE livepush_jobs j SET run_at = v_at, state = v_state, version = j.version + 1, event = 'enqueued',
                                   tags = coalesce(v_tags, j.tags), concurrency_key = v_job.concurrency_key,
                                   name = v_job.name, queue = v_job.queue, priority = v_job.priority,
                                   max_attempts = v_job.max_attempts, limited = v_job.limited
        -- One job of a key is pending and not started, or rarely two (see above): the newest.
        WHERE j.id = (SELECT x.id FROM livepush_jobs x
                      WHERE x.key = v_key AND x.state IN ('available', 'scheduled') AND x.attempt = 0
                        AND NOT x.has_steps AND x.group_id IS NULL
                      ORDER BY x.key DESC, x.key_slot DESC LIMIT 1)
          AND j.state IN ('available', 'scheduled') AND j.attempt = 0 AND NOT j.has_steps
        RETURNING j.id, j.name, j.version INTO v_id, v_name, v_version;
        IF FOUND THEN
            -- What a run of the replaced arguments left (a failure's error, after retry_failed;
            -- progress, from a run a draining runtime gave back) is not the new arguments'.
            UPDATE livepush_job_payloads p SET args = v_job.args, error = NULL, progress = NULL WHERE p.id = v_id;
            PERFORM livepush_state_changed(ARRAY['job:' || v_id], ARRAY[v_version]);
            IF v_state = 'available' THEN
                PERFORM livepush_jobs_ready();
            END IF;
            RETURN QUERY SELECT v_id, v_name, false;
            RETURN;
        END IF;
        -- The lowest free place (generate_series yields in order; LIMIT stops at the first free
        -- one), in the same snapshot as a second look for a pending job.
        SELECT EXISTS (SELECT 1 FROM livepush_jobs x
                       WHERE x.key = v_key AND x.state IN ('available', 'scheduled') AND x.attempt = 0
                         AND NOT x.has_steps AND x.group_id IS NULL),
               (SELECT s::smallint FROM generate_series(0, 32767) s
                WHERE NOT EXISTS (SELECT 1 FROM livepush_jobs x
                                  WHERE x.key = v_key AND x.key_slot = s
                                    AND x.state IN ('available', 'scheduled', 'running', 'waiting'))
                LIMIT 1)
        INTO v_pending, v_slot;
        CONTINUE WHEN v_pending;
        INSERT INTO livepush_jobs AS j (queue, name, priority, run_at, state, max_attempts, group_id, key, key_slot,
                                        tags, concurrency_key, limited)
        VALUES (v_job.queue, v_job.name, v_job.priority, v_at, v_state, v_job.max_attempts,
                v_job.group_id, v_key, v_slot, v_tags, v_job.concurrency_key, v_job.limited)
        ON CONFLICT (key, key_slot) WHERE key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'waiting')
        DO NOTHING
        RETURNING j.id, j.name INTO v_id, v_name;
        IF FOUND THEN
            INSERT INTO livepush_job_payloads (id, args) VALUES (v_id, v_job.args);
            PERFORM livepush_states_created('job', v_id, v_id) + livepush_jobs_ready();
            RETURN QUERY SELECT v_id, v_name, true;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the debounced enqueue of key % lost 100 races in a row', v_key;
END
$$;
