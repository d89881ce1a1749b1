"""Triton kernels for the MEPIC attention backend (installed as sglang_mepic.kernels)."""
