"""Scheduler side, lowest layer: refcounted pages, their ownership, the chunk store and what eviction frees."""
