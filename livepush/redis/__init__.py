"""How livepush talks to Redis: client settings, URL redaction, the key prefix, and one shared
SUBSCRIBE connection per process."""
