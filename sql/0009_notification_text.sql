-- The NOTIFY payload of a published message as a function that queries inline (issue 5's
-- benchmark: bulk enqueue against pgqueuer).
--
-- A batch enqueue publishes one `enqueued` event on each new job's own topic. Passed to
-- livepush_publish_many() it is aggregated into two arrays, unnested again and grouped by
-- topic to number several messages per topic, which an enqueue never has (each topic is a
-- job created by the statement). The enqueue statement now numbers, logs and notifies its
-- events itself (queries.ENQUEUE_MANY_PUBLISHING, 1,000 jobs: 16.7 -> 14.75 ms on the server),
-- and its NOTIFY text is this function: a single SQL expression, IMMUTABLE, which the
-- planner inlines into the query (no call overhead). livepush_publish() (sql/0001) and
-- livepush_publish_many() (sql/0007) keep their own copies rather than being redefined
-- here: in PL/pgSQL this call, or the same CASE written inline, costs ~1 us more a
-- publish than sql/0001's IF/ELSE (measured: 3.0 and 3.6 against 1.9 us), and a second
-- copy of publish_many only to call it would save nothing. A test holds all three to the
-- same text (test_publish_and_publish_many_ring_alike).
--
-- "EPOCH-SEQ topic\njson" while it fits under Postgres' 8000-byte NOTIFY limit, else only
-- "EPOCH-SEQ topic": the listener then reads the payload from livepush_messages.
CREATE FUNCTION livepush_notification(p_epoch bigint, p_seq bigint, p_topic text, p_data text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN octet_length(p_data) + octet_length(p_topic) < 7800
                THEN p_epoch::text || '-' || p_seq::text || ' ' || p_topic || E'\n' || p_data
                ELSE p_epoch::text || '-' || p_seq::text || ' ' || p_topic END
$$;
