"""MEPIC (memory-efficient position-independent KV caching) as an SGLang extension."""

__version__ = "0.1.0"

# The SGLang release every hook and backend in this package was written against.
SGLANG_VERSION = "0.5.23"
