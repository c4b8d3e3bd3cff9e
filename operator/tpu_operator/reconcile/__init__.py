"""Reconcilers: observe (watch caches), decide (pure functions), act (API requests)."""
