-- The Postgres fan-out's message log: per-topic offsets, recent messages, and the `livepush`
-- notification channel. livepush/fanout/postgres.py owns all of it (these tables, the channel,
-- its doorbell text and the EPOCH-SEQ offset format); nothing else reads or writes them.
--
-- Both tables are UNLOGGED. History is a recovery window of LIVEPUSH_HISTORY_TTL seconds, not
-- a record: writing it to the WAL would make every publish wait for a WAL flush while holding
-- the instance-wide lock Postgres takes to commit a NOTIFY, which serializes all publishers
-- behind the disk. The price: after a Postgres crash or a failover both tables are empty.
-- Offsets carry the topic row's epoch, so a topic recreated after a crash starts a new epoch
-- and a client resuming from the old one gets `reset`, never a silent hole. A clean restart
-- keeps unlogged tables.

-- One row per topic. livepush_publish() takes this row's lock with an upsert and holds it until
-- its transaction ends, so two transactions publishing on one topic get their offsets in
-- commit order: the second waits for the first to commit or roll back. That makes
-- "seq > since" a gap-free cursor (a rolled-back publish gives its number back).
CREATE UNLOGGED TABLE livepush_topics (
    topic      text PRIMARY KEY,
    -- Microseconds since 1970 when the row was created: a larger value after any crash.
    epoch      bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
    last_seq   bigint NOT NULL,
    -- The start of the last publish's transaction, or when a server whose pages watch the topic
    -- last kept it (keep_chains in livepush/fanout/postgres.py). A row idle for a day goes (the
    -- fan-out's IDLE_EXPIRE: see prune there), so topics that are never published again do not
    -- pile up; not indexed, so a publish's update of this row stays a HOT update.
    touched_at timestamptz NOT NULL DEFAULT now()
);

-- The log's own epoch, one row: UNLOGGED like the log, so it is gone exactly when the log is
-- emptied (a crash or a failover) and the next reader starts a new one. A topic nothing was
-- published on has no row above, so its offset is "0-ORIGIN", ORIGIN being this epoch moved on
-- by whole steps of half the idle time (livepush/fanout/postgres.py): resumed while this row is
-- unchanged and within the idle time, nothing the topic had can have been lost, and it replays
-- from the topic's first message; resumed after a crash, it gets `reset`, as an offset of a
-- topic's old epoch does, and so does one older than the idle time, whose topic may have been
-- published and forgotten since.
-- Epoch 0, not this one, leads it: a topic's first message may take its epoch from the clock
-- before this row is made and commit after, and its offsets must still come after its origin.
CREATE UNLOGGED TABLE livepush_log (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    epoch    bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
);

-- The log's epoch, made by the first reader after the migration or a crash. Safe under
-- concurrency: readers that find no row insert with ON CONFLICT, which makes the later ones wait
-- for the first and keep its row; RETURNING or the re-read gives every one of them that row.
CREATE FUNCTION livepush_log_epoch() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
BEGIN
    SELECT epoch INTO v_epoch FROM livepush_log;
    IF v_epoch IS NULL THEN
        INSERT INTO livepush_log DEFAULT VALUES ON CONFLICT DO NOTHING RETURNING epoch INTO v_epoch;
        IF v_epoch IS NULL THEN
            SELECT epoch INTO v_epoch FROM livepush_log;
        END IF;
    END IF;
    RETURN v_epoch;
END;
$$;

-- The log a client resumes from. data is the JSON text exactly as published, so the server
-- sends it without parsing it again. Rows are deleted past LIVEPUSH_HISTORY_TTL.
CREATE UNLOGGED TABLE livepush_messages (
    topic      text NOT NULL,
    seq        bigint NOT NULL,
    data       text NOT NULL,
    -- When publish() wrote it, not its transaction's start (now()): the TTL counts from the
    -- publish, however long the transaction ran before it.
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (topic, seq)
);
CREATE INDEX livepush_messages_created_at ON livepush_messages (created_at);

-- Publishes one message and returns its offset, "EPOCH-SEQ": assigns the offset, logs the
-- message and rings the listeners, all in the caller's transaction, so it is delivered if and
-- only if that transaction commits.
--
-- The notification is a doorbell: "EPOCH-SEQ TOPIC", naming what changed and carrying no data.
-- Postgres has no privileges on LISTEN and NOTIFY (any role that can connect may listen and
-- send on any channel), so a server reads what it delivers from livepush_messages, which needs
-- privileges, and a notification that does not check out against it is dropped.
CREATE FUNCTION livepush_publish(p_topic text, p_data text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
    v_seq bigint;
    v_offset text;
BEGIN
    -- Safe under concurrency: the row lock taken here orders the publishers of one topic.
    INSERT INTO livepush_topics AS t (topic, last_seq) VALUES (p_topic, 1)
    ON CONFLICT (topic) DO UPDATE SET last_seq = t.last_seq + 1, touched_at = now()
    RETURNING t.epoch, t.last_seq INTO v_epoch, v_seq;
    INSERT INTO livepush_messages (topic, seq, data) VALUES (p_topic, v_seq, p_data);
    v_offset := v_epoch::text || '-' || v_seq::text;
    PERFORM pg_notify('livepush', v_offset || ' ' || p_topic);
    RETURN v_offset;
END;
$$;

-- Publishes a batch, `[[topic, data], ...]` (each data a JSON string holding the message's JSON
-- text, which ->> gives back exactly), and returns the offsets in batch order: what livepush_publish() does for each
-- message, in one statement, in the caller's transaction. A topic's messages take its next
-- offsets in batch order.
-- Safe under concurrency: the topics' rows are locked in one order (their bytes, as the caller
-- orders a batch it splits across statements), so two batches sharing topics wait for each
-- other rather than deadlock, and each holds its locks until its transaction ends, as a single
-- publish does.
-- The doorbells go as notifications of up to 100 lines (what a receiver reads of one), in batch
-- order, and under Postgres' 8,000-byte payload limit: the lines (240 bytes at most each) are
-- grouped by the 7,000-byte stretch of the batch's doorbell text they end in.
CREATE FUNCTION livepush_publish_many(p_batch json) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_offsets text[];
BEGIN
    WITH items AS MATERIALIZED (
        SELECT e.ord, e.item ->> 0 AS topic, e.item ->> 1 AS data
        FROM json_array_elements(p_batch) WITH ORDINALITY AS e(item, ord)
    ), counts AS MATERIALIZED (
        SELECT i.topic, count(*) AS n FROM items i GROUP BY i.topic
    ), bumped AS (
        INSERT INTO livepush_topics AS t (topic, last_seq)
        SELECT c.topic, c.n FROM counts c ORDER BY c.topic COLLATE "C"
        ON CONFLICT (topic) DO UPDATE SET last_seq = t.last_seq + excluded.last_seq, touched_at = now()
        RETURNING t.topic, t.epoch, t.last_seq
    ), numbered AS MATERIALIZED (
        SELECT i.ord, i.topic, i.data, b.epoch,
               b.last_seq - c.n + row_number() OVER (PARTITION BY i.topic ORDER BY i.ord) AS seq
        FROM items i JOIN bumped b ON b.topic = i.topic JOIN counts c ON c.topic = i.topic
    ), logged AS (
        INSERT INTO livepush_messages (topic, seq, data) SELECT n.topic, n.seq, n.data FROM numbered n
    ), lines AS (
        SELECT l.ord, l.line,
               sum(octet_length(l.line) + 1) OVER (ORDER BY l.ord) / 7000 AS by_bytes,
               (row_number() OVER (ORDER BY l.ord) - 1) / 100 AS by_count
        FROM (SELECT n.ord, n.epoch::text || '-' || n.seq::text || ' ' || n.topic AS line FROM numbered n) l
    ), rung AS (
        SELECT count(pg_notify('livepush', x.payload)) AS n
        FROM (SELECT string_agg(l.line, E'\n' ORDER BY l.ord) AS payload FROM lines l
              GROUP BY l.by_bytes, l.by_count ORDER BY min(l.ord)) x
    )
    SELECT array_agg(n.epoch::text || '-' || n.seq::text ORDER BY n.ord) INTO v_offsets
    FROM numbered n CROSS JOIN rung;
    RETURN v_offsets;
END;
$$;
