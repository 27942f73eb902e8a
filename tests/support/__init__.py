"""Helpers shared by livepush's tests: waiting with a bound (`waiting`), child processes
(`procs`), the private PostgreSQL and Redis that `bin/test` starts (`services`: stop, restart,
terminate backends, refuse connections), receiving from a fan-out as the hub does (`fanouts`:
doorbells resolved through history, history read page by page), a WebSocket test client
(`wsclient`) and the handshake helpers of the security tests (`security`).

Import them as `from tests.support.waiting import wait_for` (tests/conftest.py puts the
repository root on sys.path, so this works from any test folder).
"""
