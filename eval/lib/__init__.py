"""The small library the eval commands share: workloads, scoring, served instances, provenance, checkpoints."""
