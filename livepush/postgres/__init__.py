"""How livepush talks to Postgres: connections, pools, error translation."""
