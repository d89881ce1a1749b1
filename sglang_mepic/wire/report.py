"""A request's MEPIC figures, as one typed report from the scheduler to the client.

The scheduler fills it once, when the request is admitted (cache/report.py), and
sends it with the request's output as one piece of SGLang's request-level
customized info (`KEY`; cache/output_report.py). The tokenizer side turns it into
the response's `meta_info["mepic_*"]` figures (frontend/response_report.py), which
the OpenAI routes sum into `metadata["mepic"]` (frontend/openai_report.py). The
names clients read are `PREFIX` + a field name; they are spelled here only.
"""

from dataclasses import dataclass, field, fields
from typing import Any

PREFIX = "mepic_"
KEY = PREFIX + "report"          # the customized-info key the report travels under
CHUNKS = PREFIX + "chunks"       # added by the tokenizer side: the request's chunk spans (response_report.py)
COUNTS = ("recomputed_tokens", "compiled_tokens", "chunk_hits", "chunk_misses")


@dataclass
class Report:
    """What one request's chunk work came to (docs/design.md, Reports)."""
    recomputed_tokens: int | None = None   # computed in context; None for a compile row, which has no client
    compiled_tokens: int = 0               # chunk tokens computed for it by compile rows in its batch
    chunk_hits: int = 0
    chunk_misses: int = 0
    residency: list[str] = field(default_factory=list)  # where each chunk segment was when it was planned
    cached_tokens: int | None = None       # real tokens whose KV was reused: replaces SGLang's cached_tokens

    def to_wire(self) -> dict[str, Any]:
        # Sent with every streamed output of its request, so once a request a decode step: dataclasses.asdict's
        # deep copy took 19 us of the scheduler's time there (64 requests: 1.2 ms a step); the fields are flat.
        wire = {name: getattr(self, name) for name in _FIELDS}
        wire["residency"] = list(self.residency)
        return wire

    @classmethod
    def from_wire(cls, value: object) -> "Report | None":
        """The report a scheduler sent, or None for anything that is not one."""
        if not isinstance(value, dict):
            return None
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in value.items() if k in names})

    def meta_info(self) -> dict[str, Any]:
        """The figures a response's meta_info carries (cached_tokens is SGLang's own field there)."""
        out = {PREFIX + name: getattr(self, name) for name in COUNTS if getattr(self, name) is not None}
        out[PREFIX + "residency"] = list(self.residency)
        return out


def key(name: str) -> str:
    """The meta_info name of a figure."""
    return PREFIX + name


_FIELDS = tuple(f.name for f in fields(Report))
