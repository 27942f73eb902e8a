"""The job runtime's parts: the runtime loop, the executor, the completer, ctx and maintenance."""
