"""The kombu Transport and Channel on a real redis-server: publish, consume, ack, options,
routing, leases kept by the channel, Redis refusing writes or going away."""
