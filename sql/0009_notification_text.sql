-- The NOTIFY payload of a published message, in one place (issue 5's benchmark: bulk
-- enqueue against pgqueuer).
--
-- A batch enqueue publishes one `enqueued` event on each new job's own topic. Passed to
-- livepush_publish_many() it is aggregated into two arrays, unnested again and grouped by
-- topic to number several messages per topic, which an enqueue never has (each topic is a
-- job created by the statement). The enqueue statement now numbers, logs and notifies its
-- events itself (queries._publish_once_each, 1,000 jobs: 16.3 -> 14.4 ms on the server),
-- so the payload format, until now written out in livepush_publish() and
-- livepush_publish_many(), is this function, which all three use. It is a single SQL
-- expression, IMMUTABLE, so the planner inlines it: no call overhead.
--
-- "EPOCH-SEQ topic\njson" while it fits under Postgres' 8000-byte NOTIFY limit, else only
-- "EPOCH-SEQ topic": the listener then reads the payload from livepush_messages.
CREATE FUNCTION livepush_notification(p_epoch bigint, p_seq bigint, p_topic text, p_data text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN octet_length(p_data) + octet_length(p_topic) < 7800
                THEN p_epoch::text || '-' || p_seq::text || ' ' || p_topic || E'\n' || p_data
                ELSE p_epoch::text || '-' || p_seq::text || ' ' || p_topic END
$$;

-- As in sql/0001, with the payload from livepush_notification(). Safe under concurrency,
-- unchanged: the row lock taken by the upsert orders publishers of one topic.
CREATE OR REPLACE FUNCTION livepush_publish(p_topic text, p_data text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
    v_seq bigint;
BEGIN
    INSERT INTO livepush_topics AS t (topic, last_seq) VALUES (p_topic, 1)
    ON CONFLICT (topic) DO UPDATE SET last_seq = t.last_seq + 1
    RETURNING t.epoch, t.last_seq INTO v_epoch, v_seq;
    INSERT INTO livepush_messages (topic, seq, data) VALUES (p_topic, v_seq, p_data);
    PERFORM pg_notify('livepush', livepush_notification(v_epoch, v_seq, p_topic, p_data));
    RETURN v_epoch::text || '-' || v_seq::text;
END;
$$;

-- As in sql/0007, with the payload from livepush_notification(). Safe under concurrency,
-- unchanged: each topic's row is locked once, in topic order (the INSERT reads its rows
-- sorted), so two batches sharing topics queue on each other instead of deadlocking.
CREATE OR REPLACE FUNCTION livepush_publish_many(p_topics text[], p_datas text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    IF p_topics IS NULL OR cardinality(p_topics) = 0 THEN
        RETURN 0;
    END IF;
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
    SELECT count(pg_notify('livepush', livepush_notification(n.epoch, n.seq, n.topic, n.data)))::integer
    INTO v_n
    FROM (SELECT * FROM numbered ORDER BY ord) n;
    RETURN v_n;
END;
$$;
