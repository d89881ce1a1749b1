"""Reports generated from committed results or data: the headline tables, comparisons, the calibration set."""
