-- Which periodic jobs each job runtime schedules (livepush/jobs/ owns the runtimes' table: its
-- statements are in livepush/jobs/queries.py; docs/jobs.md "Periodic jobs").
--
-- Written as a runtime registers: the names of the periodic jobs it has registered on the queues
-- it serves. `jobs.forget_periodic(name)` refuses a name that a live runtime lists here. A runtime
-- of code older than this column lists none ('{}'): forgetting a name such a runtime still
-- schedules is harmless, as it starts that job again from its next tick
-- (livepush/jobs/periodic/queries.py, FORGET).
ALTER TABLE livepush_job_runtimes ADD COLUMN periodic text[] NOT NULL DEFAULT '{}';
