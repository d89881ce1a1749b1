"""Micro-benchmarks: one component (attention, cache, pool, prefetch, a forward, a lookup) timed or modelled alone."""
