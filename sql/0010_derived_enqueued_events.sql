-- A bulk enqueue's "enqueued" events are derived from the jobs' rows, not stored (issue 5's
-- benchmark: bulk enqueue against pgqueuer).
--
-- A job created by a bulk enqueue in autocommit (queries.ENQUEUE_MANY_PUBLISHING_FRESH) has a
-- new topic, and its "enqueued" event is that topic's first message, EPOCH-1. Everything the
-- event says was fixed when the job was inserted: id, name, queue and max_attempts never
-- change, attempt is 0, progress and error are empty, and its run_at and state follow from
-- the run_at asked for (kept below) and the enqueue's time (the payload's created_at). So
-- the statement no longer writes a history row with the event's JSON: it marks the topic
-- row (`first_derived`), and the history a client resumes from, `livepush_history`, builds
-- that first message from the job's rows when it is read. Building the JSON and logging it
-- was ~3.4 ms of a 1,000-job enqueue's ~11.8, and a page rarely reads it (only one that
-- subscribed to a job before the job existed, or resumes from before its first event).
-- Measured, the statement alone with 1,000 jobs in autocommit on one durable Postgres, 9 x 20
-- calls alternating with the storing one: median 9.66 -> 7.10 ms.
--
-- What holds as before (SPEC §7):
-- - recoverable for LIVEPUSH_HISTORY_TTL: the derived message is "fresh" exactly as a stored
--   one would be, by the enqueue's time (created_at; a stored one had the same now());
-- - never a silent hole: deleting the job deletes its payload and topic row (retention,
--   discard: queries.delete_topics_of_gone()), and the reader resets on a missing seq; a
--   crash empties livepush_topics (unlogged) and the topic's next message starts a new
--   epoch, as for any topic;
-- - the text: the event as livepush_job_event() writes it, which the stored one was (a test
--   holds them equal). run_at is written in the reading session's time zone rather than
--   the enqueuer's: the same instant.

-- Set only by ENQUEUE_MANY_PUBLISHING_FRESH, on `job:<id>` topics it creates: seq 1 is the
-- job's derived "enqueued" event. A later publish on the topic numbers after it (last_seq)
-- and keeps the mark. A constant default: no table rewrite.
ALTER TABLE livepush_topics ADD COLUMN first_derived boolean NOT NULL DEFAULT false;

-- The run_at a batch enqueue asked for (`at=` / `wait=`), NULL for "now" (and for a lone
-- enqueue, which stores its event). The job's own run_at is rewritten by retries and
-- releases; the derived event needs the first one.
ALTER TABLE livepush_job_payloads ADD COLUMN requested_run_at timestamptz;

-- The log a client resumes from (fanout.postgres.HISTORY): stored messages, and each marked
-- job topic's derived first message. Read by topic, the second branch is one lookup of the
-- topic row by its key, and only a marked row (a `job:<digits>` topic) reaches the cast.
CREATE VIEW livepush_history AS
SELECT topic, seq, data, created_at FROM livepush_messages
UNION ALL
SELECT t.topic, 1::bigint,
       livepush_job_event('enqueued', j.id, j.name, j.queue,
                          CASE WHEN p.requested_run_at > p.created_at THEN 'scheduled' ELSE 'available' END,
                          0, j.max_attempts, NULL, NULL, coalesce(p.requested_run_at, p.created_at)),
       p.created_at
FROM livepush_topics t
JOIN livepush_job_payloads p ON p.id = substr(t.topic, 5)::bigint
JOIN livepush_jobs j ON j.id = p.id
WHERE t.first_derived;
