"""Every SQL statement of the Django integration, named. Both are plain reads of the database a
connection is on: nothing here claims, finishes or counts.

Which database a connection is on is its server's start time and the database's name: two
clusters were not started in the same microsecond, and two databases of one cluster differ in
name. Both are readable by any role, so the check never fails for want of a privilege (a failed
statement would abort the caller's transaction it runs in). The start time is read as text of its
epoch: Django's connection loads a timestamptz its own way (naive, with USE_TZ = False), and the
jobs' pool would not, so two datetimes of one server could compare unequal.
"""

from __future__ import annotations

# name: joinable -- run in the caller's Django transaction before the first enqueue written there:
# whether that database holds livepush's tables, and which database it is.
JOINABLE = ("SELECT to_regclass('livepush_jobs') IS NOT NULL,"
            " extract(epoch FROM pg_postmaster_start_time())::text, current_database()")

# name: identity -- which database the jobs' own pool is on, read as JOINABLE reads Django's.
IDENTITY = "SELECT extract(epoch FROM pg_postmaster_start_time())::text, current_database()"
