"""Processes this package starts and always stops: an sglang-mepic server, Mooncake's master, on loopback."""
