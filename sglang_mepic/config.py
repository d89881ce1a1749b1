"""MEPIC settings shared by every SGLang process.

The launcher turns `--mepic-*` flags into these environment variables, so the
scheduler and tokenizer processes SGLang spawns read the same values.
"""

import os

from sglang_mepic.segments import Placement

PLACEMENT_ENV = "SGLANG_MEPIC_PLACEMENT"
DEFAULT_PLACEMENT = Placement.TRAILING


def placement() -> Placement:
    value = os.environ.get(PLACEMENT_ENV, DEFAULT_PLACEMENT.value)
    try:
        return Placement(value)
    except ValueError:
        raise ValueError(f"{PLACEMENT_ENV}={value!r}: choose from {[p.value for p in Placement]}") from None
