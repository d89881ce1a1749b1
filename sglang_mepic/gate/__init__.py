"""Launcher side: the per-model accuracy gate (calibration, agreement, verdicts and their cache)."""
