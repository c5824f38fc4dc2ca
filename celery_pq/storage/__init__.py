"""What every layer shares: the constants, errors and checks, ids, Redis key names and stored
records, the message codec, and the connections to Redis (docs/architecture.md, docs/storage.md)."""
