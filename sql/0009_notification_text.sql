-- The NOTIFY payload of a published message as a function that queries inline (issue 5's
-- benchmark: bulk enqueue against pgqueuer).
--
-- A batch enqueue publishes one `enqueued` event on each new job's own topic. Passed to
-- livepush_publish_many() it is aggregated into two arrays, unnested again and grouped by
-- topic to number several messages per topic, which an enqueue never has (each topic is a
-- job created by the statement). The enqueue statement now numbers, logs and notifies its
-- events itself (queries.ENQUEUE_MANY_PUBLISHING, 1,000 jobs: 16.7 -> 14.75 ms on the server),
-- so the payload format, written out in livepush_publish_many() until now, is this
-- function, which both use. It is a single SQL expression, IMMUTABLE, so the planner
-- inlines it into a query: no call overhead there. livepush_publish() (sql/0001) keeps its
-- own IF/ELSE copy: PL/pgSQL evaluates this call, or the same CASE written inline, ~1 us
-- slower a publish (measured: 3.0 and 3.6 against 1.9 us), and every single publish() pays
-- it. A test holds the two to the same text (test_publish_and_publish_many_ring_alike).
--
-- "EPOCH-SEQ topic\njson" while it fits under Postgres' 8000-byte NOTIFY limit, else only
-- "EPOCH-SEQ topic": the listener then reads the payload from livepush_messages.
CREATE FUNCTION livepush_notification(p_epoch bigint, p_seq bigint, p_topic text, p_data text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN octet_length(p_data) + octet_length(p_topic) < 7800
                THEN p_epoch::text || '-' || p_seq::text || ' ' || p_topic || E'\n' || p_data
                ELSE p_epoch::text || '-' || p_seq::text || ' ' || p_topic END
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
