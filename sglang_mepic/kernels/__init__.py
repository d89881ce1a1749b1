"""Triton kernels for the MEPIC attention backend."""
