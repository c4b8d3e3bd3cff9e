"""The operator's runtime: API access, work queues, event posting, watch caches."""
