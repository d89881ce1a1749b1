"""Scheduler side: chunk KV below the device pool (host memory, shared storage) and what keys it."""
