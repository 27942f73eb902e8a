"""Periodic jobs (docs/jobs.md, "Periodic jobs"): `cron.py` (a checked cron schedule in a zone),
`decorator.py` (`@jobs.periodic` and the process-wide `SCHEDULES`), `scheduler.py` (what a runtime
runs each round), `forget.py` (`jobs.forget_periodic`), `queries.py` (the SQL, on
sql/0009_periodic.sql)."""
