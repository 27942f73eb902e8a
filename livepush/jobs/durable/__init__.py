"""Durable jobs (docs/durable.md): checkpoints that never run twice, children, signals and durable
sleeps that park a job instead of holding a runtime slot.

- `run.py`: what a running job calls (ctx.checkpoint, run_child, run_children, wait_for_signal,
  sleep): each call finds what an earlier run stored, or stores it, and parks the job when it
  must wait.
- `signals.py`: `jobs.signal()` / `asignal()`.
- `fingerprint.py`: `jobs.input_fingerprint()`.
- `queries.py`: their SQL, and why each statement is safe under concurrency.
"""
