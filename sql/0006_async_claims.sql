-- Claims commit asynchronously (issue 5; see CLAIM in livepush/jobs/queries.py).
--
-- Waiting for the WAL flush was most of a claim's time under load (the statement itself
-- runs in ~0.16 ms; the runtime waited ~0.9 ms), and the claim sits on the serial path
-- between a slot freeing and the next job starting. A claim is safe to lose: a Postgres
-- crash (or a failover) that forgets it leaves the job available, so it runs again, which
-- at-least-once allows. Every other write stays synchronous: an enqueue, an outcome, a
-- release. (An outcome's synchronous commit also makes every earlier claim durable, the
-- WAL being one sequence.)
--
-- What must not happen is a forgotten claim's worker matching a later claim of the same
-- job. A lease taken from a sequence could: a crash can rewind a sequence past values
-- handed out in unflushed transactions. A lease is therefore 62 random bits, fresh per
-- claim, so a stale worker's outcome matches a later claim with probability 2^-62.
CREATE FUNCTION livepush_job_lease() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT (floor(random() * 2147483648)::bigint << 31) | floor(random() * 2147483648)::bigint
$$;

DROP SEQUENCE livepush_job_lease_seq;
