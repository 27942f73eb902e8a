"""What a user calls: job functions, enqueue, operator calls, handles and test helpers."""
