"""Benchmarks and evaluations of sglang-mepic, run from the repository root (`python -m eval.experiments.run`).

In folders by kind: lib/ the small library the commands share (workloads, scoring, served instances,
provenance, checkpoints); bench/ micro-benchmarks (`python -m eval.bench.cache`); experiments/ the end-to-end
experiments (`python -m eval.experiments.capacity`); reports/ what is generated from committed results or data
(`python -m eval.reports.headline`). gpu/ holds the harness for a GPU machine, results/ the committed results.
"""
