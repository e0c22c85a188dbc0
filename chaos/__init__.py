"""Chaos harness: real clusters, injected faults, an invariant checker."""
