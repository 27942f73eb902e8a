"""Helpers shared by livepush's tests: waiting with a bound, child processes, and the private
PostgreSQL and Redis that `bin/test` starts (stop, restart, terminate backends).

Import them as `from tests.support.waiting import wait_for` (tests/conftest.py puts the
repository root on sys.path, so this works from any test folder).
"""
