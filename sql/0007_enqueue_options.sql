-- Enqueue options (docs/reference.md §4 Jobs, docs/jobs.md "Enqueue options"): idempotency keys,
-- debounce and tags. livepush/jobs/ owns these columns; its statements are in
-- livepush/jobs/queries.py (ENQUEUE_KEYED, ENQUEUE_DEBOUNCED, TAGGED_*).

-- `key`: at most one job with a key is unfinished at a time, except that a debounced enqueue may
-- queue one job behind a started one (see key_slot). NULL for the jobs of a plain enqueue.
ALTER TABLE livepush_jobs ADD COLUMN key text;

-- Which place of its key a job holds: 0 for the first job with a key, 1 (or the lowest free
-- place) for a job a debounced enqueue queued behind one that had already started. The place
-- is chosen once, at insert, and never changes, so no state change of the runtime (claim,
-- retry, release, rescue, promote) can ever make two unfinished rows collide on the unique
-- index below: its predicate is over the unfinished states as a whole, which those changes
-- never leave except by finishing.
ALTER TABLE livepush_jobs ADD COLUMN key_slot smallint NOT NULL DEFAULT 0;

-- `tags`: labels to list and cancel jobs by (jobs.list_tagged, jobs.cancel_tagged); NULL when none.
ALTER TABLE livepush_jobs ADD COLUMN tags text[];

-- The key's invariant, held by Postgres whatever the caller does: one unfinished job per
-- (key, place). Enqueues of a key also serialize on an advisory lock of the key
-- (livepush_enqueue_keyed below), which is what lets them read the winner race-free; this
-- index makes any path that bypassed the lock fail loudly instead of creating a duplicate.
-- Partial: finished jobs free their key, and jobs without a key cost nothing here.
CREATE UNIQUE INDEX livepush_jobs_key_idx ON livepush_jobs (key, key_slot)
    WHERE key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'waiting');

-- jobs.list_tagged / cancel_tagged: tag containment (tags @> ARRAY[tag]). Partial, so untagged
-- jobs (most) never touch the GIN index on insert or on any rewrite.
CREATE INDEX livepush_jobs_tags_idx ON livepush_jobs USING gin (tags) WHERE tags IS NOT NULL;

-- Keyed enqueues of one key take this transaction-level lock first (ids: a constant naming
-- livepush's key namespace, so users' own advisory locks never collide with it, and the key's
-- hash; two keys sharing a hash only wait for each other). Held until the enqueuing transaction
-- ends, so a second enqueue of the key waits for the first to commit or roll back and then sees
-- its row.
CREATE FUNCTION livepush_lock_keys(p_keys text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- In one order (sorted hashes), so two batches locking overlapping keys never deadlock.
    PERFORM pg_advisory_xact_lock(1819045236, h)
    FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(p_keys) k WHERE k IS NOT NULL ORDER BY 1) s;
    RETURN 1;
END
$$;

-- An enqueue whose batch (enqueue.Batch rows, as for ENQUEUE) has keys; `p_keys`: the distinct
-- keys of the batch. PL/pgSQL, because each statement of a volatile function takes a fresh
-- snapshot: the read of the keys' jobs below runs after the locks are held, so it sees every job
-- of those keys that any committed enqueue created (this transaction's own earlier ones too), and
-- no other enqueue of them can commit until this transaction ends. A job that is claimed, retried
-- or finished meanwhile only moves between states; the read sees it unfinished (its handle is
-- returned) or finished (the key is free).
-- Row column 9 is 1 for the batch's first item with its key (the caller marks it, which saves a
-- sort here): only it may create the job; a later item with the key gets the same one.
-- Returns one row per batch item, in order: the job's id and name, and whether it was created
-- (false: an unfinished job with the key already held it, or an earlier item of the batch did).
--
-- SET enable_seqscan = off: PL/pgSQL keeps a generic plan of each statement for the session, and
-- one planned while livepush_jobs was nearly empty (a fresh or freshly emptied table) read the
-- whole table for each key of every later batch (1,000 keys against 8,000 rows: 2 s instead of
-- 30 ms). Without sequential scans the key's lookup always goes through livepush_jobs_key_idx,
-- whatever size the table had when the plan was made; nothing else here scans a table.
CREATE FUNCTION livepush_enqueue_keyed(p_jobs jsonb, p_keys text[])
RETURNS TABLE (ord bigint, id bigint, name text, created boolean)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
#variable_conflict use_column
BEGIN
    PERFORM livepush_lock_keys(p_keys);
    RETURN QUERY
    WITH items AS (
        SELECT u.ord, u.j ->> 0 AS name, u.j ->> 1 AS queue, (u.j ->> 2)::int AS priority,
               (u.j ->> 3)::timestamptz AS at, (u.j ->> 4)::int AS max_attempts,
               (u.j ->> 5)::bigint AS group_id, u.j -> 6 AS args,
               CASE WHEN jsonb_typeof(u.j -> 7) = 'array' THEN ARRAY(SELECT jsonb_array_elements_text(u.j -> 7)) END AS tags,
               u.j ->> 8 AS key, (u.j ->> 9) = '1' AS first,
               u.j ->> 10 AS concurrency_key, coalesce((u.j ->> 11)::boolean, false) AS limited
        FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS u(j, ord)
    ), held AS (
        -- The oldest unfinished job of each key (more than one only after debounced enqueues:
        -- see key_slot), one index lookup per key. `x.id + 0`: ordered by the bare id, the
        -- planner would rather walk the primary key, filtering every row of the table.
        SELECT k.key, h.id, h.name FROM unnest(p_keys) AS k(key)
        CROSS JOIN LATERAL (
            SELECT x.id, x.name FROM livepush_jobs x
            WHERE x.key = k.key AND x.state IN ('available', 'scheduled', 'running', 'waiting')
            ORDER BY x.id + 0 LIMIT 1
        ) h
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
    ), payloads AS (
        INSERT INTO livepush_job_payloads (id, args) SELECT n.id, n.args FROM input n
    ), rung AS (
        SELECT CASE WHEN count(*) > 0 THEN livepush_states_created('job', min(n.id), max(n.id)) + livepush_jobs_ready()
               END AS n FROM input n
    ), owner AS (
        SELECT held.key, held.id, held.name FROM held
        UNION ALL SELECT n.key, n.id, n.name FROM input n WHERE n.key IS NOT NULL
    )
    SELECT i.ord, coalesce(n.id, o.id), coalesce(n.name, o.name), n.id IS NOT NULL
    FROM items i CROSS JOIN rung
    LEFT JOIN input n ON n.ord = i.ord
    LEFT JOIN owner o ON o.key = i.key AND n.id IS NULL
    ORDER BY i.ord;
END
$$;

-- livepush_enqueue_keyed for a single job, with scalar arguments: the same lock, lookup and rows
-- in three plain statements, without a JSON document to expand or a batch to join back (a lone
-- keyed enqueue is the common case: it cost twice a plain one through the batch function).
-- SET enable_seqscan = off: as for livepush_enqueue_keyed.
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
    PERFORM pg_advisory_xact_lock(1819045236, hashtext(p_key));
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
    RETURNING j.id, j.name, j.version INTO v_id, v_name, v_version;
    INSERT INTO livepush_job_payloads (id, args) VALUES (v_id, p_args);
    PERFORM livepush_state_changed(ARRAY['job:' || v_id], ARRAY[v_version]) + livepush_jobs_ready();
    RETURN QUERY SELECT v_id, v_name, true;
END
$$;

-- A debounced enqueue of one job (a batch of one, as for ENQUEUE, whose key is not NULL) that
-- runs `p_delay` seconds from now: a pending job with the key (available or scheduled: not
-- started) takes the new arguments (and tags, when given) and that run time; with none pending,
-- a new job is inserted at the lowest free place of the key, so with a job of the key started
-- (running or waiting) the new one is queued behind it. Serialized per key by the same lock as
-- livepush_enqueue_keyed, each statement with a fresh snapshot. The UPDATE re-checks the state
-- on the latest row version: a pending job claimed meanwhile is left alone (the claim holds its
-- row lock, or the UPDATE holds it and the claim, SKIP LOCKED, passes it by), and a new one is
-- queued behind it.
-- SET enable_seqscan = off: as for livepush_enqueue_keyed.
CREATE FUNCTION livepush_enqueue_debounced(p_job jsonb, p_delay float8) RETURNS TABLE (id bigint, name text, created boolean)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_key text := p_job ->> 8;
    v_at timestamptz := now() + make_interval(secs => p_delay);
    v_state text := CASE WHEN p_delay > 0 THEN 'scheduled' ELSE 'available' END;
    v_tags text[] := nullif(ARRAY(SELECT jsonb_array_elements_text(nullif(p_job -> 7, 'null'::jsonb))), '{}');
    v_id bigint;
    v_name text;
    v_version bigint;
    v_slot smallint;
BEGIN
    PERFORM livepush_lock_keys(ARRAY[v_key]);
    -- New arguments: a limited function's concurrency key is taken from them again.
    UPDATE livepush_jobs j SET run_at = v_at, state = v_state, version = j.version + 1, event = 'enqueued',
                               tags = coalesce(v_tags, j.tags), concurrency_key = p_job ->> 10
    -- At most one job of a key is pending (this function is the only way a second one is made).
    WHERE j.id = (SELECT x.id FROM livepush_jobs x
                  WHERE x.key = v_key AND x.state IN ('available', 'scheduled') ORDER BY x.key, x.key_slot LIMIT 1)
      AND j.state IN ('available', 'scheduled')
    RETURNING j.id, j.name, j.version INTO v_id, v_name, v_version;
    IF FOUND THEN
        UPDATE livepush_job_payloads p SET args = p_job -> 6 WHERE p.id = v_id;
        PERFORM livepush_state_changed(ARRAY['job:' || v_id], ARRAY[v_version]);
        IF v_state = 'available' THEN
            PERFORM livepush_jobs_ready();
        END IF;
        RETURN QUERY SELECT v_id, v_name, false;
        RETURN;
    END IF;
    -- The lowest free place (generate_series yields in order; LIMIT stops at the first free one).
    SELECT s::smallint INTO v_slot FROM generate_series(0, 32767) s
    WHERE NOT EXISTS (SELECT 1 FROM livepush_jobs x
                      WHERE x.key = v_key AND x.key_slot = s
                        AND x.state IN ('available', 'scheduled', 'running', 'waiting'))
    LIMIT 1;
    INSERT INTO livepush_jobs (queue, name, priority, run_at, state, max_attempts, group_id, key, key_slot, tags,
                               concurrency_key, limited)
    VALUES (p_job ->> 1, p_job ->> 0, (p_job ->> 2)::int, v_at, v_state, (p_job ->> 4)::int,
            (p_job ->> 5)::bigint, v_key, v_slot, v_tags, p_job ->> 10, coalesce((p_job ->> 11)::boolean, false))
    RETURNING livepush_jobs.id, livepush_jobs.name INTO v_id, v_name;
    INSERT INTO livepush_job_payloads (id, args) VALUES (v_id, p_job -> 6);
    PERFORM livepush_states_created('job', v_id, v_id) + livepush_jobs_ready();
    RETURN QUERY SELECT v_id, v_name, true;
END
$$;
