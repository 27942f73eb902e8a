-- Batched publishing for the job runtime (issue 5's benchmark): one call publishes a whole
-- batch of events, and job events are built here from the row, so the claim and the
-- completion of a batch each publish their events in the statement that changes the
-- state: one round trip, and still the same transaction.

-- Publishes many messages at once with exactly the effect of calling livepush_publish()
-- for each (topic, data) pair in array order: per topic, offsets follow array order, every
-- message is logged, and the listeners are rung in array order at commit.
--
-- Safe under concurrency: each topic's row is locked once, and the locks are taken in topic
-- order (the INSERT reads its rows sorted), so two batches sharing topics queue on each
-- other instead of deadlocking. As with livepush_publish(), a topic's row lock is held to
-- commit, so offsets of one topic are assigned in commit order.
CREATE FUNCTION livepush_publish_many(p_topics text[], p_datas text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    v_n integer := 0;
BEGIN
    IF p_topics IS NULL OR cardinality(p_topics) = 0 THEN
        RETURN 0;
    END IF;
    FOR r IN
        WITH ev AS (
            SELECT u.topic, u.data, u.ord
            FROM unnest(p_topics, p_datas) WITH ORDINALITY AS u(topic, data, ord)
        ), counts AS (
            SELECT topic, count(*) AS n FROM ev GROUP BY topic
        ), bumped AS (
            INSERT INTO livepush_topics AS t (topic, last_seq)
            SELECT topic, n FROM counts ORDER BY topic
            ON CONFLICT (topic) DO UPDATE SET last_seq = t.last_seq + excluded.last_seq
            RETURNING t.topic, t.epoch, t.last_seq
        ), numbered AS (
            SELECT e.topic, e.data, e.ord, b.epoch,
                   b.last_seq - c.n + row_number() OVER (PARTITION BY e.topic ORDER BY e.ord) AS seq
            FROM ev e JOIN counts c USING (topic) JOIN bumped b USING (topic)
        ), logged AS (
            INSERT INTO livepush_messages (topic, seq, data) SELECT topic, seq, data FROM numbered
        )
        SELECT topic, data, epoch::text || '-' || seq::text AS "offset" FROM numbered ORDER BY ord
    LOOP
        -- Same notification as livepush_publish(): the payload inline while it fits.
        IF octet_length(r.data) + octet_length(r.topic) < 7800 THEN
            PERFORM pg_notify('livepush', r."offset" || ' ' || r.topic || E'\n' || r.data);
        ELSE
            PERFORM pg_notify('livepush', r."offset" || ' ' || r.topic);
        END IF;
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
END;
$$;

-- The JSON text of a job event (SPEC §6), the SQL twin of livepush.jobs.events.job_view():
-- {"event", "job": {"id", "name", "queue", "state", "attempt", "max_attempts",
-- "progress": {"done", "total", "message"}, "error", "run_at"}}. A test checks that both give
-- the same JSON for the same row. STABLE: run_at is written in the session's time zone, as
-- psycopg hands it to Python.
CREATE FUNCTION livepush_job_event(
    p_event text, p_id bigint, p_name text, p_queue text, p_state text, p_attempt integer,
    p_max_attempts integer, p_progress jsonb, p_error text, p_run_at timestamptz
) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT json_build_object(
        'event', p_event,
        'job', json_build_object(
            'id', p_id, 'name', p_name, 'queue', p_queue, 'state', p_state,
            'attempt', p_attempt, 'max_attempts', p_max_attempts,
            'progress', CASE WHEN p_progress IS NULL
                             THEN json_build_object('done', 0, 'total', NULL, 'message', NULL)
                             ELSE json_build_object('done', p_progress -> 'done', 'total', p_progress -> 'total',
                                                    'message', p_progress -> 'message') END,
            'error', p_error, 'run_at', p_run_at))::text
$$;
