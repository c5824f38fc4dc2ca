"""Pure-Python units: no Redis, no network."""
