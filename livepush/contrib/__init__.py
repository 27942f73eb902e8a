"""Framework integrations. Each lives in its own subpackage and imports its framework only when
that subpackage is imported, so livepush itself never needs one installed."""
