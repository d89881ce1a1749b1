"""Benchmarks and evaluations of sglang-mepic (run from the repository root: `python -m eval.run`)."""
