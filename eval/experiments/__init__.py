"""End-to-end experiments: workloads sent to served instances, one command each (`python -m eval.experiments.run`)."""
