"""Scheduler side, model runner: the mepic attention backend, its torch reference, positions and RoPE."""
