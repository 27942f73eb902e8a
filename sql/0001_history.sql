-- Message history and per-topic offsets for the Postgres fan-out (SPEC §5, §7).

-- One row per topic ever published. publish() takes this row's lock with an UPSERT and
-- holds it until its transaction ends, so two transactions publishing on one topic get
-- their offsets in commit order: the second waits for the first to commit or roll back.
-- That makes "seq > since" a gap-free cursor (a rolled-back publish gives its number back).
CREATE TABLE livepush_topics (
    topic    text PRIMARY KEY,
    last_seq bigint NOT NULL
);

-- The log a client resumes from. data is the JSON text exactly as published, so the
-- server sends it without parsing it again. Rows are deleted past LIVEPUSH_HISTORY_TTL.
CREATE TABLE livepush_messages (
    topic      text NOT NULL,
    seq        bigint NOT NULL,
    data       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, seq)
);
CREATE INDEX livepush_messages_created_at ON livepush_messages (created_at);

-- Publishes one message: assigns its offset, logs it and rings the listeners, all in the
-- caller's transaction, so it is delivered if and only if that transaction commits.
-- NOTIFY carries "seq topic\njson" while it fits under Postgres' 8000-byte limit, else only
-- "seq topic": the listener then reads the payload from livepush_messages.
CREATE FUNCTION livepush_publish(p_topic text, p_data text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_seq bigint;
BEGIN
    -- Safe under concurrency: the row lock taken here orders publishers of one topic.
    INSERT INTO livepush_topics AS t (topic, last_seq) VALUES (p_topic, 1)
    ON CONFLICT (topic) DO UPDATE SET last_seq = t.last_seq + 1
    RETURNING t.last_seq INTO v_seq;
    INSERT INTO livepush_messages (topic, seq, data) VALUES (p_topic, v_seq, p_data);
    IF octet_length(p_data) + octet_length(p_topic) < 7800 THEN
        PERFORM pg_notify('livepush', v_seq::text || ' ' || p_topic || E'\n' || p_data);
    ELSE
        PERFORM pg_notify('livepush', v_seq::text || ' ' || p_topic);
    END IF;
    RETURN v_seq;
END;
$$;
