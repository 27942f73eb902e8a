"""A small FastAPI app with livepush: sign in, start a report job, watch its progress live."""
