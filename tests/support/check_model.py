"""Helpers and fixtures shared by test modules (which never import one another), moved out of
tests/gate/test_check_model.py."""

import os
import subprocess
import sys


def check_model(*args: str, env: dict | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_mepic.check_model", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
