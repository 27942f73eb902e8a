"""The WebSocket server: hub (ordering), connections (frames), app (wiring), run (lifecycle)."""
