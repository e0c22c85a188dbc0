"""The scheduler node: HTTP API, schedule store, leases, bucket poller, Kafka publisher."""
